"""A token budget's plan holds end to end (issue 19: "exit 0 means the plan holds"): the probe paces
every check by the plan's token model (scanner/probe/token_pace.py), so checks not about the
budget never meet it, and the cases at a cap's value (a request of the whole budget) are sent
when the budget has room for them.

CI: a budget on one route (``POST /v1/completions``, tokens_per_minute 60000), probed through
NGINX 1.31 with the token-budget and limits checks and two keys per role (about 15 s): exit 0, no
finding, the budget, its settlement and the envelope cap at the budget proven. Slow: the same
config with the envelope caps raised x10 (the mutation operator envelope-cap-raised) exits 1;
``verify`` with default flags on the whole inference audience under 60000 tokens a minute, NGINX
1.31 and Envoy 1.40 (a few minutes each)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scanner.cli.main import main
from scanner.policy.load import loads
from scanner.policy.model import Policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
DEFAULT = Path(__file__).parents[2] / "policies" / "vllm-default.yaml"
ROUTE = "  - {path: /v1/completions, methods: [POST], audience: inference}\n"
CHECKS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=None, checks=("token-budget", "limits"))
ZONE = "token-budget inference:key:60000t/m/15000"


def one_route() -> Policy:
    text = DEFAULT.read_text()
    assert ROUTE in text
    return loads(text.replace(ROUTE, "  - {path: /v1/completions, methods: [POST], audience: inference,\n"
                                     "     limits: {tokens_per_minute: 60000}}\n"))


def audience_policy_text() -> str:
    return DEFAULT.read_text().replace("      max_request_tokens: 1114112     # 1 MiB of input + 16 sequences of 4096\n",
                                       "      max_request_tokens: 1114112     # 1 MiB of input + 16 sequences of 4096\n"
                                       "      tokens_per_minute: 60000\n", 1)


def static_nginx() -> object:
    p = proxy_named("nginx")
    if getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    return p


def coverage(result: ProbeResult, check: str) -> dict[str, tuple[str, str]]:
    return {c.subject: (c.status, c.why) for c in result.coverage if c.check == check}


def test_a_budget_and_the_caps_at_its_value_hold_with_no_finding(tmp_path: Path) -> None:
    p = static_nginx()
    t0 = time.monotonic()
    result = probe_through(tmp_path, p, one_route(), CATALOG, CHECKS, keys_per_role=2, paced=True)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert not result.unreachable, result.reason
    assert not result.findings, [(f.rule, f.title, f.detail[:300]) for f in result.findings]
    assert result.exit_code() == 0
    tokens = coverage(result, "token-budget")
    assert {k: v[0] for k, v in tokens.items()} == {ZONE: "proved", f"{ZONE} settled": "proved",
                                                    f"{ZONE} other principal": "proved"}, tokens
    limits = coverage(result, "limits")
    assert limits["envelope-tokens POST /v1/completions"][0] == "proved", limits
    # the case at the cap's value is a request of the whole bucket (the default: 60000 / 4),
    # admitted; one token more: 400
    at = [a for a in result.attempts if "= max_request_tokens 15000" in a.note]
    over = [a for a in result.attempts if "> max_request_tokens 15000" in a.note]
    assert at and all(a.outcome == "reached" for a in at), at
    assert over and all(a.status == 400 and a.reason.startswith("envelope-tokens") for a in over), over
    # nothing but the budget's own check met the budget
    assert not [a for a in result.attempts if a.reason == "token-budget" and a.check != "token-budget"]
    print(f"nginx one-route token budget: {took:.1f}s, {len(result.attempts)} attempts")


@pytest.mark.slow
def test_the_envelope_caps_raised_are_caught(tmp_path: Path) -> None:
    p = static_nginx()
    result = probe_through(tmp_path, p, one_route(), CATALOG, CHECKS, mutant="envelope-cap-raised",  # type: ignore[arg-type]
                           keys_per_role=2, paced=True)
    assert result.exit_code() == 1
    assert any(f.rule == "VP005" and f.check == "limits" for f in result.findings), \
        [(f.rule, f.check, f.title) for f in result.findings]


@pytest.mark.slow
@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_verify_with_default_flags_is_green_under_a_token_budget(tmp_path: Path, proxy: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    if proxy == "nginx":
        static_nginx()
    policy = tmp_path / "tokens.yaml"
    policy.write_text(audience_policy_text())
    report = tmp_path / "report.json"
    with pytest.raises(SystemExit) as done:
        main(["verify", "--inventory", CATALOG, "--policy", str(policy), "--proxy", proxy, "--format", "json",
              "-o", str(report), "-q"])
    import json

    doc = json.loads(report.read_text())
    assert done.value.code == 0, [(f["rule"], f["title"]) for f in doc["findings"]]
    tokens = {c["subject"]: c["status"] for c in doc["coverage"] if c["check"] == "token-budget"}
    assert tokens and set(tokens.values()) == {"proved"}, tokens
