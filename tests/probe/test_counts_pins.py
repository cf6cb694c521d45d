"""Count caps and pins in the field rules (issue 10, item 2): the most items a field may hold
(`stop`, `tools`, `messages`, `logit_bias`, ...) and values the perimeter forces (`pin`), decided
once in the plan and proved through NGINX (both builds, and 1.22's Lua runtime) and Envoy by the limits check and the
witness."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.errors import PlanError, PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan.body import forwarded
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.policy.load import loads
from scanner.policy.model import Policy, count_of
from scanner.probe.interface import ProbeOptions
from scanner.runtime.proxy import Proxy
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("limits",))


def _pinned() -> Policy:
    """The bundled policy with priority pinned to 0 for end users instead of refused."""
    policy = load_policy(None)
    inference = policy.audiences["inference"]
    named = {k: v for k, v in inference.fields.named.items() if k != "priority"}
    fields = replace(inference.fields, named=named, pins={"priority": 0, "service_tier": "auto"})
    return replace(policy, audiences={**policy.audiences, "inference": replace(inference, fields=fields)})


def test_count_of_reads_lists_objects_and_scalars() -> None:
    assert [count_of(v) for v in (None, [], [1, 2], {"a": 1}, "stop", 5, False)] == [0, 0, 2, 1, 1, 1, 1]


def test_the_plan_carries_counts_and_pins_and_the_forwarded_body_has_the_pins() -> None:
    plan = build(load_ref(CATALOG), _pinned())
    chat = plan.decision("POST", "/v1/chat/completions")
    assert chat is not None and chat.fields.counts["stop"] == 16 and chat.fields.pins["priority"] == 0
    assert chat.fields.mode("priority") == "allow"
    got = forwarded(chat, {"model": "m", "priority": 9, "max_tokens": 5})
    assert got == {"model": "m", "priority": 0, "service_tier": "auto", "max_tokens": 5}
    assert plan.body_dict()["decisions"][0]["fields"].keys() >= {"allow", "unknown"}


BASE = ("schema_version: 1\nname: t\nnetworks: {n: [127.0.0.1/32]}\n"
        "audiences:\n  a: {kind: end-user, networks: [n], auth: none, fields: %s}\n"
        "routes:\n  - {path: /v1/chat/completions, audience: a}\n")


@pytest.mark.parametrize(("text", "message"), [
    ("{deny: [stop], counts: {stop: 4}}", "a count cap applies to fields that pass"),
    ("{deny: [priority], pin: {priority: 0}}", "a pinned field reaches vLLM with its pin"),
    ("{pin: {user: 'two words'}}", "a pinned string may hold"),
    ("{pin: {user: [1]}}", "expected a single value"),
    ("{counts: {stop: -1}}", "expected a whole number >= 0"),
])
def test_bad_counts_and_pins_name_the_line(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        loads(BASE % text, source="p.yaml")
    assert "p.yaml:5" in str(err.value) and message in str(err.value), str(err.value)


def test_a_pin_the_model_would_refuse_is_a_plan_error_naming_the_line() -> None:
    policy = loads(BASE % "{unknown: pass, pin: {priority: high}}", source="p.yaml")
    with pytest.raises(PlanError) as err:
        build(load_ref(CATALOG), policy)
    assert "p.yaml:5: fields.pin.priority: 'high' is not what POST /v1/chat/completions accepts" in str(err.value)


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_counts_and_pins_are_proved_through_the_proxy(tmp_path: Path, name: str) -> None:
    proxy: Proxy = proxy_named(name)
    res = probe_through(tmp_path, proxy, _pinned(), CATALOG, OPTIONS)
    assert not res.findings, [(f.rule, f.title, f.detail[:300]) for f in res.findings]
    subjects = {c.subject: c for c in res.coverage if c.subject.startswith(("json-count ", "pin "))}
    assert "json-count stop POST /v1/chat/completions" in subjects and "pin POST /v1/chat/completions" in subjects
    assert all(c.status == "proved" for c in subjects.values()), \
        [(c.subject, c.status, c.why) for c in subjects.values() if c.status != "proved"]
    pinned = [a for a in res.attempts if a.note == "a client's own value of each pinned field"]
    assert pinned and all(a.upstream is not None and a.upstream.body is not None and
                          '"priority": 0' in a.upstream.body.replace('":0', '": 0') for a in pinned)
