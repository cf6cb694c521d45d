"""The prober against mock targets: expectations, classification, findings, exit codes."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from scanner.errors import UsageError
from scanner.probe import config
from scanner.probe.cases import Case
from scanner.probe.classify import classify, error_reason
from scanner.probe.expect import expect
from scanner.probe.interface import Attempt, Credential, Vantage
from tests.probe import helpers as h


def _rules(result: object) -> set[tuple[str, str, str]]:
    return {(f.rule, f.method, f.path) for f in result.findings}  # type: ignore[attr-defined]


# From the loopback address the prober binds, and two addresses the mock takes as the caller's.
VANTAGES = (Vantage(), Vantage("admin", "10.30.0.5"), Vantage("monitoring", "10.20.0.5"))


def test_correct_perimeter_has_no_findings_and_exits_0() -> None:
    r = h.run(h.perimeter(h.plan()), "user", "user#2", "operator", vantages=VANTAGES, allow_state_changes=True)
    assert not r.unreachable, r.reason
    assert r.findings == (), [f.title for f in r.findings]
    other = [c for c in r.coverage if c.check == "rate" and c.subject.endswith("other principal")]
    assert other and all(c.status == "proved" for c in other), other
    assert r.exit_code("low") == 0
    checks = {a.check for a in r.attempts}
    assert {"matrix", "bypass", "spoof", "limits", "rate"} <= checks
    # the rate burst met 429s; the limit checks met the proxy's 413/400, for the reason under test
    assert any(a.status == 429 and a.reason == "rate" for a in r.attempts if a.check == "rate")
    over = [a for a in r.attempts if a.check == "limits" and a.expected == "deny"]
    assert over and all(a.layer == "proxy" and a.verdict == "proved" for a in over)
    # ... and the requests exactly at the limits went through
    at = [a for a in r.attempts if a.check == "limits" and a.expected == "allow"]
    assert at and all(a.outcome == "reached" for a in at)
    # every subject of every check is proved or not applicable, none left unproven
    assert r.coverage and all(c.status in ("proved", "not-applicable") for c in r.coverage), \
        [c for c in r.coverage if c.status not in ("proved", "not-applicable")]


def test_what_safe_mode_cannot_send_is_not_proven_never_passed() -> None:
    r = h.run(h.perimeter(h.plan()), "user", "operator", vantages=VANTAGES)
    gaps = {(f.rule, f.title) for f in r.findings}
    # /sleep changes state and has no request vLLM rejects before its handler: not sent, so not proven
    assert ("VP011", "not proven (matrix): POST /sleep") in gaps
    assert all(rule == "VP011" for rule, _ in gaps), gaps
    cov = {(c.check, c.subject): c for c in r.coverage}
    assert cov[("matrix", "POST /sleep")].status == "not-proven"
    assert "state-changing" in cov[("matrix", "POST /sleep")].why
    # ... while /pause has one (a bad query value): its limits are proven in safe mode
    assert cov[("limits", "fields POST /pause")].status == "proved"
    # not proven is not a deviation: the plan holds (0) unless proof is required (1)
    assert r.exit_code() == 0 and r.exit_code(require_proof=True) == 1


def test_a_single_vantage_leaves_what_it_cannot_reach_unproven() -> None:
    r = h.run(h.perimeter(h.plan()), "user", "operator", allow_state_changes=True)
    cov = {(c.check, c.subject): c for c in r.coverage}
    # no vantage inside admin: /pause's allowed cell and its limits cannot be exercised
    assert cov[("limits", "fields POST /pause")].status == "not-proven"
    assert "no credential and vantage" in cov[("limits", "fields POST /pause")].why
    # the inference routes are open to every IPv4 address: nothing to spoof
    assert cov[("spoof", "spoof GET /v1/models")].status == "not-applicable"
    assert any(f.rule == "VP011" and f.path == "/pause" for f in r.findings)


def test_open_upstream_is_critical_and_exits_1() -> None:
    r = h.run(h.open_upstream(h.plan()), "user")
    rules = _rules(r)
    assert ("VP001", "POST", "/invocations") in rules
    # /sleep is never sent with POST: the wrong method proves it (405 from the router)
    sleep = [f for f in r.findings if f.path == "/sleep" and f.rule == "VP001"]
    assert sleep and "non-acting" in sleep[0].title and sleep[0].severity == "critical"
    assert all(not a.request_line.startswith("POST /sleep") for a in r.attempts if a.outcome != "skipped")
    assert any(a.outcome == "skipped" and a.path == "/sleep" for a in r.attempts)
    # /pause has a verified safe declared-method probe: a bad query value
    assert any(a.request_line.startswith("POST /pause?mode=__probe__") for a in r.attempts)
    assert ("VP003", "GET", "/health") in rules          # monitoring route from outside its network
    assert ("VP005", "POST", "/v1/chat/completions") in rules  # limits not enforced
    assert r.exit_code("high") == 1 and r.exit_code("critical") == 1


def test_allow_state_changes_sends_the_real_request() -> None:
    r = h.run(h.open_upstream(h.plan()), allow_state_changes=True, checks=("matrix",))
    assert any(a.request_line.startswith("POST /sleep ") for a in r.attempts)


def test_wrong_role_and_network_findings() -> None:
    # an upstream that lets everything through, probed with an operator key from an admin address
    r = h.run(h.open_upstream(h.plan()), "operator", checks=("matrix",))
    rules = _rules(r)
    assert ("VP002", "POST", "/v1/chat/completions") in rules   # operator is not an inference role
    assert ("VP003", "POST", "/pause") in rules                 # right role, wrong network (127.0.0.1)


def test_upstream_guard_is_reported_as_not_reached_by_perimeter() -> None:
    def upstream(r: httpx.Request) -> httpx.Response:
        if r.url.path.startswith("/v1"):
            return httpx.Response(401, json={"error": "Unauthorized"})
        return httpx.Response(404, json={"detail": "Not Found"})

    r = h.run(lambda v: httpx.MockTransport(upstream), checks=("matrix",))
    f = [f for f in r.findings if f.rule == "VP009"]
    assert f and all(x.severity == "low" for x in f)
    assert "not the perimeter" in f[0].detail
    assert r.exit_code("high") == 0


def test_dead_target_is_exit_3_not_a_traceback() -> None:
    def refuse(r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=r) from ConnectionRefusedError(111, "refused")

    r = h.run(lambda v: httpx.MockTransport(refuse))
    assert r.unreachable and r.exit_code() == 3
    assert "connect-refused" in r.reason


def test_max_time_gives_partial_results_and_exit_3() -> None:
    async def slow(r: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return httpx.Response(404, headers={"X-Perimeter-Decision": "deny"})

    r = h.run(lambda v: httpx.MockTransport(slow), max_time=1.0, concurrency=2)
    assert r.unreachable and "max-time" in r.reason and r.exit_code() == 3
    assert 0 < len(r.attempts) < 400


def test_timeouts_are_attempts() -> None:
    def timeout(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/":
            return httpx.Response(404)
        raise httpx.ReadTimeout("slow", request=r)

    r = h.run(lambda v: httpx.MockTransport(timeout), checks=("matrix",))
    assert r.attempts and all(a.error == "timeout" for a in r.attempts if a.outcome == "error")
    assert r.unreachable and "nothing answered" in r.reason


def test_vantages_are_separate_cells() -> None:
    vs = (Vantage("outside", "127.0.0.2"), Vantage("admin", "10.30.0.5"))
    r = h.run(h.perimeter(h.plan()), "operator", vantages=vs, checks=("matrix",))
    assert {a.vantage for a in r.attempts} == {"outside", "admin"}
    pause = [a for a in r.attempts if a.request_line.startswith("POST /pause?") and a.credential == "role:operator"]
    assert {a.vantage: a.expected for a in pause} == {"outside": "deny", "admin": "allow"}
    # left unproven: what safe mode could not send (POST /sleep), and the allowed routes no cell
    # of this run is admitted by (no user key; no vantage in the monitoring network)
    assert {f.rule for f in r.findings} == {"VP011"}
    cov = {c.subject: c for c in r.coverage if c.check == "matrix" and c.status == "not-proven"}
    assert set(cov) == {"POST /sleep", "GET /health", "POST /v1/chat/completions", "GET /v1/models",
                        "GET /v1/responses/{response_id}"}, set(cov)
    assert "no vantage inside its networks (10.20.0.0/16)" in cov["GET /health"].why
    assert "no --key with a role it admits (user)" in cov["GET /v1/models"].why
    assert r.exit_code("high") == 0


def test_expectation_rules() -> None:
    p = h.plan()
    chat = p.decision("POST", "/v1/chat/completions")
    user, oper = h.creds("user", "operator")[3:]
    assert expect(chat, user, "1.2.3.4").expected == "allow"
    assert expect(chat, oper, "1.2.3.4").reasons == ("role",)
    assert expect(chat, Credential("none", "none"), "1.2.3.4").reasons == ("missing-key",)
    assert expect(chat, Credential("x", "malformed"), "1.2.3.4").reasons == ("missing-key", "unknown-key")
    health = p.decision("GET", "/health")
    assert expect(health, Credential("none", "none"), "10.20.1.1").expected == "allow"
    assert expect(health, Credential("none", "none"), "127.0.0.1").reasons == ("network",)
    # a path nothing is allowed on is unknown to the perimeter; a method it does not allow is refused
    assert expect(p.decision("POST", "/invocations"), user, "10.20.1.1").reasons == ("not-allowlisted",)
    assert expect(None, user, None).reasons == ("not-allowlisted",)
    assert expect(None, user, "1.2.3.4", (health,)).reasons == ("method-not-allowed", "network")
    assert expect(None, user, "10.20.1.1", (health,)).reasons == ("method-not-allowed",)


def test_classification() -> None:
    marker = {"x-perimeter-decision": "deny", "x-perimeter-reason": "network"}
    assert classify(403, marker) == ("proxy", "denied", "deny", "network")
    assert classify(429, {"x-perimeter-decision": "deny"})[:2] == ("proxy", "limited")
    assert classify(503, {"x-perimeter-decision": "error"})[:2] == ("proxy", "error")
    assert classify(401, {})[:2] == ("upstream", "guarded")
    assert classify(404, {})[:2] == ("upstream", "absent")
    assert classify(400, {"content-type": "text/plain"})[:2] == ("upstream", "absent")
    assert classify(400, {"content-type": "application/json"})[:2] == ("upstream", "reached")
    assert classify(405, {})[:2] == ("upstream", "reached")
    assert classify(500, {})[:2] == ("upstream", "reached")
    assert error_reason(httpx.ConnectTimeout("x")) == "timeout"


def test_keys_by_reference_only(tmp_path: object) -> None:
    import pathlib

    f = pathlib.Path(str(tmp_path)) / "k"
    f.write_text(h.USER_KEY + "\n")
    c = config.parse_key(f"user=file:{f}")
    assert c.secret == h.USER_KEY and c.fingerprint.startswith("sha256:") and h.USER_KEY not in repr(c)
    assert config.parse_key("op=env:K", {"K": h.OPER_KEY}).role == "op"
    for bad in (f"user={h.USER_KEY}", "user=env:MISSING", "user", "user=file:/nonexistent/x"):
        with pytest.raises(UsageError) as err:
            config.parse_key(bad, {})
        assert h.USER_KEY not in str(err.value)


def test_vantage_parsing() -> None:
    assert config.vantages(["a=127.0.0.2"]) == (Vantage("a", "127.0.0.2"),)
    assert config.vantages([]) == (Vantage(),)
    with pytest.raises(UsageError):
        config.parse_vantage("a=not-an-ip")


def test_httpx_collapses_dot_segments_so_variants_go_raw() -> None:
    from scanner.probe.checks.access import path_variants
    from scanner.probe.send import raw_request

    assert httpx.URL("http://x/v1/../invocations").raw_path == b"/invocations"
    variants = dict(path_variants("/invocations", "h:1"))
    assert variants["dot segments /v1/.."] == "/v1/../invocations"
    assert variants["encoded slash %2f"] == "/%2finvocations"
    assert variants["absolute-form target"] == "http://h:1/invocations"
    from scanner.probe.cases import Case

    case = Case("bypass", "POST", "/invocations", "POST", "/v1/../invocations", Credential("none", "none"),
                Vantage(), "deny", body=b"{}", raw=True)
    data = raw_request(case, "h:1")
    assert data.startswith(b"POST /v1/../invocations HTTP/1.1\r\nHost: h:1\r\n")
    assert data.endswith(b"Content-Length: 2\r\n\r\n{}")


def _rate_ctx() -> tuple[object, list[Case]]:
    from scanner.probe.checks.load import RateBurst
    from scanner.probe.interface import ProbeOptions, Vantage
    from scanner.probe.registry import CheckContext

    ctx = CheckContext(plan=h.plan(), target=h.TARGET, credentials=h.creds("user"),
                       vantages=(Vantage(),), options=ProbeOptions())
    return ctx, list(RateBurst().generate(ctx))


def _answer(c: Case, at: float, status: int = 200, reason: str = "") -> tuple[Case, Attempt]:
    from scanner.probe.verdict import verdict

    layer = "proxy" if reason else "upstream"
    a = Attempt(check="rate", method=c.method, path=c.path, request_line="x", credential="role:user",
                fingerprint="", vantage="default", expected="allow", status=status, layer=layer,  # type: ignore[arg-type]
                outcome="limited" if reason else "reached", sent_at=at, reason=reason, subject=c.subject)
    v, why = verdict(c.expected, c.reasons, a)
    return c, replace(a, verdict=v, why=why)


def test_rate_judge_is_not_proven_when_the_burst_was_too_slow() -> None:
    from scanner.probe.checks.load import RateBurst

    ctx, cases = _rate_ctx()
    check = RateBurst()
    burst = [c for c in cases if c.phase == 2]
    assert len(burst) == 51  # burst 10 + 2 x rps 20 + 1
    zone = [s for s in check.subjects(ctx) if s.key == burst[0].subject]  # type: ignore[arg-type]

    def attempts(spacing: float) -> list[tuple[Case, Attempt]]:
        return [_answer(c, 100.0 + i * spacing) for i, c in enumerate(burst)]

    fast = list(check.judge(ctx, attempts(0.001)))  # type: ignore[arg-type]
    assert [f.rule for f in fast] == ["VP005"] and "rate above the plan" in fast[0].title
    assert [c.status for c in check.cover(ctx, zone, attempts(0.001))] == ["failed"]  # type: ignore[arg-type]
    slow = list(check.judge(ctx, attempts(1.0)))    # type: ignore[arg-type]
    assert slow == []
    covered = list(check.cover(ctx, zone, attempts(1.0)))  # type: ignore[arg-type]
    assert [c.status for c in covered] == ["not-proven"] and "send faster (--concurrency)" in covered[0].why


def test_every_other_route_of_a_rate_zone_must_meet_the_emptied_bucket() -> None:
    from scanner.probe.checks.load import RateBurst

    ctx, cases = _rate_ctx()
    check = RateBurst()
    burst = [c for c in cases if c.phase == 2]
    follow = [c for c in cases if c.phase == 3]
    members = sorted({c.subject for c in follow})
    assert members and all(" via " in m for m in members)
    assert (burst[0].method, burst[0].path) not in {(c.method, c.path) for c in follow}
    subjects = list(check.subjects(ctx))  # type: ignore[arg-type]
    assert set(members) <= {s.key for s in subjects}
    # the burst empties the bucket: its last 41 requests meet 429 for rate
    emptied = [_answer(c, 100 + i * 0.001, *((429, "rate") if i >= 10 else ())) for i, c in enumerate(burst)]
    limited = [_answer(c, 100.1 + i * 0.001, 429, "rate") for i, c in enumerate(follow)]
    statuses = {c.subject: c.status for c in check.cover(ctx, subjects, emptied + limited)}  # type: ignore[arg-type]
    assert {statuses[m] for m in members} == {"proved"}

    # one member without the limiter: every request to it passes right after the burst
    gone = members[0]
    bypass = [_answer(c, 100.1 + i * 0.001, *(() if c.subject == gone else (429, "rate")))
              for i, c in enumerate(follow)]
    found = list(check.judge(ctx, emptied + bypass))  # type: ignore[arg-type]
    assert [f.rule for f in found] == ["VP005"] and "does not spend the zone's bucket" in found[0].detail
    assert found[0].path == next(c.path for c in follow if c.subject == gone)

    # the same passes spread over many seconds: a refill could explain them, so not proven
    slow = [_answer(c, 100.1 + i * 1.0, *(() if c.subject == gone else (429, "rate")))
            for i, c in enumerate(follow)]
    assert list(check.judge(ctx, emptied + slow)) == []  # type: ignore[arg-type]
    statuses = {c.subject: (c.status, c.why) for c in check.cover(ctx, subjects, emptied + slow)}  # type: ignore[arg-type]
    assert statuses[gone][0] == "not-proven" and "refill" in statuses[gone][1]


def test_a_member_refused_by_a_bucket_of_its_own_is_no_proof() -> None:
    """A member whose own limit was raised (NGINX: rate x10, the burst kept) passes its burst + 1
    right after the zone's bucket emptied, then meets a 429 for rate from its own bucket: that
    refusal does not show it spends the zone's bucket; the count it let through does not fit the
    zone's refill."""
    from scanner.probe.checks.load import RateBurst, refilled

    ctx, cases = _rate_ctx()
    check = RateBurst()
    burst = [c for c in cases if c.phase == 2]
    follow = [c for c in cases if c.phase == 3]
    subjects = list(check.subjects(ctx))  # type: ignore[arg-type]
    emptied = [_answer(c, 100 + i * 0.001, *((429, "rate") if i >= 10 else ())) for i, c in enumerate(burst)]
    own = sorted({c.subject for c in follow})[0]
    mine = [c for c in follow if c.subject == own]
    rate = next(d.limits.rate for d in h.plan().decisions if d.rate_zone and d.limits.rate)
    assert rate is not None and len(mine) - 1 > refilled(rate, 0.05)
    # all but its last pass within 50 ms; the last is refused by its own (larger) bucket
    raised = [_answer(c, 100.1 + i * 0.001, *((429, "rate") if c.subject != own or c is mine[-1] else ()))
              for i, c in enumerate(follow)]
    statuses = {c.subject: (c.status, c.why) for c in check.cover(ctx, subjects, emptied + raised)}  # type: ignore[arg-type]
    assert statuses[own][0] == "failed" and "before one was refused for rate" in statuses[own][1]
    others = {s for s in statuses if " via " in s and s != own}
    assert others and {statuses[s][0] for s in others} == {"proved"}
    found = list(check.judge(ctx, emptied + raised))  # type: ignore[arg-type]
    assert [f.rule for f in found] == ["VP005"] and found[0].path == mine[0].path


def test_error_messages_never_carry_the_key() -> None:
    def leaky(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/":
            return httpx.Response(404)
        raise httpx.LocalProtocolError(f"Illegal header value {r.headers.get('authorization')!r}")

    r = h.run(lambda v: httpx.MockTransport(leaky), "user", checks=("matrix",))
    errors = [a.error for a in r.attempts if a.credential == "role:user" and a.error]
    assert errors and all(h.USER_KEY not in e for e in errors)
    assert any("<redacted>" in e for e in errors)


def test_a_rate_zone_shared_by_principals_fails() -> None:
    """The mock's buckets keyed by address: the second user key is refused once the first one's
    burst emptied the bucket."""
    r = h.run(h.perimeter(h.plan(), broken="rate-shared"), "user", "user#2", checks=("rate",))
    assert r.exit_code() == 1
    assert {(f.rule, f.title.split(": ")[0]) for f in r.findings} == {("VP005", "rate limit zone shared")}, \
        r.findings
