"""The ownership check (scanner/probe/checks/ownership.py) through the real proxies in front of the
stand-in: with responses: owned every case is proven (0 findings); the policy's proxy weakened by
``ownership-unchecked`` (the seal no longer checked on the way in) or ``ownership-unbound`` (the MAC
not bound to the principal) is caught: VP020, exit 1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.policy.load import loads
from scanner.probe.interface import ProbeOptions
from tests.generate.test_ownership import owned_policy_text
from tests.probe.realproxy import but_rates, probe_through, proxy_named

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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_every_check_holds_on_an_owned_plan(tmp_path: Path, name: str) -> None:
    """The other checks' cases on the owned routes name probe-x1 sealed for their sender
    (scanner/probe/owned.py): the whole probe (rates aside) finds nothing. About 60 s each."""
    opts = but_rates(ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=600))
    res = probe_through(tmp_path, proxy_named(name), _policy(), "vllm-0.29.0-everything", opts)
    assert res.exit_code() == 0 and not res.findings, res.findings


def test_without_the_secret_an_owned_id_is_not_sent_and_says_why() -> None:
    from scanner.inventory.catalog import load_ref
    from scanner.plan.build import build
    from scanner.probe import owned
    from scanner.probe.cases import Case
    from scanner.probe.interface import Credential, Target, Vantage
    from scanner.probe.registry import CheckContext

    plan = build(load_ref("vllm-0.29.0-everything"), _policy())
    ctx = CheckContext(plan=plan, target=Target("http://127.0.0.1:1"), credentials=(), vantages=(),
                       options=ProbeOptions())
    cred = Credential(label="role:user", kind="role", role="user")
    path = "/v1/responses/{response_id}"
    allow = Case("access", "GET", path, "GET", "/v1/responses/probe-x1", cred, Vantage(), "allow")
    assert owned.sealed_target(ctx, allow).skip == owned.NO_SECRET
    deny = replace(allow, expected="deny")
    assert owned.sealed_target(ctx, deny) == deny
    ctx = replace(ctx, options=ProbeOptions(owner_secret="s" * 40))
    sealed = owned.sealed_target(ctx, allow).target
    assert sealed.startswith("/v1/responses/probe-x1~") and len(sealed) == len(allow.target) + 23


# --- without --allow-state-changes or a witness (issue 30, item 5) ----------------------------------

@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_ownership_on_cancel_is_proven_with_default_flags(tmp_path: Path, name: str) -> None:
    """Every case naming an id names one vLLM never stored (its cancel and a create continuing from
    it: 404 before acting), so they go by default; only creating a stored response waits."""
    res = probe_through(tmp_path, proxy_named(name), _policy(), "vllm-0.29.0-everything", OPTIONS,
                        witness=False, state_changes=False)
    cov = {c.subject: (c.status, c.why) for c in res.coverage if c.check == "ownership"}
    assert res.exit_code() == 0 and not res.deviations, res.findings
    for subject in ("ownership POST /v1/responses", "ownership GET /v1/responses/{response_id}",
                    "ownership POST /v1/responses/{response_id}/cancel"):
        assert cov[subject][0] == "proved", cov
    assert cov["sealed answers POST /v1/responses"][0] == "not-proven", cov
    cancels = [a for a in res.attempts if a.path.endswith("/cancel") and a.check == "ownership"]
    assert len(cancels) >= 5 and all(a.outcome != "skipped" for a in cancels), cancels


@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_another_principals_cancel_forwarded_fails_with_default_flags(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), _policy(), "vllm-0.29.0-everything", OPTIONS,
                        mutant="ownership-unchecked", witness=False, state_changes=False)
    assert res.exit_code() == 1 and "VP020" in {f.rule for f in res.findings}, res.findings
    assert any(f.path.endswith("/cancel") for f in res.findings if f.rule == "VP020"), \
        [(f.method, f.path) for f in res.findings]
