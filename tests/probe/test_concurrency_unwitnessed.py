"""Concurrency limits proven without a witness (issue 30, item 4): the client holds limit + 1
requests open (their body's last byte sent after the hold, scanner.probe.send._send_dribbled).
NGINX's limit_conn counts a request from its head on and refuses the one over the limit (429
concurrency); Envoy buffers the body before its router's circuit breaker counts, so it cannot be
seen filling up from outside (measured on Envoy 1.40: the held requests open no upstream
connection; not proven, never failed). The bundled policy's own limits, two keys per role, the
real proxies in front of the stand-in, probed with no witness (as a real deployment with default
flags)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.plan.model import Plan
from scanner.probe.checks.load import UNCOUNTED
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("concurrency",))
INFERENCE = r"(limit_conn perimeter_conn_\d+ )16;"   # the inference audience's zone (concurrency 16)


def run(tmp_path: Path, proxy: str, raise_inference: int = 1) -> ProbeResult:
    """The bundled plan for ``proxy`` (the inference zone's limit_conn x ``raise_inference``),
    probed through without a witness; the stand-in answers."""
    p = proxy_named(proxy)
    inventory = load_ref(CATALOG)
    with StandinThread(inventory, "127.0.0.1", 0) as standin:
        s = loop.setup(inventory, load_policy(None), tmp_path, standin.port, keys_per_role=2)

        def written(plan: Plan) -> None:   # again on another port, when the proxy's was taken
            files = p.write(plan, tmp_path / "proxy")
            if raise_inference != 1:
                conf = files / "perimeter-http.conf"
                text = conf.read_text()
                edited = re.sub(INFERENCE, lambda m: f"{m.group(1)}{16 * raise_inference};", text)
                assert edited != text
                conf.write_text(edited)

        written(s.plan)
        return loop.proxy_run(s, p, tmp_path / "proxy", OPTIONS, "", written).result


def coverage(result: ProbeResult) -> dict[str, tuple[str, str]]:
    return {c.subject: (c.status, c.why) for c in result.coverage if c.check == "concurrency"}


@pytest.mark.parametrize("proxy", ["nginx", "nginx-debian"])
def test_nginx_refuses_the_request_over_the_limit_held_by_the_client(tmp_path: Path, proxy: str) -> None:
    result = run(tmp_path, proxy)
    cov = coverage(result)
    assert result.exit_code() == 0 and not result.findings, [(f.title, f.detail) for f in result.findings]
    assert len(cov) >= 3 and all(status == "proved" for status, _why in cov.values()), cov
    held = [a for a in result.attempts if a.check == "concurrency" and "by the client" in a.note]
    # limit + 1 per zone (16, 64, 2): exactly one refused in each
    assert len(held) == 17 + 65 + 3 and sum(a.reason == "concurrency" for a in held) == 3, \
        sorted({(a.status, a.reason) for a in held})


def test_nginx_concurrency_raised_x100_fails_the_probe_without_a_witness(tmp_path: Path) -> None:
    result = run(tmp_path, "nginx", raise_inference=100)
    assert result.exit_code() == 1, coverage(result)
    assert {f.title.split(": ")[0] for f in result.findings if f.rule == "VP005"} == \
        {"concurrency above the plan"}, [(f.title, f.detail) for f in result.findings]


def test_envoy_counts_only_what_it_forwards_not_proven_never_failed(tmp_path: Path) -> None:
    result = run(tmp_path, "envoy")
    cov = coverage(result)
    assert result.exit_code() == 0 and not result.deviations, [(f.title, f.detail) for f in result.findings]
    zones = [k for k in cov if k.startswith("concurrency ") and " via " not in k and not k.endswith(
        ("other principal", "other address"))]
    assert zones and all(cov[k] == ("not-proven", UNCOUNTED) for k in zones), cov


def test_the_plan_operator_concurrency_raised_is_caught_without_a_witness(tmp_path: Path) -> None:
    """concurrency-raised-x10 (scanner/mutate/core.py: one route's limit x10, rendered by the
    generator) on NGINX 1.31, the policy's own rates, no witness: the raised route lets all its
    held requests through while the other zones refuse theirs."""
    result = probe_through(tmp_path, proxy_named("nginx"), load_policy(None), CATALOG, OPTIONS,
                           mutant="concurrency-raised-x10", keys_per_role=2, paced=True, witness=False)
    assert result.exit_code() == 1, coverage(result)
    assert "concurrency above the plan" in {f.title.split(": ")[0] for f in result.findings if f.rule == "VP005"}
