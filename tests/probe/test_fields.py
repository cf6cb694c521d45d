"""Field rules per audience (issue 10, item 2): each named field allowed, rejected or stripped,
and one choice for every field the rules do not name. Decided once in the plan
(``Decision.fields``), enforced by njs and Lua, proved by the probe through the real proxies."""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.body import forwarded
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.plan.model import Decision, Plan
from scanner.policy.load import loads
from scanner.policy.model import FieldRules, Policy
from scanner.probe.interface import ProbeOptions
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import decided, probe_through, proxy_named, unpaced

CATALOG = "vllm-0.29.0-everything"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("limits",))
CHAT = ("POST", "/v1/chat/completions")


# --- the plan decides once ----------------------------------------------------------------------

def test_named_fields_win_over_the_body_policy_and_the_rest_follow_unknown() -> None:
    policy = load_policy(None)
    plan = build(load_ref(CATALOG), policy)
    chat = plan.decision(*CHAT)
    assert chat is not None and chat.fields.unknown == "reject"
    assert chat.fields.mode("kv_transfer_params") == "reject"
    assert chat.fields.mode("messages") == "allow"
    assert chat.fields.mode("cache_salt") == "reject"          # from body: (not named by the audience)
    assert chat.fields.mode("a_field_from_the_next_vllm") == "reject"
    tokenize = plan.decision("POST", "/tokenize")                # the service audience names none
    assert tokenize is not None and tokenize.fields.unknown == "pass"
    assert tokenize.fields.mode("kv_transfer_params") == "allow" and tokenize.fields.mode("cache_salt") == "reject"
    models = plan.decision("GET", "/v1/models")                  # no body, nothing decided
    assert models is not None and not models.fields.decided
    # an audience may allow a governed field the body policy rejects elsewhere
    svc = replace(policy.audiences["service"], fields=FieldRules(named={"cache_salt": "allow"}, unknown="pass"))
    plan2 = build(load_ref(CATALOG), replace(policy, audiences={**policy.audiences, "service": svc}))
    tok2 = plan2.decision("POST", "/tokenize")
    assert tok2 is not None and tok2.fields.mode("cache_salt") == "allow"


def test_the_bundled_policy_names_every_field_of_the_inference_models() -> None:
    """Every top-level JSON field of 0.28, 0.29 and 0.33's end-user routes is allowed or denied by
    name; nothing is left to `unknown` (form bodies are not inspected)."""
    policy = load_policy(None)
    for version in ("0.28.0", "0.29.0", "0.33.0"):
        plan = build(load_ref(f"vllm-{version}-everything"), policy)
        left = [line for line in plan.unnamed_fields if "(unknown: reject)" in line]
        assert not left, (version, left)


def test_forwarded_body_drops_stripped_and_unknown_stripped_fields() -> None:
    policy = load_policy(None)
    inference = replace(policy.audiences["inference"],
                        fields=FieldRules(named={"model": "allow", "session_id": "strip"}, unknown="strip"))
    plan = build(load_ref(CATALOG), replace(policy, audiences={**policy.audiences, "inference": inference}))
    chat = plan.decision(*CHAT)
    assert chat is not None
    got = forwarded(chat, {"model": "m", "session_id": "s", "other": 1, "max_tokens": 5})
    # max_tokens is not named either: stripped, so the output budget is written in
    assert got == {"model": "m", "max_completion_tokens": 4096}


@pytest.mark.parametrize(("text", "message"), [
    ("{unknown: maybe}", "'maybe' is not one of reject, strip, pass"),
    ("{allow: [model], deny: [model]}", "field 'model' is decided twice"),
    ("{allow: ['messages[]']}", "is not a request field name"),
    ("{allw: [model]}", "unknown key 'allw'"),
])
def test_field_rule_errors_name_the_line(text: str, message: str) -> None:
    from scanner.errors import PolicyError
    base = ("schema_version: 1\nname: t\nnetworks: {n: [127.0.0.1/32]}\n"
            "audiences:\n  a: {kind: end-user, networks: [n], auth: none, fields: %s}\n"
            "routes:\n  - {path: /v1/models, audience: a}\n")
    with pytest.raises(PolicyError) as err:
        loads(base % text, source="p.yaml")
    assert "p.yaml:5" in str(err.value) and message in str(err.value)


# --- the real proxies ---------------------------------------------------------------------------

