"""The ownership check (scanner/probe/checks/ownership.py) through the real proxies in front of the
stand-in: with responses: owned every case is proven (0 findings); the policy's proxy weakened by
``ownership-unchecked`` (the seal no longer checked on the way in) or ``ownership-unbound`` (the MAC
not bound to the principal) is caught: VP020, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.policy.load import loads
from scanner.probe.interface import ProbeOptions
from tests.generate.test_ownership import owned_policy_text
from tests.probe.realproxy import probe_through, proxy_named

REPO = Path(__file__).resolve().parents[2]
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=120, checks=("ownership",))


def _policy():  # type: ignore[no-untyped-def]
    return loads(owned_policy_text(), source="p.yaml", base_dir=REPO / "policies")


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_the_ownership_check_proves_every_case(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), _policy(), "vllm-0.29.0-everything", OPTIONS)
    owned = [c for c in res.coverage if c.check == "ownership"]
    assert {c.subject for c in owned if c.status == "proved"} >= {
        "sealed answers POST /v1/responses", "ownership POST /v1/responses",
        "ownership GET /v1/responses/{response_id}", "ownership POST /v1/responses/{response_id}/cancel"}, owned
    assert res.exit_code() == 0 and not res.deviations, res.findings
    sent = [a for a in res.attempts if a.check == "ownership"]
    assert len(sent) >= 20 and all(a.verdict == "proved" for a in sent)


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
@pytest.mark.parametrize("mutant", ["ownership-unchecked", "ownership-unbound"])
def test_a_weakened_ownership_is_caught(tmp_path: Path, name: str, mutant: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), _policy(), "vllm-0.29.0-everything", OPTIONS,
                        mutant=mutant)
    rules = {f.rule for f in res.findings}
    assert res.exit_code() == 1 and "VP020" in rules, res.findings
    high = [f for f in res.findings if f.rule == "VP020"]
    assert all(f.severity == "high" for f in high)
