"""Listed values (``fields: {values: {NAME: [V, ...]}}``): the rule kind added to the rule program
in one place (issue 28: its model in scanner/rules.py, its line in the compiler, one instruction
per interpreter: Python, njs, Lua); a field present and not null holds one of the values (JSON
equality: 1 is not "1"), else 400 json-cap:NAME:not-listed; proved through NGINX (both builds,
and 1.22's Lua runtime) and Envoy by the limits check."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.errors import PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan.body import judge
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.plan.program import compile_decision
from scanner.policy.load import loads
from scanner.policy.model import Policy
from scanner.probe.interface import ProbeOptions
from scanner.rules import Values
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("limits",))
CHAT = ("POST", "/v1/chat/completions")


def _listed() -> Policy:
    """The bundled policy with end users' service_tier and reasoning_effort listed."""
    policy = load_policy(None)
    inference = policy.audiences["inference"]
    named = {k: v for k, v in inference.fields.named.items() if k not in ("service_tier", "reasoning_effort")}
    fields = replace(inference.fields, named={**named, "service_tier": "allow", "reasoning_effort": "allow"},
                     values={"service_tier": ("auto", "default"), "reasoning_effort": ("low", "medium")})
    return replace(policy, audiences={**policy.audiences, "inference": replace(inference, fields=fields)})


def test_the_plan_compiles_listed_values_into_one_instruction_each() -> None:
    chat = build(load_ref(CATALOG), _listed()).decision(*CHAT)
    assert chat is not None
    steps = [s for s in compile_decision(chat).steps if isinstance(s, Values)]
    assert [(s.field, s.values) for s in steps] == [("reasoning_effort", ["low", "medium"]),
                                                   ("service_tier", ["auto", "default"])]
    assert judge(chat, b'{"model":"m","messages":[],"service_tier":"flex"}').reason == \
        "json-cap:service_tier:not-listed"
    assert judge(chat, b'{"model":"m","messages":[],"service_tier":"auto","reasoning_effort":null}').reason == ""


BASE = ("schema_version: 1\nname: t\nnetworks: {n: [127.0.0.1/32]}\n"
        "audiences:\n  a: {kind: end-user, networks: [n], auth: none, fields: %s}\n"
        "routes:\n  - {path: /v1/chat/completions, audience: a}\n")


@pytest.mark.parametrize(("text", "message"), [
    ("{deny: [user], values: {user: [a]}}", "values apply to allowed fields"),
    ("{pin: {user: a}, values: {user: [a]}}", "values apply to allowed fields"),
    ("{values: {user: []}}", "list at least one value"),
    ("{values: {user: [[1]]}}", "expected a single value"),
])
def test_bad_values_name_the_line(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        loads(BASE % text, source="p.yaml")
    assert "p.yaml:5" in str(err.value) and message in str(err.value), str(err.value)


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_listed_values_are_proved_through_the_proxy(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), _listed(), CATALOG, OPTIONS)
    assert not res.findings, [(f.rule, f.title, f.detail[:300]) for f in res.findings]
    subjects = {c.subject: c for c in res.coverage if c.subject.startswith("json-values ")}
    assert {"json-values service_tier POST /v1/chat/completions",
            "json-values reasoning_effort POST /v1/chat/completions"} <= set(subjects)   # every inference route
    assert all(c.status == "proved" for c in subjects.values()), \
        [(c.subject, c.status, c.why) for c in subjects.values() if c.status != "proved"]


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_a_route_without_its_values_check_is_caught(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), _listed(), CATALOG, OPTIONS, mutant="values-check-removed")
    assert any(f.rule == "VP005" and "not one of" in f.detail for f in res.findings), \
        [(f.rule, f.title, f.detail[:300]) for f in res.findings]
