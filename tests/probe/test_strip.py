"""A field the body policy strips is invisible in the answer: with a witness, a request allowed
at the limits is proven only if the upstream received its body as sent less the stripped fields
(scanner.probe.checks.limits.body_received), and a proxy that forwards the field is caught."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from scanner.plan.inputs import load_policy
from scanner.policy.model import Policy
from scanner.probe.checks.limits import body_received
from scanner.probe.interface import ProbeOptions, ProbeResult, WitnessRecord
from scanner.runtime.proxy import Proxy
from tests.probe.realproxy import decided, probe_through, proxy_named

CATALOG = "vllm-0.29.0-everything"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("limits",))
STRIP = {"cache_salt", "chat_template", "chat_template_kwargs"}


def _seen(body: bytes, text: bool = True) -> WitnessRecord:
    return WitnessRecord("POST", "/v1/chat/completions", body_bytes=len(body),
                    body_sha256=hashlib.sha256(body).hexdigest(), body=body.decode() if text else None)


def _want(sent: bytes) -> dict[str, object]:
    """What the plan says reaches the upstream: the body less the stripped fields."""
    return {k: v for k, v in json.loads(sent).items() if k not in STRIP}


def test_a_body_forwarded_as_sent_is_proved() -> None:
    sent = b'{"model": "m", "max_tokens": 4096}'
    assert body_received(sent, _seen(sent), _want(sent)) == ("proved", "")


def test_a_body_changed_on_the_way_fails() -> None:
    sent = b'{"max_tokens": 4096}'
    verdict, why = body_received(sent, _seen(b'{"max_tokens": 1}'), _want(sent))
    assert verdict == "failed" and "changed" in why


def test_a_stripped_field_removed_and_nothing_else_is_proved() -> None:
    sent = b'{"model": "m", "cache_salt": "probe-x1"}'
    assert body_received(sent, _seen(b'{"model":"m"}'), _want(sent)) == ("proved", "")


def test_a_stripped_field_that_reached_the_upstream_fails() -> None:
    sent = b'{"model": "m", "cache_salt": "probe-x1"}'
    verdict, why = body_received(sent, _seen(sent), _want(sent))
    assert verdict == "failed" and 'cache_salt: "probe-x1" reached the upstream, the plan says absent' in why


def test_stripping_more_than_the_policy_strips_fails() -> None:
    sent = b'{"model": "m", "cache_salt": "x"}'
    verdict, why = body_received(sent, _seen(b'{}'), _want(sent))
    assert verdict == "failed" and 'model: absent reached the upstream, the plan says "m"' in why


def test_a_stripped_field_the_witness_kept_no_text_of_is_not_proven() -> None:
    sent = b'{"model": "m", "cache_salt": "probe-x1"}'
    verdict, why = body_received(sent, _seen(b'{"model":"m"}', text=False), _want(sent))
    assert verdict == "inconclusive" and "64 KiB" in why


def test_an_injected_budget_is_proved_only_at_its_cap() -> None:
    sent = b'{"model": "m", "max_tokens": null}'
    want = {"model": "m", "max_completion_tokens": 4096}
    assert body_received(sent, _seen(b'{"model":"m","max_completion_tokens":4096}'), want) == ("proved", "")
    verdict, why = body_received(sent, _seen(sent), want)
    assert verdict == "failed" and "max_completion_tokens: absent reached the upstream, the plan says 4096" in why
    verdict, why = body_received(sent, _seen(b'{"model":"m","max_completion_tokens":99999}'), want)
    assert verdict == "failed" and "99999" in why


# --- through the real proxies ------------------------------------------------------------------

def _policy() -> Policy:
    policy = load_policy(None)
    return replace(policy, body=replace(policy.body, cache_salt="strip", chat_template="strip"))


def _probe(tmp_path: Path, proxy: Proxy, mutant: str = "") -> ProbeResult:
    return probe_through(tmp_path, proxy, _policy(), CATALOG, OPTIONS, mutant)


@pytest.fixture(params=["nginx", "nginx-lua", "envoy"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return proxy_named(request.param)


def test_the_generated_proxy_strips_and_it_is_proved(tmp_path: Path, proxy: Proxy) -> None:
    res = _probe(tmp_path, proxy)
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    fields = [c for c in res.coverage if c.subject.startswith("fields ")]
    assert fields and all(c.status == "proved" for c in fields), fields[:3]
    stripped = decided([a for a in res.attempts if a.note.startswith("field ") and a.note.endswith("to be stripped")])
    assert stripped and all(a.upstream is not None and a.verdict == "proved" for a in stripped)
    for a in stripped:
        assert a.upstream is not None and a.upstream.body is not None
        assert not STRIP & set(json.loads(a.upstream.body))


def test_a_route_that_forwards_the_stripped_fields_is_caught(tmp_path: Path, proxy: Proxy) -> None:
    res = _probe(tmp_path, proxy, mutant="forbidden-field-check-removed")
    caught = [f for f in res.findings if f.rule == "VP015"]
    assert caught, [(f.rule, f.title) for f in res.findings]
    assert "reached the upstream, the plan says absent" in caught[0].detail