@pytest.fixture(params=["nginx", "nginx-debian", "nginx-lua", "envoy"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return proxy_named(request.param)


def _unknown_strip() -> Policy:
    policy = load_policy(None)
    inference = policy.audiences["inference"]
    return replace(policy, audiences={**policy.audiences, "inference": replace(
        inference, fields=replace(inference.fields, unknown="strip"))})


def test_field_rules_are_proved_through_the_proxy(tmp_path: Path, proxy: Proxy) -> None:
    res = probe_through(tmp_path, proxy, load_policy(None), CATALOG, OPTIONS)
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    fields = [c for c in res.coverage if c.subject.startswith("fields ")]
    assert fields and all(c.status == "proved" for c in fields), [c for c in fields if c.status != "proved"][:3]
    notes = {a.note for a in res.attempts}
    assert "a field the policy does not name" in notes
    assert any(n.startswith("every field the policy allows here") for n in notes)
    assert "forbidden field kv_transfer_params" in notes


def test_unknown_fields_stripped_are_proved_by_the_witness(tmp_path: Path) -> None:
    res = probe_through(tmp_path, proxy_named("envoy"), _unknown_strip(), CATALOG, OPTIONS)
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    stripped = decided([a for a in res.attempts if a.note == "a field the policy does not name, to be stripped"])
    assert stripped and all(a.verdict == "proved" and a.upstream is not None for a in stripped)
    for a in stripped:
        assert a.upstream is not None and a.upstream.body is not None
        assert "vp_probe_unknown_field" not in json.loads(a.upstream.body)


# nginx-lua: the same mutant (forbidden-field-check-removed, Lua's POST /classify) is caught in test_strip.py
@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_a_route_without_its_field_check_is_caught(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), load_policy(None), CATALOG, OPTIONS,
                        mutant="forbidden-field-check-removed")
    assert any(f.rule in ("VP005", "VP015") and "field" in (f.title + f.detail) for f in res.findings), \
        [(f.rule, f.title) for f in res.findings]


def _one_route_allows(plan: Plan, field: str) -> tuple[Plan, Decision]:
    """``plan`` with ``field`` allowed on one route that shares its rules with others (not the
    first of them): the weakening a reviewer makes by hand on one location."""
    rules = [d for d in sorted(plan.allowed, key=lambda d: (d.path, d.method))
             if d.fields.named.get(field) == "reject"]
    assert len(rules) > 1, "the bundled policy denies it on several routes"
    target = rules[-1]
    loose = replace(target, fields=replace(target.fields, named={**target.fields.named, field: "allow"}))
    return replace(plan, decisions=tuple(loose if d is target else d for d in plan.decisions)), target


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_a_denied_field_allowed_on_one_route_fails_the_run(tmp_path: Path, name: str) -> None:
    """Every field rule is proved on every route it applies to: allowing kv_transfer_params on one
    route only (the config generated from that plan, probed with the true one) exits 1 there."""
    proxy, inventory, port = proxy_named(name), load_ref(CATALOG), free_port()
    s = loop.setup(inventory, unpaced(load_policy(None)), tmp_path, port)
    weak, target = _one_route_allows(s.plan, "kv_transfer_params")
    directory = tmp_path / "proxy"
    proxy.write(weak, directory)
    with StandinThread(inventory, "127.0.0.1", port) as standin:
        res = loop.proxy_run(s, proxy, directory, OPTIONS, standin.url).result
    assert res.exit_code() == 1
    hit = [f for f in res.findings if f.rule == "VP005"]
    assert hit and all(f.path == target.path for f in hit), [(f.rule, f.path) for f in res.findings]
    assert any("kv_transfer_params" in e.note for f in hit for e in f.evidence), hit


def _post(client: httpx.Client, key: str, raw: bytes) -> httpx.Response:
    return client.post("/v1/chat/completions", content=raw,
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def test_tricky_keys_are_read_as_python_reads_them(tmp_path: Path, proxy: Proxy) -> None:
    """Escaped names, duplicates, names no header may carry: each decided as vLLM would read it."""
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, load_policy(None), tmp_path, port)
    directory = tmp_path / "proxy"
    proxy.write(s.plan, directory)
    key = next(c.secret for c in s.credentials if c.role == "user")
    cases = [
        (b'{"model":"m","kv\\u005ftransfer_params":{}}', 400, "forbidden-field:kv_transfer_params"),
        (b'{"model":"m","priority":1,"priority":null}', 400, "forbidden-field:priority"),
        (b'{"model":"m","vp_new_field":1}', 400, "unknown-field:vp_new_field"),
        (b'{"model":"m","bad\\nname":1}', 400, "unknown-field:not-a-plain-name"),
        (b'{"model":"m","messages":[],"max_tokens":5}', None, None),
    ]
    public = next(v for v in s.vantages if v.name == "public")      # the audience's network
    with ExitStack() as stack, StandinThread(inventory, "127.0.0.1", port), \
            httpx.Client(base_url=f"http://127.0.0.1:{s.plan.listen.port}", timeout=10,
                         transport=httpx.HTTPTransport(local_address=public.address)) as client:
        loop.start_checked(proxy, s.plan, directory, stack)
        for raw, status, reason in cases:
            r = _post(client, key, raw)
            if status is None:
                assert "x-perimeter-decision" not in r.headers, (raw, r.status_code, dict(r.headers))
            else:
                assert (r.status_code, r.headers.get("x-perimeter-reason")) == (status, reason), raw
