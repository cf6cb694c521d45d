"""The rule program (scanner/plan/program.py): the compiled form of the bundled policy is its golden
(tests/plan/golden/, regenerate with VLLM_PERIMETER_UPDATE_GOLDENS=1), it holds to the published
schema, and the Python interpreter (scanner/plan/interpret.py) runs each instruction as the
program's table says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scanner import documents
from scanner.plan import interpret
from scanner.plan.inputs import make_plan
from scanner.plan.program import compile_plan
from scanner.rules import (
    AskUsage,
    BudgetStep,
    Cap,
    Count,
    EnvelopeStep,
    Keys,
    Media,
    PinStep,
    Program,
    Salt,
    Values,
)

GOLDEN = Path(__file__).parent / "golden"
CATALOGS = ("vllm-0.29.0-everything", "vllm-0.33.0-everything")


@pytest.mark.parametrize("catalog", CATALOGS)
def test_the_bundled_policy_compiles_to_its_golden(catalog: str) -> None:
    doc = compile_plan(make_plan(catalog, None).decisions)
    text = json.dumps(doc.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
    path = GOLDEN / f"rule-program-{catalog}.json"
    if os.environ.get("VLLM_PERIMETER_UPDATE_GOLDENS"):
        path.write_text(text)
    assert path.read_text() == text, f"{path.name} differs: VLLM_PERIMETER_UPDATE_GOLDENS=1 to accept"
    documents.validate("rule-program", json.loads(text), path.name)
    ops = {s["op"] for p in json.loads(text)["programs"].values() for s in p["steps"]}
    assert {"cap", "keys", "media", "budget", "envelope"} <= ops, ops


def _run(*steps: object, body: dict[str, object], size: int = 100, salt: str = "") -> tuple[str, object]:
    r = interpret.Run(body, size, salt)
    return interpret.run(Program(steps=list(steps)), r)  # type: ignore[arg-type]


@pytest.mark.parametrize(("steps", "body", "want"), [
    ((Cap(path="n", max=4),), {"n": " 4 "}, ""),
    ((Cap(path="n", max=4),), {"n": "5"}, "json-cap:n"),
    ((Cap(path="sampling_params.n", max=4),), {"sampling_params": {"n": 5.0}}, "json-cap:sampling_params.n"),
    ((Keys(unknown="reject", modes={"model": "allow", "x": "reject"}),), {"model": "m", "x": 1}, "forbidden-field:x"),
    ((Keys(unknown="reject", modes={"model": "allow"}),), {"model": "m", "a b": 1}, "unknown-field:not-a-plain-name"),
    ((Count(field="stop", max=2),), {"stop": ["a", "b", "c"]}, "json-cap:stop:count-over-2"),
    ((Values(field="service_tier", values=["auto", 1]),), {"service_tier": "auto"}, ""),
    ((Values(field="service_tier", values=["auto", 1]),), {"service_tier": None}, ""),
    ((Values(field="service_tier", values=["auto", 1]),), {"service_tier": 1.0}, ""),
    ((Values(field="service_tier", values=["auto", 1]),), {"service_tier": "1"}, "json-cap:service_tier:not-listed"),
    ((Values(field="service_tier", values=["auto", 1]),), {"service_tier": True}, "json-cap:service_tier:not-listed"),
    ((Media(urls="deny"),), {"messages": [{"image_url": {"url": "https://x.test/a.png"}}]}, "media-url:denied"),
    ((BudgetStep(fields=["max_tokens"], field="max_tokens", absent="reject", cap=0),), {"model": "m"},
     "json-cap:max_tokens:absent"),
    ((Salt(),), {"model": "m"}, "bad-request:no-salt"),
    ((EnvelopeStep(items=[("prompt", "prompts")], per=["n"], out=["max_tokens"], rest=10, max_sequences=3),),
     {"prompt": ["a", "b"], "n": 2}, "envelope-sequences:over-3"),
    ((EnvelopeStep(out=["max_tokens"], rest=10, max_tokens=150),), {"max_tokens": 60}, "envelope-tokens:over-150"),
])
def test_each_instruction_refuses_as_its_table_says(steps: tuple[object, ...], body: dict[str, object],
                                                    want: str) -> None:
    why, out = _run(*steps, body=body)
    assert why == want
    assert (out is None) == bool(want)


def test_steps_share_one_working_body_in_program_order() -> None:
    # the stripped budget field is gone for the budget step, which writes the cap; the pin is what
    # the envelope reads; the salt and the usage request are written
    steps = (Keys(unknown="strip", modes={"model": "allow", "stream": "allow", "n": "allow"}),
             BudgetStep(fields=["max_tokens"], field="max_tokens", absent="inject", cap=50, window=0),
             Salt(), PinStep(field="n", value=1),
             EnvelopeStep(per=["n"], out=["max_tokens"], rest=999, max_tokens=10_000), AskUsage())
    r = interpret.Run({"model": "m", "max_tokens": 4000, "n": 8, "stream": True}, 120, "s1")
    why, out = interpret.run(Program(steps=list(steps)), r)
    assert why == ""
    assert out == {"model": "m", "n": 1, "stream": True, "max_tokens": 50, "cache_salt": "s1",
                   "stream_options": {"include_usage": True}}
    assert (r.sequences, r.output, r.tokens) == (1, 50, 170)


def test_a_budget_fitted_into_the_window_and_none_below_one() -> None:
    step = BudgetStep(fields=["max_tokens"], field="max_tokens", absent="inject", cap=500, window=1000)
    assert _run(step, body={}, size=800)[1] == {"max_tokens": 200}
    assert _run(step, body={}, size=1000)[1] == {}


def test_the_whitespace_tables_both_runtimes_get_are_generated_from_vllm_json() -> None:
    # njs's INT_WS class and Lua's WS table are written from WHITESPACE by the generators
    import re

    from scanner.generate.nginx import njs_module
    from scanner.plan.vllm_json import WHITESPACE, js_whitespace_class, utf8_whitespace
    from scanner.resources import data_file

    cls = re.compile(js_whitespace_class())
    assert {chr(c) for c in range(0x3100) if cls.fullmatch(chr(c))} == set(WHITESPACE)
    assert {w.decode() for w in utf8_whitespace()} == set(WHITESPACE) and len(WHITESPACE) == 25
    njs = njs_module((Path(data_file("templates", "nginx-perimeter.js"))).read_text(encoding="utf-8"))
    assert f"var INT_WS = /^{js_whitespace_class()}+|" in njs and "var INT_WS = null" not in njs
    golden = (Path(__file__).parent.parent / "generate/golden/envoy/default/envoy.yaml").read_text()
    table = next(line for line in golden.splitlines() if "local WS = {" in line)
    assert table.count("] = true") == len(WHITESPACE) and '["\\227\\128\\128"]' in table   # U+3000


def test_the_envelope_is_the_program_s_so_a_stripped_multiplier_counts_nothing(tmp_path: Path) -> None:
    """The admitted envelope (the probe's expected cost and refusals, scanner.plan.body.envelope)
    is what the route's program computes, not a second reading of the body as sent: with ``n``
    stripped and max_sequences 2, a body with n = 4 is 1 sequence, admitted, and charged what
    1 x its output (the Decision used to count the stripped n: 4 sequences, refused)."""
    from scanner.plan import body as plan_body

    text = (Path(__file__).resolve().parents[2] / "policies" / "vllm-default.yaml").read_text()
    text = text.replace("      max_sequences: 16\n", "      max_sequences: 2\n", 1)
    text = text.replace("      allow: [add_generation_prompt", "      strip: [n]\n      allow: [add_generation_prompt", 1)
    text = text.replace("min_p, min_tokens, model, n,", "min_p, min_tokens, model,", 1)
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    plan = make_plan("vllm-0.29.0-default", str(policy))
    d = next(d for d in plan.allowed if (d.method, d.path) == ("POST", "/v1/chat/completions"))
    assert d.fields.named.get("n") == "strip" and d.limits.max_sequences == 2
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 4,
                      "max_tokens": 10}).encode()
    env = plan_body.envelope(d, raw)
    judged = plan_body.judge(d, raw)
    assert (env.sequences, env.output) == (1, 10) and plan_body.envelope_refusal(d, raw) == ""
    assert not judged.refused and judged.body is not None and "n" not in judged.body
    assert plan_body.token_cost(d, raw) == 10 + len(raw)     # 1 sequence x 10 + the bytes sent
    comp = next(d for d in plan.allowed if (d.method, d.path) == ("POST", "/v1/completions"))
    three = json.dumps({"model": "m", "prompt": ["a", "b", "c"], "n": 4, "max_tokens": 10}).encode()
    assert plan_body.envelope(comp, three).sequences == 3             # 3 prompts x 1 (n stripped)
    assert plan_body.envelope_refusal(comp, three) == plan_body.judge(comp, three).reason == "envelope-sequences:over-2"
