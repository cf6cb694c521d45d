"""JSON caps, multipliers and the output budget at nested positions of a request model (the
inventory's dotted paths through object members): POST /inference/v1/generate reads n and
max_tokens inside sampling_params. The reference judge and Decision.envelope read them there."""

from __future__ import annotations

import json

import pytest

from scanner.inventory.catalog import load_ref
from scanner.plan import body as plan_body
from scanner.plan.body import judge, violations
from scanner.plan.build import build
from scanner.plan.envelope import member_paths
from scanner.plan.inputs import load_policy
from scanner.plan.model import Decision

GEN = "/inference/v1/generate"


@pytest.fixture(scope="module")
def gen() -> Decision:
    d = build(load_ref("vllm-0.29.0-default"), load_policy(None)).decision("POST", GEN)
    assert d is not None and d.allowed
    return d


def _raw(sp: object, **top: object) -> bytes:
    return json.dumps({"token_ids": [1, 2], **top, **({} if sp is ... else {"sampling_params": sp})}).encode()


def test_the_plan_reads_the_nested_positions_from_the_inventory(gen: Decision) -> None:
    assert member_paths(("a.b", "a[]", "a.*", "a[].b", "x", "a.b.c")) == ("a.b", "a.b.c")
    caps = dict(gen.cap_paths)
    assert caps["sampling_params.n"] == caps["n"] == 8 and caps["sampling_params.max_tokens"] == 8192
    assert "sampling_params.logprobs" not in caps   # not capped on the service audience
    assert gen.envelope_spec.per_item == ("sampling_params.n",)
    assert gen.budget is not None and gen.budget.fields == ("sampling_params.max_tokens",)
    assert gen.to_dict()["limits"]["cap_paths"]["sampling_params.n"] == 8


@pytest.mark.parametrize(("sp", "reason"), [
    ({"n": 9}, "json-cap:sampling_params.n"), ({"n": "9"}, "json-cap:sampling_params.n"),
    ({"n": 9.0}, "json-cap:sampling_params.n"), ({"n": [9]}, "json-cap:sampling_params.n"),
    ({"max_tokens": 8193}, "json-cap:sampling_params.max_tokens"), ({"n": 8, "max_tokens": 8192}, ""),
    ({"n": None}, ""), ({"structured_outputs": {"n": 9}}, ""), ({"n": " 8 "}, ""),
])
def test_caps_hold_at_the_nested_position(gen: Decision, sp: object, reason: str) -> None:
    j = judge(gen, _raw(sp), "salt")
    assert j.reason == reason, j


def test_the_budget_is_written_into_sampling_params(gen: Decision) -> None:
    for sp in ({}, {"max_tokens": None}, {"n": 2, "max_tokens": None}):
        body = judge(gen, _raw(sp), "salt").body
        assert body is not None and body["sampling_params"] == {**sp, "max_tokens": 8192}, body
        assert not violations(gen, body, "salt")
    # no object to write it into: forwarded as sent (vLLM refuses it), not flagged
    for raw in (_raw(...), _raw(None), _raw("x")):
        j = judge(gen, raw, "salt")
        assert not j.refused and j.body == json.loads(raw) and not violations(gen, j.body, "salt")
    assert violations(gen, {"token_ids": [1], "sampling_params": {}}, "salt")


def test_the_envelope_counts_nested_n_and_max_tokens(gen: Decision) -> None:
    env = plan_body.envelope(gen, _raw({"n": 8, "max_tokens": 8192}))
    assert (env.sequences, env.output) == (8, 8192)
    assert plan_body.token_cost(gen, _raw({"n": 8, "max_tokens": 8192})) == 8 * 8192 + len(_raw({"n": 8, "max_tokens": 8192}))
    assert plan_body.envelope(gen, _raw({})).output == 8192           # absent: the cap written in
    assert plan_body.envelope(gen, b'{"token_ids": [1], "sampling_params": {"n": 1, "n": 3}}').sequences == 3   # the last
    assert plan_body.envelope(gen, _raw(..., n=8)).sequences == 1      # a top-level n is not generate's
