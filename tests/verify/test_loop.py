"""``verify`` on one proxy (scanner.verify.loop): the closed loop on the stand-in through the CLI,
and the loopback vantages."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from scanner.cli.main import cli
from scanner.plan.inputs import load_policy
from scanner.verify import loop


def test_verify_cli_json_report_and_exit_0(tmp_path: Path) -> None:
    out = tmp_path / "verify.json"
    res = CliRunner().invoke(cli, ["verify", "--inventory", "vllm-0.29.0-default", "--proxy", "nginx",
                                   "--format", "json", "-o", str(out), "-q"], standalone_mode=False)
    assert res.exception is None, res.output
    assert res.return_value == 0
    doc = json.loads(out.read_text())
    assert doc["findings"] == [] and doc["coverage"]
    statuses = {c["status"] for c in doc["coverage"]}
    assert statuses <= {"proved", "not-applicable"} and "proved" in statuses
    assert doc["summary"]["coverage"]["concurrency"]["proved"] >= 1   # the witness held requests open
    witness_params = out.read_text().replace("vp_probe", "").replace("vp_hold", "").replace("vp_answer", "")
    assert "vp_" not in witness_params   # no key value (keys start vp_; the witness parameters do too)


def test_verify_cli_several_proxies_need_an_output_file_for_machine_formats() -> None:
    res = CliRunner().invoke(cli, ["verify", "--inventory", "vllm-0.29.0-default", "--proxy", "nginx",
                                   "--proxy", "envoy", "--format", "json"], standalone_mode=False)
    assert res.exception is not None and "needs -o FILE" in str(res.exception)


def test_loopback_vantages_one_per_network_and_one_outside() -> None:
    nets, vantages = loop.loopback(load_policy(None))
    assert set(nets) == {"public", "monitoring", "admin"}
    # monitoring (auth: none, rate-limited per address) has two addresses: buckets of their own
    assert [v.name for v in vantages] == ["admin", "monitoring", "monitoring-2", "public", "outside"]
    assert all(c.endswith("/32") for n in nets.values() for c in n) and len(nets["monitoring"]) == 2
    assert len({v.address for v in vantages}) == 5
