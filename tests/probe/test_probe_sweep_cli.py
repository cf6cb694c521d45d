"""Known-route sweep from catalogs, and the CLI's usage errors (exit 2) without a target."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from scanner.errors import UsageError
from scanner.inventory.model import Inventory, Route, Source
from scanner.probe.interface import ProbeOptions, Vantage
from scanner.probe.runner import catalog_paths, probe
from tests.probe import helpers as h


def _catalog(tmp: Path) -> Path:
    inv = Inventory(source=Source("vllm", "catalog"), routes=(
        Route("/server_info", ("GET",)), Route("/start_profile", ("POST",)),
        Route("/v1/models", ("GET",), guarded=True), Route("/metrics", ("*",), kind="mount")))
    d = tmp / "catalog"
    d.mkdir()
    (d / "x.json").write_text(inv.to_json())
    (d / "broken.json").write_text("{not json")
    return d


def test_catalog_paths_tolerate_absence_and_bad_files(tmp_path: Path) -> None:
    assert catalog_paths(str(tmp_path / "missing")) == ()
    paths = dict(catalog_paths(str(_catalog(tmp_path))))
    assert paths == {"/server_info": ("GET",), "/start_profile": ("POST",), "/v1/models": ("GET",)}


def test_sweep_reports_unexpected_routes_safely(tmp_path: Path) -> None:
    def upstream(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/server_info":
            return httpx.Response(200, json={})
        if r.url.path == "/start_profile":
            return httpx.Response(405 if r.method != "POST" else 200, json={})
        return httpx.Response(404, json={"detail": "Not Found"})

    opts = ProbeOptions(rate=0, checks=("sweep",), catalog_dir=str(_catalog(tmp_path)),
                        transport_factory=lambda v: httpx.MockTransport(upstream))
    r = probe(h.plan(), h.TARGET, h.creds(), [Vantage()], opts)
    found = {(f.rule, f.path) for f in r.findings}
    assert found == {("VP007", "/server_info"), ("VP007", "/start_profile")}
    # the state-changing /start_profile was proved with a wrong method, never POSTed
    assert {a.request_line for a in r.attempts if a.path == "/start_profile"} == {"PATCH /start_profile HTTP/1.1"}
    assert r.exit_code("high") == 1


@pytest.mark.parametrize("args", [
    ["http://127.0.0.1:9", "--key", "user=vp_literal-key-on-the-command-line"],
    ["http://127.0.0.1:9", "--client-key", "k.pem"],
    ["ftp://127.0.0.1:9"],
    ["http://127.0.0.1:9", "--vantage", "a=nope"],
])
def test_cli_usage_errors(args: list[str]) -> None:
    from scanner.cli.probe import command
    from scanner.resources import data_file

    full = [*args, "--inventory", "vllm-0.29.0-default", "--policy",
            str(data_file("policies", "vllm-default.yaml")), "-q"]
    res = CliRunner().invoke(command, full, standalone_mode=False)
    assert isinstance(res.exception, UsageError), res.output
    assert res.exception.exit_code == 2
    assert "vp_literal-key-on-the-command-line" not in str(res.exception)


def test_progress_consumer_and_bad_ca_bundle(tmp_path: Path) -> None:
    import asyncio

    from scanner.cli.probe import _consume
    from scanner.probe.interface import Target
    from scanner.probe.runner import run_probe

    opts = ProbeOptions(rate=0, checks=("matrix",), transport_factory=h.perimeter(h.plan()))
    res = asyncio.run(_consume(run_probe(h.plan(), h.TARGET, h.creds(), [Vantage()], opts), True))
    assert res.attempts and not res.unreachable
    bad = ProbeOptions(rate=0, checks=("matrix",))
    with pytest.raises(UsageError, match="--ca-bundle"):
        asyncio.run(_consume(run_probe(h.plan(), Target("https://127.0.0.1:9", ca_bundle=str(tmp_path / "no.pem")),
                                       h.creds(), [Vantage()], bad), False))
