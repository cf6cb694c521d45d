"""Token pacing (scanner/probe/token_pace.py) and the plan's per-request token cap under a budget
(scanner/plan/build.py request_token_cap): what each case costs the budget the plan charges it
to, the model of that budget (the one bucket every enforcer keeps), lighter bodies where the
output budget proves nothing, cases spread over a role's keys, and the schedule that holds
ordinary cases back until their tokens are there. No proxy: the plan and made-up answers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.plan import body as plan_body
from scanner.plan.model import Plan
from scanner.policy.load import loads
from scanner.probe import token_pace as tp
from scanner.probe.cases import Case
from scanner.probe.interface import Attempt, Credential, ProbeOptions, Target, Vantage
from scanner.probe.registry import CheckContext
from scanner.probe.runner import _Schedule
from scanner.report.plan import to_table
from scanner.verify import loop

CATALOG = "vllm-0.29.0-default"
DEFAULT = Path(__file__).parents[2] / "policies" / "vllm-default.yaml"
CHAT = ("POST", "/v1/chat/completions")


def policy_text(tpm: int, request_tokens: str = "1114112", burst: int | None = None) -> str:
    """The bundled policy with a token budget on the inference audience (``burst``: its
    tokens_burst, else the default bucket of a quarter of the minute)."""
    text = DEFAULT.read_text().replace("      max_request_tokens: 1114112", f"      max_request_tokens: {request_tokens}")
    return text.replace("      concurrency: 16\n", f"      concurrency: 16\n      tokens_per_minute: {tpm}\n"
                        + (f"      tokens_burst: {burst}\n" if burst else ""), 1)


def plan_of(tmp_path: Path, text: str, keys: int = 2) -> tuple[loop.Setup, Plan]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    s = loop.setup(load_ref(CATALOG), loads(text), tmp_path, 9, keys_per_role=keys)
    return s, s.plan


# --- the plan: a request over the budget's bucket is refused for its envelope ------------------------

def test_the_budget_caps_the_request_tokens(tmp_path: Path) -> None:
    _s, plan = plan_of(tmp_path, policy_text(60000))
    chat = plan.decision(*CHAT)
    assert chat is not None and chat.token_zone == "inference:key:60000t/m/15000"
    # the default bucket: a quarter of the minute; the policy's cap (over the minute) lowered to it
    assert chat.token_capacity == chat.limits.tokens_burst == 15000
    assert chat.limits.max_request_tokens == 15000 and chat.request_tokens_by_budget
    doc = chat.to_dict()["limits"]
    assert doc["max_request_tokens"] == 15000 and doc["max_request_tokens_by"] == "tokens_burst"
    assert doc["tokens_burst"] == 15000
    table = to_table(plan, width=400)
    assert "request:seq<=16,tokens<=15000(=burst)" in table and "tokens<=60000/min,burst<=15000" in table
    over = json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2, "max_tokens": 4096,
                       "pad": "a" * 7000}).encode()
    assert 15000 < plan_body.envelope(chat, over).tokens < 60000
    assert plan_body.envelope_refusal(chat, over) == "envelope-tokens:over-15000"   # 400, not 429 for ever
    # a route without a body is not charged: its limits are the policy's
    models = plan.decision("GET", "/v1/models")
    assert models is not None and models.limits.max_request_tokens == 1114112 and not models.request_tokens_by_budget


def test_a_lower_cap_and_no_budget_stay_as_the_policy_says(tmp_path: Path) -> None:
    _s, plan = plan_of(tmp_path / "a", policy_text(60000, "50000"))
    chat = plan.decision(*CHAT)
    assert chat is not None and chat.limits.max_request_tokens == 50000 and not chat.request_tokens_by_budget
    assert "max_request_tokens_by" not in chat.to_dict()["limits"]
    assert chat.token_capacity == 50000          # the bucket holds every request the cap admits
    _s, small = plan_of(tmp_path / "c", policy_text(60000, "5000"))
    chat = small.decision(*CHAT)
    assert chat is not None and chat.limits.max_request_tokens == 5000 and chat.token_capacity == 15000
    _s, plain = plan_of(tmp_path / "b", DEFAULT.read_text())
    chat = plain.decision(*CHAT)
    assert chat is not None and chat.limits.max_request_tokens == 1114112 and not chat.request_tokens_by_budget


def test_a_budget_without_a_request_cap_sets_one(tmp_path: Path) -> None:
    text = policy_text(60000).replace("      max_request_tokens: 1114112     # 1 MiB of input + 16 sequences of 4096\n",
                                      "")
    assert "max_request_tokens" not in text.split("fields:")[0].split("inference:")[1]
    _s, plan = plan_of(tmp_path, text)
    chat = plan.decision(*CHAT)
    assert chat is not None and chat.limits.max_request_tokens == 15000 and chat.request_tokens_by_budget
    assert chat.envelope_capped


def test_tokens_burst_sets_the_bucket_and_is_at_most_the_minute(tmp_path: Path) -> None:
    from scanner.errors import PlanError

    _s, plan = plan_of(tmp_path / "a", policy_text(60000, burst=60000))
    chat = plan.decision(*CHAT)
    assert chat is not None and chat.token_capacity == 60000 and chat.limits.max_request_tokens == 60000
    assert chat.token_zone == "inference:key:60000t/m/60000"
    with pytest.raises(PlanError, match="tokens_burst 60001 is more than tokens_per_minute 60000"):
        plan_of(tmp_path / "b", policy_text(60000, burst=60001))


# --- the model of one budget ---------------------------------------------------------------------

def test_the_bucket_refills_at_the_budget_per_minute() -> None:
    m = tp.TokenModel(6000, 1500)
    t = 600.0
    assert m.wait(1500, t) == 0.0               # full at first: the capacity, not the minute
    m.charge(1500, t)
    assert m.bucket(t) == 0.0
    assert m.bucket(t + 10) == pytest.approx(1000 * tp.REFILL_SHARE)   # a share of the refill counted
    assert m.bucket(t + 60) == 1500.0           # never more than the capacity
    assert m.wait(1000, t + 1) == pytest.approx((1000 - 100 * tp.REFILL_SHARE) / m.rate + tp.MARGIN_S)
    assert m.wait(6000, t) == pytest.approx(1500 / m.rate + tp.MARGIN_S)   # more than the bucket: a full one
    m.give_back(1500, t + 1, t)                 # refused: never charged
    assert m.wait(1500, t + 1) == 0.0


def test_a_refusal_the_model_had_room_for_counts_the_budget_spent() -> None:
    m = tp.TokenModel(6000, 6000)
    assert m.wait(100, 600.0) == 0.0
    m.spent(600.0)
    assert m.wait(100, 600.0) > 1 and m.bucket(600.0) == 0.0
    told = tp.TokenModel(6000, 6000)               # the proxy said when: then, and no sooner
    told.spent(600.0, 100, 2.0)
    assert told.wait(100, 600.0) == pytest.approx(2.0 + tp.MARGIN_S)
    assert told.wait(100, 602.5) == 0.0


def test_a_token_bound() -> None:
    assert tp.token_bound("k", 60000, 15000, 15000).seconds == 0.0
    assert tp.token_bound("k", 60000, 15000, 135000).seconds == pytest.approx(120)


# --- cases: their charge, lighter bodies, spread over a role's keys -------------------------------

def ctx_of(s: loop.Setup) -> CheckContext:
    options = loop.probe_options(s, ProbeOptions(rate=0, max_time=None), "http://127.0.0.1:1")
    return CheckContext(plan=s.plan, target=Target("http://127.0.0.1:2"), credentials=tuple(s.credentials),
                        vantages=tuple(s.vantages), options=options)


def PUBLIC(ctx: CheckContext) -> str | None:
    return ctx.source_address(next(v for v in ctx.vantages if v.name == "public"))


def chat_case(ctx: CheckContext, body: bytes, cred: Credential | None = None, expected: str = "allow",
              check: str = "upstream", reasons: tuple[str, ...] = ()) -> Case:
    cred = cred or next(c for c in ctx.credentials if c.label == "role:user")
    vantage = next(v for v in ctx.vantages if v.name == "public")
    return Case(check, *CHAT, *CHAT, cred, vantage, expected, reasons, f"x {CHAT[1]}", body=body,  # type: ignore[arg-type]
                json_body=True)


def test_a_case_is_charged_what_the_plan_says_and_only_when_admitted(tmp_path: Path) -> None:
    s, plan = plan_of(tmp_path, policy_text(60000))
    ctx = ctx_of(s)
    chat = plan.decision(*CHAT)
    assert chat is not None
    body = b'{"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 100}'
    ch = tp.charge_of(plan, chat_case(ctx, body), PUBLIC(ctx))
    assert ch == tp.Charge("inference:key:60000t/m/15000|role:user", plan_body.token_cost(chat, body), 60000, 15000)
    assert ch.cost == 2 * 100 + len(body)
    assert tp.charge_of(plan, chat_case(ctx, body, expected="deny"), PUBLIC(ctx)) == tp.Charge()
    over = json.dumps({"max_tokens": 4096, "n": 4, "pad": "a" * 50000}).encode()
    assert tp.charge_of(plan, chat_case(ctx, over), PUBLIC(ctx)) == tp.Charge()   # refused for its envelope
    models = Case("matrix", "GET", "/v1/models", "GET", "/v1/models", ctx.credentials[0], ctx.vantages[0], "allow")
    assert tp.charge_of(plan, models, PUBLIC(ctx)) == tp.Charge()                 # no body, no budget


def test_a_body_is_made_light_only_where_its_budget_proves_nothing(tmp_path: Path) -> None:
    s, plan = plan_of(tmp_path, policy_text(60000))
    ctx = ctx_of(s)
    chat = plan.decision(*CHAT)
    assert chat is not None
    bare = b'{"messages": [{"role": "user", "content": "hi"}]}'
    light = tp.light(plan, chat_case(ctx, bare))
    assert light.body == b'{"max_completion_tokens": 1,"messages": [{"role": "user", "content": "hi"}]}'
    assert plan_body.token_cost(chat, light.body) == 1 + len(light.body) < plan_body.token_cost(chat, bare) - 4000
    assert "light on its token budget" in light.note
    # a budget the body sets, a case about its body (as_sent), about the budget, a denied case: as they are
    capped = b'{"max_tokens": 4096, "n": 4}'
    assert tp.light(plan, chat_case(ctx, capped)).body == capped
    from dataclasses import replace
    assert tp.light(plan, replace(chat_case(ctx, bare), as_sent=True)).body == bare
    assert tp.light(plan, chat_case(ctx, bare, reasons=("token-budget",))).body == bare
    assert tp.light(plan, chat_case(ctx, bare, expected="deny")).body == bare
    # no token budget on the route: as it is
    _s, plain = plan_of(tmp_path / "plain", DEFAULT.read_text())
    assert tp.light(plain, chat_case(ctx, bare)).body == bare


def test_costly_cases_are_spread_over_the_keys_the_route_admits(tmp_path: Path) -> None:
    s, plan = plan_of(tmp_path, policy_text(60000, burst=60000))
    ctx = ctx_of(s)
    user = next(c for c in ctx.credentials if c.label == "role:user")
    big = json.dumps({"max_tokens": 4096, "n": 4, "pad": "a" * 30000}).encode()      # ~46k tokens each
    cases = [chat_case(ctx, big, user, check="limits") for _ in range(4)]
    cases.append(chat_case(ctx, big, user, check="token-budget", reasons=("token-budget",)))   # stays
    out = tp.balance(plan, cases, ctx.credentials, ctx.source_address)
    labels = [c.credential.label for c in out]
    assert labels[4] == "role:user"
    # each to a key the route admits the same (user and service), the least planned for first
    assert sorted(labels[:4]) == ["role:service", "role:service#2", "role:user", "role:user#2"]
    assert [c.vantage for c in out] == [c.vantage for c in cases]
    operator = [c for c in ctx.credentials if c.role == "operator"]
    assert operator and not {c.label for c in operator} & set(labels)      # not admitted on the route


# --- the schedule: ordinary cases wait for their tokens ----------------------------------------------

def answered(case: Case, status: int, reason: str = "") -> Attempt:
    limited = status == 429
    return Attempt(case.check, case.method, case.path, "", case.credential.label, "", case.vantage.name,
                   case.expected, status=status, layer="proxy" if limited else "upstream",
                   outcome="limited" if limited else "reached", reason=reason,
                   verdict="inconclusive" if limited else "proved",
                   note="; Retry-After 30" if limited else "")


def test_the_schedule_holds_a_case_until_the_budget_has_room(tmp_path: Path) -> None:
    s, plan = plan_of(tmp_path, policy_text(6000, burst=6000), keys=1)
    ctx = ctx_of(s)
    chat = plan.decision(*CHAT)
    assert chat is not None
    body = json.dumps({"max_tokens": 1000, "n": 4, "messages": []}).encode()     # 4000 + bytes
    cost = plan_body.token_cost(chat, body)
    cases = [chat_case(ctx, body) for _ in range(2)]
    sched = _Schedule(ctx, cases, ProbeOptions(rate=0, max_time=1000), 0.0, wall_offset=600.0)
    assert [t.tokens for t in sched.bound.tokens] == [2 * cost]
    assert sched.bound.seconds == pytest.approx(tp.token_bound("k", 6000, 6000, 2 * cost).seconds)
    first, wait = sched.pick(0.0)
    assert first == [0] and wait == 0.0
    assert sched.pick(0.01) == ([], 0.25)                     # no room: waits (polled, at most 0.25 s)
    assert not sched.settle(0, answered(cases[0], 200), 0.5)
    # the bucket: 4000+ of 6000 spent leave room once it refilled the rest (at a share of 100 a second)
    t = sched.token_ready(sched.lanes[sched.lane_key[1]], 0, 1, 0.5)
    assert t == pytest.approx((2 * cost - 6000) / (100 * tp.REFILL_SHARE) + tp.MARGIN_S, abs=0.3)
    assert sched.pick(t)[0] == [1]


def test_an_unexpected_token_refusal_is_sent_again_when_the_budget_has_room_and_said(tmp_path: Path) -> None:
    s, _plan = plan_of(tmp_path, policy_text(6000), keys=1)
    ctx = ctx_of(s)
    body = b'{"max_tokens": 10, "messages": []}'
    cases = [chat_case(ctx, body)]
    sched = _Schedule(ctx, cases, ProbeOptions(rate=0, max_time=1000), 0.0, wall_offset=600.0)
    assert sched.pick(0.0)[0] == [0]
    again = sched.settle(0, answered(cases[0], 429, "token-budget"), 0.1)
    assert again                                        # inconclusive: tried again ...
    assert "token-budget" in sched.throttled[0] and "had room for" in sched.throttled[0]
    assert sched.pick(0.2) == ([], 0.25)                 # ... once the budget, counted spent, has room
    t = sched.token_ready(sched.lanes[sched.lane_key[0]], 0, 0, 0.2)
    assert t >= 0.1 + 30                                # the proxy's Retry-After: 30 s
    assert sched.pick(t)[0] == [0]


def test_a_case_about_the_budget_is_not_held_back(tmp_path: Path) -> None:
    s, _plan = plan_of(tmp_path, policy_text(6000, burst=6000), keys=1)
    ctx = ctx_of(s)
    body = json.dumps({"max_tokens": 1000, "n": 4, "messages": []}).encode()
    cases = [chat_case(ctx, body, check="token-budget", reasons=("token-budget",)) for _ in range(3)]
    sched = _Schedule(ctx, cases, ProbeOptions(rate=0, max_time=1000), 0.0, wall_offset=600.0)
    assert [t.tokens for t in sched.bound.tokens] == [6000]    # spends the budget once
    sent = [sched.pick(0.0)[0], sched.pick(0.0)[0], sched.pick(0.0)[0]]
    assert sent == [[0], [1], [2]]


def test_a_budget_spent_before_the_run_is_waited_for_once_then_its_case_goes_first(tmp_path: Path) -> None:
    """The run's first request on a budget refused for token-budget (an earlier probe spent it):
    sent again, ahead of the rest of its check, once the bucket refilled whole (C x 60 / N s);
    a later refusal is the check's evidence and is not sent again."""
    s, _plan = plan_of(tmp_path, policy_text(6000), keys=1)    # a bucket of 1500: 15 s to refill
    ctx = ctx_of(s)
    body = json.dumps({"max_tokens": 100, "messages": []}).encode()
    cases = [replace(chat_case(ctx, body, check="token-budget", reasons=("token-budget",)), first=True)
             for _ in range(3)]
    sched = _Schedule(ctx, cases, ProbeOptions(rate=0, max_time=1000), 0.0, wall_offset=600.0)
    assert sched.pick(0.0)[0] == [0]
    refused = replace(answered(cases[0], 429, "token-budget"), verdict="proved")   # what the check expects
    assert sched.settle(0, refused, 0.1)                          # goes again ...
    assert "spent before the run" in sched.throttled[0] and "refilled whole" in sched.throttled[0]
    wait = tp.refill_seconds(1500, 6000)
    assert wait == pytest.approx(15 + tp.MARGIN_S)
    assert sched.pick(0.2) == ([], 0.25) and sched.pick(5.0) == ([], 0.25)    # ... after the refill,
    assert sched.pick(0.1 + wait)[0] == [0]                                    # before case 1
    assert not sched.settle(0, answered(cases[0], 200), 0.2 + wait)
    assert sched.pick(0.3 + wait)[0] == [1]
    assert not sched.settle(1, refused, 0.4 + wait)               # not the run's first: evidence, kept
    # no time left for the refill: the refusal stands
    late = _Schedule(ctx, cases, ProbeOptions(rate=0, max_time=10), 0.0, wall_offset=600.0)
    assert late.pick(0.0)[0] == [0] and not late.settle(0, refused, 0.1)


