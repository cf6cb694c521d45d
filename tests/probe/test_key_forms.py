"""Near-miss forms of a key (scanner/probe/key_forms.py) and the near-miss check against the mock
perimeter (tests/probe/helpers.py): forms deterministic, never the key, never printed; a correct
perimeter proves every key audience, a pass-the-hash or prefix-compare one fails the run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import httpx
import pytest

import scanner.probe.checks  # noqa: F401  (registers them)
from scanner.inventory.model import Inventory, Source
from scanner.plan.build import build
from scanner.policy.load import loads
from scanner.probe import key_forms, registry
from scanner.probe.checks import near_miss
from scanner.probe.interface import ProbeOptions, ProbeResult, Vantage
from scanner.probe.runner import probe
from scanner.report import probe_json
from tests.probe import helpers as h

KEY = "vp_Ab3-xYz_Q9"
KEYS = (h.USER_KEY, h.OPER_KEY, h.USER2_KEY)
VANTAGES = (Vantage(), Vantage("admin", "10.30.0.5"))


def run(factory: Callable[[Vantage], httpx.AsyncBaseTransport], *roles: str,
        vantages: tuple[Vantage, ...] = VANTAGES) -> ProbeResult:
    """The near-miss check alone through ``factory`` with the keys of ``roles``."""
    return h.run(factory, *roles, vantages=vantages, checks=("near-miss",), allow_state_changes=True)


def values(key: str, principal: str = "") -> dict[str, str]:
    return {f.name: f.value for f in key_forms.forms(key, principal)}


def test_the_forms_of_a_key() -> None:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    assert values(KEY, "alice") == {
        "sha256-hex": digest, "upper-case sha256-hex": digest.upper(),
        "last character dropped": KEY[:-1], "one character appended": KEY + "x",
        "last character changed": KEY[:-1] + "x", "first character changed": "x" + KEY[1:],
        "case swapped": "VP_aB3-XyZ_q9", "first half": "vp_Ab3", "doubled": KEY + KEY,
        "principal name": "alice"}
    assert tuple(values(KEY, "alice")) == key_forms.NAMES


@pytest.mark.parametrize("key", [KEY, h.USER_KEY, "x", "X", "xy", "12345", "!~", "a" * 2000,
                                 "vp_" + "x" * 43])
def test_forms_are_deterministic_distinct_visible_and_never_the_key(key: str) -> None:
    forms = key_forms.forms(key, "a-principal")
    assert forms == key_forms.forms(key, "a-principal")
    got = [f.value for f in forms]
    assert key not in got
    assert len(set(got)) == len(got)
    assert all(v and all("!" <= c <= "~" for c in v) for v in got)
    assert [f.name for f in forms] == [n for n in key_forms.NAMES if n in {f.name for f in forms}]
    # the changed characters differ from the key's even to a case-insensitive compare
    # (a one-character key's first character is its last: that form is there once)
    changed = {f.name: f.value for f in forms}
    assert "last character changed" in changed
    for name in ("last character changed", "first character changed"):
        assert changed.get(name, "").lower() != key.lower(), name


def test_a_form_is_left_out_when_it_is_empty_unchanged_or_a_real_key() -> None:
    assert "case swapped" not in values("12345")             # no letter: the key itself
    assert "last character dropped" not in values("x")      # empty
    assert "first half" not in values("x")
    assert "principal name" not in values(KEY)               # unknown
    real = {hashlib.sha256((KEY + "x").encode()).hexdigest().upper()}
    assert "one character appended" not in {f.name for f in key_forms.forms(KEY, real=real)}
    assert key_forms.forms("") == ()


def test_a_form_value_is_never_in_its_repr() -> None:
    forms = key_forms.forms(KEY, "alice")
    text = repr(forms) + str(forms)
    assert not [f.name for f in forms if f.value in text]


def test_the_check_runs_by_default() -> None:
    assert "near-miss" in registry.ids()
    assert "near-miss" in {c.id for c in registry.selected(())}


def test_a_correct_perimeter_refuses_every_form_of_every_key() -> None:
    r = run(h.perimeter(h.plan()), "user", "user#2", "operator")
    cov = {c.subject.split(" via ")[0]: c for c in r.coverage}
    assert set(cov) == {"near-miss keys inference", "near-miss keys operator"}
    assert {c.status for c in cov.values()} == {"proved"}, cov
    # one route per audience: the bodiless one of inference, the only one of operator
    assert {(c.method, c.path) for c in cov.values()} == {("GET", "/v1/models"), ("POST", "/pause")}
    sent = [a for a in r.attempts if a.check == "near-miss"]
    assert len(sent) == 2 * 3 * 9                 # 2 audiences x 3 keys x 9 forms (no principal names here)
    assert {(a.status, a.reason) for a in sent} == {(401, "unknown-key")}
    assert {a.vantage for a in sent if a.path == "/pause"} == {"admin"}
    assert r.findings == () and r.exit_code() == 0


def _admits(near: set[str]) -> Callable[[Vantage], httpx.AsyncBaseTransport]:
    """The mock perimeter, weakened: a bearer in ``near`` is taken for the key it derives from."""
    inner = h.perimeter(h.plan())
    to_key = {v: k for k in KEYS for v in near_values(k) if v in near}

    class Weakened(httpx.AsyncBaseTransport):
        def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
            self.transport = transport

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            token = request.headers.get("authorization", "").partition(" ")[2]
            if token in to_key:
                request.headers["authorization"] = f"Bearer {to_key[token]}"
            return await self.transport.handle_async_request(request)

    return lambda v: Weakened(inner(v))


def near_values(key: str) -> list[str]:
    return [f.value for f in key_forms.forms(key)]


def _pass_the_hash() -> set[str]:
    return {hashlib.sha256(k.encode()).hexdigest() for k in KEYS}


def _prefix() -> set[str]:
    return {k + "x" for k in KEYS}


def _check_failed(r: ProbeResult, forms: set[str]) -> None:
    found = [f for f in r.findings if f.check == "near-miss"]
    assert found and {f.rule for f in found} == {"VP001"}, [(f.rule, f.title) for f in r.findings]
    assert all(f.title.startswith("a near-miss of a real API key was accepted") for f in found)
    assert r.exit_code() == 1
    failed = {a.credential.partition(" of ")[0] for a in r.attempts if a.verdict == "failed"}
    assert failed == forms


@pytest.mark.parametrize(("near", "forms"), [(_pass_the_hash, {"sha256-hex"}),
                                              (_prefix, {"one character appended"})])
def test_a_weakened_key_check_fails_the_run(near: Callable[[], set[str]], forms: set[str]) -> None:
    r = run(_admits(near()), "user", "operator")
    _check_failed(r, forms)
    # admitted with its role: reached; on the other audience's route: refused only for the role
    outcomes = {(a.credential.partition(" of ")[2], a.path, a.outcome, a.reason) for a in r.attempts
                if a.verdict == "failed"}
    assert ("role:user", "/v1/models", "reached", "") in outcomes
    assert ("role:user", "/pause", "denied", "role") in outcomes
    doc = probe_json.render(r)
    assert not [v for k in KEYS for v in near_values(k) if v in doc]
    assert not [k for k in KEYS if k in doc]
    json.loads(doc)


def test_without_a_key_or_a_vantage_inside_nothing_is_proven_and_it_says_why() -> None:
    r = run(h.perimeter(h.plan()))
    assert {c.why for c in r.coverage} == {near_miss.NO_KEY}
    assert {c.status for c in r.coverage} == {"not-proven"}
    r = run(h.perimeter(h.plan()), "user", "operator", vantages=(Vantage(),))   # none in admin
    cov = {c.subject.split(" via ")[0]: c for c in r.coverage}
    assert cov["near-miss keys inference"].status == "proved"
    assert cov["near-miss keys operator"].status == "not-proven"
    assert cov["near-miss keys operator"].why.startswith("no vantage inside its networks (10.30.0.0/16)")


def test_a_form_over_the_bearer_limit_may_be_refused_as_no_key() -> None:
    long = "vp_" + "k" * 600
    assert [f.name for f in key_forms.forms(long) if len(f.value) > key_forms.BEARER_MAX] == ["doubled"]


def test_a_state_changing_route_without_a_non_acting_request_of_its_method_is_not_sent() -> None:
    """Its safe request would be another method, refused (405) before the key is read: the audience
    is not proven, said why, unless state changes are allowed (the stand-in, staging)."""
    policy = h.POLICY.replace("  - {path: /pause, methods: [POST], audience: operator, state_changing: true}\n", "") \
        .replace("{path: /sleep, audience: none,", "{path: /sleep, methods: [POST], audience: operator,")
    p = build(Inventory(source=Source("asgi", "unit"), routes=h.ROUTES), loads(policy))
    assert [(d.method, d.path) for d in p.allowed if d.audience == "operator"] == [("POST", "/sleep")]
    for allowed, status in ((False, "not-proven"), (True, "proved")):
        options = ProbeOptions(rate=0, transport_factory=h.perimeter(p), catalog_dir="/nonexistent",
                               checks=("near-miss",), allow_state_changes=allowed)
        r = probe(p, h.TARGET, h.creds("operator"), VANTAGES, options)
        cov = {c.subject.split(" via ")[0]: c for c in r.coverage}["near-miss keys operator"]
        assert cov.status == status, cov
        assert (cov.why == near_miss.UNSENDABLE) is not allowed
        assert bool([a for a in r.attempts if a.path == "/sleep"]) is allowed
