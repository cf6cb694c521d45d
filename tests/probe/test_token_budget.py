"""Per-principal token budgets (issue 10, item 6): ``limits.tokens_per_minute``, charged at
admission with the request's admitted envelope (sequences x output budget + body bytes) (:meth:`Decision.token_cost`, the
one rule njs and Lua implement and the probe predicts with). On the real proxies: NGINX 1.31 +
njs 0.9 (shared dict) and Envoy 1.40 (Lua + local_ratelimit); Debian's NGINX 1.22 (njs 0.7.9, no
js_shared_dict_zone) is refused by ``generate`` with exit 2, never given a config without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scanner import documents
from scanner.cli.main import main
from scanner.errors import GenerateError, PolicyError
from scanner.generate.common import njs_version
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx import NginxGenerator
from scanner.generate.nginx_model import HTTP
from scanner.inventory.catalog import load_ref
from scanner.plan import body as plan_body
from scanner.plan.inputs import load_policy
from scanner.plan.model import Decision
from scanner.policy.load import loads
from scanner.policy.model import Policy
from scanner.probe.cases import Case
from scanner.probe.checks import tokens
from scanner.probe.checks.tokens import SETTLED_NOTE, TokenBudget, body_of_cost, plan_zone
from scanner.probe.interface import Attempt, Credential, ProbeOptions, ProbeResult, Vantage
from scanner.report.plan import to_table
from scanner.runtime import nginx
from scanner.verify import loop
from tests.probe.realproxy import probe_edited, probe_through, proxy_named, sub

CATALOG = "vllm-0.29.0-default"
DEFAULT = Path(__file__).parents[2] / "policies" / "vllm-default.yaml"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("token-budget",))
# with the rate check too: its bursts and follow-ups must not meet the token budget first
WITH_RATE = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("rate", "token-budget"))


def token_policy_text(tpm: int = 2000, burst: int | None = None) -> str:
    """The bundled policy with a token budget on the inference audience: ``tpm`` a minute, its
    bucket ``burst`` (tokens_burst; None: the default, a quarter of the minute)."""
    text = DEFAULT.read_text()
    return text.replace("      concurrency: 16\n", f"      concurrency: 16\n      tokens_per_minute: {tpm}\n"
                        + (f"      tokens_burst: {burst}\n" if burst else ""), 1)


def token_policy(tpm: int = 2000, burst: int | None = None) -> Policy:
    return loads(token_policy_text(tpm, burst))


# the live probes' budget: 8000 a minute, the default bucket of 2000 (the probe's requests of cost
# 2000 // 12 multipliers = 166 are whole requests the stand-in answers with their usage)
LIVE_TPM = 8000
LIVE_ZONE = "token-budget inference:key:8000t/m/2000"


def decisions(tmp_path: Path, policy: Policy) -> dict[tuple[str, str], Decision]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    plan = loop.setup(load_ref(CATALOG), policy, tmp_path, 9).plan
    return {(d.method, d.path): d for d in plan.decisions}


# --- the policy and the plan ----------------------------------------------------------------------

def test_the_plan_puts_body_routes_of_the_audience_in_one_token_zone(tmp_path: Path) -> None:
    ds = decisions(tmp_path, token_policy())
    chat, comp = ds[("POST", "/v1/chat/completions")], ds[("POST", "/v1/completions")]
    assert chat.token_zone == comp.token_zone == "inference:key:2000t/m/500"    # the default bucket: N / 4
    assert ds[("GET", "/v1/models")].token_zone == ""        # no body: not charged
    doc = next(d for d in chat.to_dict().items() if d[0] == "limits")[1]
    assert doc["tokens_per_minute"] == 2000
    # the default policy has none: the plan's JSON is as before
    plain = decisions(tmp_path / "b", load_policy(None))
    assert all(not d.token_zone and "tokens_per_minute" not in d.to_dict()["limits"] for d in plain.values())


def test_the_plan_and_policy_documents_hold_the_budget(tmp_path: Path) -> None:
    plan = loop.setup(load_ref(CATALOG), token_policy(), tmp_path, 9).plan
    documents.validate("plan", json.loads(plan.to_json()), "plan")
    documents.validate("policy", yaml.safe_load(token_policy_text()), "policy")
    assert "tokens<=2000/min" in to_table(plan)


def test_tokens_per_minute_is_checked(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"tokens_per_minute|>= 1"):
        loads(token_policy_text(0))


def test_the_cost_rule(tmp_path: Path) -> None:
    ds = decisions(tmp_path, token_policy())
    chat, comp = ds[("POST", "/v1/chat/completions")], ds[("POST", "/v1/completions")]
    body = json.dumps({"max_tokens": 100, "prompt": "x" * 40}).encode()
    assert plan_body.token_cost(comp, body) == 100 + len(body)
    # absent (or null): the cap the proxy writes in
    absent = b'{"prompt": "hi", "max_tokens": null}'
    assert plan_body.token_cost(comp, absent) == 4096 + len(absent)
    # the first field present and not null wins; the last copy of a duplicated key counts
    both = b'{"max_completion_tokens": null, "max_tokens": 7, "max_tokens": 9}'
    assert plan_body.token_cost(chat, both) == 9 + len(both)
    assert plan_body.token_cost(chat, b'{"max_completion_tokens": 5, "max_tokens": 900}') == 5 + 47
    # lax numbers as pydantic reads them; anything else 0; never below 1
    assert plan_body.token_cost(comp, b'{"max_tokens": "1_0"}') == 10 + 21
    assert plan_body.token_cost(comp, b'{"max_tokens": true}') == 1 + 20
    assert plan_body.token_cost(comp, b'{"max_tokens": [1]}') == 0 + 19
    assert plan_body.token_cost(comp, b'{"max_tokens": -3}') == 0 + 18
    assert plan_body.token_cost(comp, b"") == 1
    assert plan_body.token_cost(comp, b"not json at all!") == 16             # not a JSON object: bytes only
    # the admitted envelope: a prompt list and n multiply the output budget (scanner/plan/envelope.py)
    listed = b'{"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 10}'
    assert plan_body.token_cost(comp, listed) == 3 * 2 * 10 + len(listed)
    msgs = ds[("POST", "/v1/messages")]   # Anthropic's API: max_tokens (required by vLLM) is its budget
    assert msgs.budget is not None and msgs.budget.fields == ("max_tokens",)
    assert plan_body.token_cost(msgs, b'{"max_tokens": 99, "x": 1}') == 99 + 26
    assert plan_body.token_cost(msgs, b"{}") == 4096 + 2       # absent: the cap the proxy writes in


def test_the_probe_builds_bodies_of_the_cost_it_wants(tmp_path: Path) -> None:
    ds = decisions(tmp_path, token_policy())
    for d in (ds[("POST", "/v1/completions")], ds[("POST", "/v1/messages")], ds[("POST", "/v1/chat/completions")]):
        for cost in (60, 666, 5000):   # the input estimate is every byte: a body of 17 has none
            body = body_of_cost(d, cost, {}, 1 << 20)
            assert body is not None and plan_body.token_cost(d, body) == cost and isinstance(json.loads(body), dict)
    cost, fit, _ = plan_zone(ds[("POST", "/v1/completions")], 1 << 20)
    assert (cost, fit) == (166, 3)          # three fit the bucket of 500
    cost, why, _ = plan_zone(decisions(tmp_path / "b", token_policy(10**8))[("POST", "/v1/completions")], 1 << 20)
    assert cost is None and "requests" in str(why)



def test_a_large_budget_gets_a_cost_every_route_of_its_zone_reaches(tmp_path: Path) -> None:
    """Issue 30, item 2: 10,000,000 a minute on the bundled inference audience (a bucket of
    2,500,000 past max_request_tokens 1,114,112): the cost lets one request per multiplier fit and a
    JSON body under body_bytes (1 MiB) reaches it on every route of every zone."""
    ds = decisions(tmp_path, token_policy(10_000_000))
    zones: dict[str, list[Decision]] = {}
    for d in ds.values():
        if d.token_zone:
            zones.setdefault(d.token_zone, []).append(d)
    assert set(zones) == {"inference:key:10000000t/m/2500000"}
    for ds_ in zones.values():
        for d in ds_:
            limit = d.limits.body_bytes or 1 << 30
            cost, fit, body = plan_zone(d, limit, 12)
            assert isinstance(cost, int) and body is not None, (d.path, fit)
            assert (cost, fit) == (208333, 12) and plan_body.token_cost(d, body) == cost and len(body) <= limit, d.path
            assert cost <= (d.limits.max_request_tokens or cost)


def test_a_cost_no_body_reaches_is_lowered_or_said_why(tmp_path: Path) -> None:
    """body_bytes 8192 on the inference audience: no body reaches 2,500,000 // 12; the cost is the
    most one under body_bytes is charged (16 sequences of 4096 + its bytes), and at 10,000,000 a
    minute that needs more than 40 requests: not proven, saying so (VP011), never a cost no body
    reaches."""
    small = token_policy_text(10_000_000).replace("      body_bytes: 1048576\n", "      body_bytes: 8192\n", 1)
    d = decisions(tmp_path, loads(small))[("POST", "/v1/completions")]
    assert d.limits.body_bytes == 8192
    cost, why, _ = plan_zone(d, 8192, 12)
    assert cost is None and "body_bytes (8192)" in str(why) and "requests" in str(why), why
    most = tokens.reachable(d, 10**6, 8192)
    assert 16 * 4096 < most <= 16 * 4096 + 8192 and body_of_cost(d, most, {}, 8192) is not None
    assert body_of_cost(d, most + 1, {}, 8192) is None
    # a budget of 200,000 a minute (a bucket of 50,000) with it: provable, at a cost a body reaches
    fits = token_policy_text(200_000).replace("      body_bytes: 1048576\n", "      body_bytes: 8192\n", 1)
    d = decisions(tmp_path / "b", loads(fits))[("POST", "/v1/completions")]
    cost, fit, body = plan_zone(d, 8192, 12)
    assert isinstance(cost, int) and body is not None and plan_body.token_cost(d, body) == cost and len(body) <= 8192
    assert (cost, fit) == (50_000 // 12, 12)


# --- the settlement's judge (scanner/probe/checks/tokens.py), on attempts made up ---------------------

def _sent(note: str, at: float, status: int, answer: str = "") -> tuple[Case, Attempt]:
    cred, where = Credential("role:user", "role", "user"), Vantage("public", "127.0.0.12")
    case = Case("token-budget", "POST", "/v1/completions", "POST", "/v1/completions", cred, where, "allow",
                note=note, body=b"{}")
    refused = status == 429
    return case, Attempt("token-budget", "POST", "/v1/completions", "POST /v1/completions HTTP/1.1",
                         cred.label, "", where.name, "allow", status=status, verdict="proved",
                         outcome="limited" if refused else "reached", reason="token-budget" if refused else "",
                         sent_at=at, latency_ms=5, note=note + ("; Retry-After 9" if refused else ""),
                         answer_body=answer)


USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 10}})


@pytest.mark.parametrize(("answer", "kept", "status"), [
    (USAGE, [200, 200, 429, 429], "proved"),          # 6 of cost 600 on 2000: refunds made
    (USAGE, [429, 429, 429, 429], "failed"),          # usage reported, no room given back
    ("", [429, 429, 429, 429], "not-proven"),         # the upstream reports no usage
    (f"data: {USAGE}\n\ndata: [DONE]\n\n", [200, 200, 429, 429], "failed"),   # the asked-for event shown
    ('{"id": "x"}', [429, 429, 429, 429], "not-proven"),
])
def test_the_settlement_is_judged_on_the_usage_the_answers_reported(answer: str, kept: list[int],
                                                                    status: str) -> None:
    sent = [_sent(f"cost 600 {i + 1}/3 (3 fit, {SETTLED_NOTE})", i, 200, answer) for i in range(3)]
    sent += [_sent(f"cost 600 {i + 1}/4 (3 fit, kept)", 10 + i, code) for i, code in enumerate(kept)]
    got, why, _n = TokenBudget._assess_settled(sent, 600, 2000, 2000)
    assert got == status, why
    if answer == "":
        assert "reported no usage" in why
    # the zone itself: tokens counted at their settled charge, then refused
    zone, _why, _n = TokenBudget._assess(sent, 3, 600, 2000, 2000)
    assert zone == ("failed" if answer.startswith("data:") else "proved")   # 5 x 600 reached, none settled


# --- the generators ---------------------------------------------------------------------------------

def test_debian_njs_is_refused_and_a_plan_without_budgets_is_not(tmp_path: Path) -> None:
    """The refusal itself (exit 2, one line) is a case of tests/cli/test_bad_input.py."""
    plain = tmp_path / "plain.yaml"
    plain.write_text(DEFAULT.read_text())
    with pytest.raises(SystemExit) as done:
        main(["generate", "nginx", "--inventory", CATALOG, "--policy", str(plain), "-o", str(tmp_path / "out"),
              "--set", "njs=0.7.9"])
    assert done.value.code == 0


def test_the_debian_module_says_which_njs_it_is(tmp_path: Path) -> None:
    build = nginx.debian_build()
    if build is None:
        pytest.skip("no Debian NGINX")
    assert njs_version(build.njs_module) == "0.7.9"
    plan = loop.setup(load_ref(CATALOG), token_policy(), tmp_path, 9).plan
    with pytest.raises(GenerateError, match=r"needs njs >= 0.8 .*this NGINX has njs 0.7.9"):
        NginxGenerator().render(plan, GenerateOptions(extra={"njs_module": build.njs_module}))


def test_the_nginx_config_with_a_budget_has_no_gixy_findings(tmp_path: Path) -> None:
    from tests.generate.test_gixy import findings, summary

    policy = tmp_path / "tokens.yaml"
    policy.write_text(token_policy_text())
    with pytest.raises(SystemExit) as done:
        main(["generate", "nginx", "--inventory", CATALOG, "--policy", str(policy), "-o", str(tmp_path / "out")])
    assert done.value.code == 0
    assert "js_shared_dict_zone zone=perimeter_tokens" in (tmp_path / "out" / "perimeter-http.conf").read_text()
    assert summary(findings(tmp_path / "out" / "nginx.conf")) == []


def test_verify_on_debian_nginx_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if nginx.debian_build() is None:
        pytest.skip("no Debian NGINX")
    policy = tmp_path / "tokens.yaml"
    policy.write_text(token_policy_text())
    with pytest.raises(SystemExit) as done:
        main(["verify", "--proxy", "nginx-debian", "--inventory", CATALOG, "--policy", str(policy)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert done.value.code == 2 and len(err) == 1, err
    assert "tokens_per_minute needs njs >= 0.8" in err[0] and "njs 0.7.9" in err[0]


# --- on the real proxies ----------------------------------------------------------------------------

def _coverage(result: ProbeResult) -> dict[str, tuple[str, str]]:
    return {c.subject: (c.status, c.why) for c in result.coverage if c.check == "token-budget"}


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_the_budget_refuses_once_spent_and_not_another_principal(tmp_path: Path, proxy: str) -> None:
    p = proxy_named(proxy)
    if proxy == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    result = probe_through(tmp_path, p, token_policy(LIVE_TPM), CATALOG, WITH_RATE, paced=True, keys_per_role=2)
    cov = _coverage(result)
    zone = LIVE_ZONE
    assert cov[zone][0] == "proved", cov
    assert cov[f"{zone} other principal"][0] == "proved", cov
    assert not result.findings, result.findings
    rate = [c for c in result.coverage if c.check == "rate"]
    assert rate and all(c.status == "proved" for c in rate), rate
    # settled from usage: the stand-in reports far less than each request's charge
    assert cov[f"{zone} settled"][0] == "proved", cov
    notes = [a for a in result.attempts if a.subject == zone]
    reached = [a for a in notes if a.outcome == "reached"]
    refused = [a for a in notes if a.reason == "token-budget"]
    settled = [a for a in notes if "settled by its answer's usage" in a.note]
    # budget // cost read their answers' usage, all reached; then more than fit the budget unsettled
    # reached before the kept ones (answered 400 by the witness) met the budget: 429 with Retry-After
    assert settled and all(a.outcome == "reached" for a in settled)
    assert any('"usage"' in a.answer_body for a in settled)
    assert len(reached) > len(settled) and len(refused) >= 3 and all("Retry-After " in a.note for a in refused)
    print(proxy, "200:", len(reached), "429:", len(refused), cov[f"{zone} settled"][1])


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_the_mutant_without_its_budget_is_caught(tmp_path: Path, proxy: str) -> None:
    p = proxy_named(proxy)
    if proxy == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    result = probe_through(tmp_path, p, token_policy(LIVE_TPM), CATALOG, OPTIONS, mutant="token-budget-removed",
                           paced=True)
    assert any(f.rule == "VP005" and "token budget" in f.title for f in result.findings), _coverage(result)


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_the_mutant_whose_answers_settle_nothing_is_caught(tmp_path: Path, proxy: str) -> None:
    p = proxy_named(proxy)
    if proxy == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    result = probe_through(tmp_path, p, token_policy(LIVE_TPM), CATALOG, OPTIONS, mutant="settlement-skipped", paced=True)
    assert any(f.rule == "VP005" and "token budget not settled" in f.title for f in result.findings), \
        _coverage(result)
    assert result.exit_code() == 1


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_the_mutant_whose_bucket_holds_two_minutes_is_caught(tmp_path: Path, proxy: str) -> None:
    """bucket-two-minutes: the zone's bucket twice the plan's capacity, the refill as planned (a
    minute then admits up to 2 C + N): the token-budget check fails the run by its exit code."""
    p = proxy_named(proxy)
    if proxy == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    result = probe_through(tmp_path, p, token_policy(LIVE_TPM), CATALOG, OPTIONS, mutant="bucket-two-minutes",
                           paced=True)
    assert result.exit_code() == 1, _coverage(result)
    assert _coverage(result)[LIVE_ZONE][0] == "failed", _coverage(result)
    assert any(f.rule == "VP005" and "token budget" in f.title for f in result.findings), _coverage(result)


def test_nginx_without_its_body_filter_fails_the_probe_and_with_it_passes(tmp_path: Path) -> None:
    """The hand edit a reviewer might make (the njs body filter dropped: every request keeps its
    admitted envelope): probe exits 1 with default flags; the config as generated exits 0."""
    p = proxy_named("nginx")
    if getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    (tmp_path / "edited").mkdir()
    (tmp_path / "plain").mkdir()
    edited = probe_edited(tmp_path / "edited", p, OPTIONS, sub(HTTP, r"\n *js_body_filter perimeter\.settle[^\n]*", ""),
                          policy=token_policy(LIVE_TPM))
    cov = _coverage(edited)
    assert cov[f"{LIVE_ZONE} settled"][0] == "failed", cov
    assert edited.exit_code() == 1
    plain = probe_edited(tmp_path / "plain", p, OPTIONS, policy=token_policy(LIVE_TPM))
    assert _coverage(plain)[f"{LIVE_ZONE} settled"][0] == "proved", _coverage(plain)
    assert plain.exit_code() == 0, plain.findings


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_an_auth_none_zone_counts_per_client_address(tmp_path: Path, proxy: str) -> None:
    p = proxy_named(proxy)
    if proxy == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    text = DEFAULT.read_text().replace(
        "limits: {body_bytes: 1, rate: {rps: 20, burst: 40}, timeout_s: 10}",
        "limits: {body_bytes: 65536, rate: {rps: 20, burst: 40}, timeout_s: 10, tokens_per_minute: 900}").replace(
        "  - {path: /tokenize, methods: [POST], audience: service}",
        "  - {path: /tokenize, methods: [POST], audience: monitoring}")
    result = probe_through(tmp_path, p, loads(text), CATALOG, OPTIONS, paced=True)
    cov = _coverage(result)
    assert cov["token-budget monitoring:none:900t/m/225"][0] == "proved", cov
    # verify gives the monitoring network two addresses: each has a budget of its own
    assert cov["token-budget monitoring:none:900t/m/225 other address"][0] == "proved", cov
    assert not result.findings, result.findings