def test_other_cases_on_a_budget_wait_for_its_first_cases_whatever_their_lane(tmp_path: Path) -> None:
    s, _plan = plan_of(tmp_path, policy_text(6000), keys=1)
    ctx = ctx_of(s)
    body = json.dumps({"max_tokens": 10, "messages": []}).encode()
    first = replace(chat_case(ctx, body, check="token-budget", reasons=("token-budget",)), first=True)
    cases = [chat_case(ctx, body), first]
    sched = _Schedule(ctx, cases, ProbeOptions(rate=0, max_time=1000), 0.0, wall_offset=600.0)
    assert sched.firsts_left == {sched.charges[1].key: 1}
    assert sched.pick(0.0)[0] == [1]                 # the budget's own check first
    assert sched.pick(0.01)[0] == []                 # the other case waits for its answer
    assert not sched.settle(1, answered(first, 200), 0.1)
    assert sched.firsts_left[sched.charges[1].key] == 0
    assert sched.pick(0.2)[0] == [0]


def test_a_case_no_budget_charges_does_not_wait_behind_one_that_waits_for_its_tokens(tmp_path: Path) -> None:
    s, _plan = plan_of(tmp_path, policy_text(6000, burst=6000), keys=1)
    ctx = ctx_of(s)
    body = json.dumps({"max_tokens": 1000, "n": 4, "messages": []}).encode()
    over = json.dumps({"max_tokens": 4096, "n": 4}).encode()                   # refused for its envelope
    cases = [chat_case(ctx, body), chat_case(ctx, body), chat_case(ctx, over, expected="deny")]
    sched = _Schedule(ctx, cases, ProbeOptions(rate=0, max_time=1000), 0.0, wall_offset=600.0)
    assert sched.pick(0.0)[0] == [0]
    assert sched.pick(0.2)[0] == [2]            # not charged: ahead of case 1, which waits for its tokens
    assert sched.pick(0.3)[0] == []


