"""The forwarding forms of a route (scanner/probe/forms.py): one body per way the plan forwards a
request there, classified by the plan's body reference, so a fact carried by each way of
forwarding (a timeout, the upstream's 5xx replaced, the headers vLLM gets) is proven on each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.plan import body
from scanner.plan.inputs import load_policy
from scanner.plan.model import Plan
from scanner.policy.load import loads
from scanner.probe import forms
from scanner.verify import loop

CATALOG = "vllm-0.29.0-default"


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    return loop.setup(load_ref(CATALOG), load_policy(None), tmp_path_factory.mktemp("forms"), 9).plan


def _names(plan: Plan, method: str, path: str) -> list[str]:
    d = plan.decision(method, path)
    assert d is not None
    return [f.name for f in forms.of(d)]


def test_a_route_writing_a_budget_in_has_a_kept_and_a_rewritten_form(plan: Plan) -> None:
    assert _names(plan, "POST", "/v1/chat/completions") == ["kept", "rewritten"]
    assert _names(plan, "POST", "/v1/completions") == ["kept", "rewritten"]


def test_a_route_reading_bodies_without_rewriting_them_has_a_plain_and_a_kept_form(plan: Plan) -> None:
    assert _names(plan, "POST", "/tokenize") == ["plain", "kept"]


def test_a_route_whose_bodies_are_not_read_has_no_forms(plan: Plan) -> None:
    assert _names(plan, "GET", "/v1/models") == [] and _names(plan, "GET", "/health") == []


def test_each_form_is_admitted_and_forwarded_as_its_name_says(plan: Plan) -> None:
    seen = 0
    for d in plan.allowed:
        for f in forms.of(d):
            j = body.judge(d, f.body, salt=forms.PLACEHOLDER_SALT if d.salt else "")
            assert not j.refused, (d.path, f.name, j.reason)
            sent = json.loads(f.body)
            same = j.body is None or j.body == sent
            assert same == (f.name != "rewritten"), (d.path, f.name, j.body)
            assert (f.name == "plain") == (sent == {}) or f.name == "rewritten", (d.path, f.name)
            seen += 1
    assert seen > 20


def test_a_stripped_field_makes_a_rewritten_form(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "policies/vllm-default.yaml").read_text()
    assert " use_beam_search, user, " in text
    text = text.replace(" use_beam_search, user, ", " use_beam_search, ", 1)
    text = text.replace("      allow: [add_generation_prompt,", "      strip: [user]\n      allow: [add_generation_prompt,", 1)
    p = loop.setup(load_ref(CATALOG), loads(text), tmp_path, 9).plan
    d = next(x for x in p.allowed if x.fields.names("strip") == ("user",) and x.enforced_budget is None)
    shapes = {f.name: json.loads(f.body) for f in forms.of(d)}
    assert list(shapes) == ["plain", "kept", "rewritten"] and shapes["rewritten"].get("user") == 1, shapes