# --- a token refusal where the plan refuses for the envelope -----------------------------------------

def test_a_body_over_the_envelope_caps_refused_for_its_token_budget_fails() -> None:
    from scanner.probe.verdict import verdict

    cred, where = Credential("role:user", "role", "user"), Vantage("public")
    limited = Attempt("limits", *CHAT, "", cred.label, "", where.name, "deny", status=429, layer="proxy",
                      outcome="limited", reason="token-budget")
    got, why = verdict("deny", ("envelope-tokens",), limited)
    assert got == "failed" and "past the cap" in why            # the plan refuses it for good: 400
    assert verdict("deny", ("json-cap:n",), limited)[0] == "inconclusive"   # another case: throttled
    assert verdict("allow", (), limited)[0] == "inconclusive"


def test_every_proxy_is_paced_by_the_one_bucket(tmp_path: Path) -> None:
    s, plan = plan_of(tmp_path, policy_text(6000), keys=1)
    chat = plan.decision(*CHAT)
    assert chat is not None
    ctx = ctx_of(s)
    ch = tp.charge_of(plan, chat_case(ctx, b'{"messages":[],"max_tokens":10}'), PUBLIC(ctx))
    assert (ch.limit, ch.capacity) == (6000, 1500)    # the plan's bucket, as NGINX, Envoy and the limiter
    m = tp.TokenModel(ch.limit, ch.capacity)
    m.charge(1500, 630.0)
    assert m.wait(1500, 630.0) == pytest.approx(15.0 / tp.REFILL_SHARE + tp.MARGIN_S)


def test_an_overdrawn_bucket_is_not_full() -> None:
    m = tp.TokenModel(6000, 6000)
    for _ in range(3):                          # cases about the budget charge past it
        m.charge(3000, 600.0)
    assert m.bucket(600.0) == pytest.approx(-3000)
    assert m.wait(6000, 600.0) == pytest.approx(9000 / m.rate + tp.MARGIN_S)
