from pathlib import Path

import pytest

from scanner.errors import PlanError
from scanner.inventory.model import Inventory, Route, Source
from scanner.plan.build import build
from scanner.policy.load import load

REPO = Path(__file__).resolve().parents[2]


def _inventory() -> Inventory:
    routes = [
        Route("/v1/chat/completions", ("POST",), guarded=True),
        Route("/v1/responses/{response_id}", ("GET",), guarded=True),
        Route("/invocations", ("POST",)),
        Route("/pause", ("POST",)),
        Route("/health", ("GET",)),
        Route("/metrics", ("GET",)),
        Route("/metrics", ("*",), kind="mount"),
        Route("/docs", ("GET", "HEAD")),
        Route("/brand_new_route", ("POST",)),
    ]
    return Inventory(source=Source(kind="asgi", target="t:app"), routes=tuple(routes))


def test_default_policy_plan() -> None:
    policy = load(REPO / "policies" / "vllm-default.yaml")
    plan = build(_inventory(), policy, {"admin": ("127.0.0.3/32",)})
    chat = plan.decision("POST", "/v1/chat/completions")
    assert chat is not None and chat.allowed and chat.audience_kind == "end-user"
    assert chat.limits.json_caps["max_tokens"] == 4096 and chat.limits.body_bytes == 1048576
    pause = plan.decision("POST", "/pause")
    assert pause is not None and pause.allowed and pause.roles == ("operator",)
    assert pause.networks == ("127.0.0.3/32",) and pause.state_changing
    for method, path in [("POST", "/invocations"), ("GET", "/docs"), ("HEAD", "/docs"),
                         ("*", "/metrics"), ("POST", "/brand_new_route")]:
        d = plan.decision(method, path)
        assert d is not None and not d.allowed, (method, path)
    assert plan.uncovered == ("POST /brand_new_route",)
    assert "default deny" in (plan.decision("POST", "/brand_new_route") or chat).reason
    resp = plan.decision("GET", "/v1/responses/{response_id}")
    assert resp is not None and resp.regex.startswith("^/v1/responses/(?:")


def test_plan_is_deterministic() -> None:
    policy = load(REPO / "policies" / "vllm-default.yaml")
    a = build(_inventory(), policy).to_json()
    b = build(Inventory(source=Source(kind="asgi", target="t:app"),
                        routes=tuple(reversed(_inventory().routes))), policy).to_json()
    assert a == b


def test_unknown_network_override_is_an_error() -> None:
    policy = load(REPO / "policies" / "vllm-default.yaml")
    with pytest.raises(PlanError, match="no network 'admn'"):
        build(_inventory(), policy, {"admn": ("10.0.0.0/8",)})


@pytest.mark.parametrize(("old", "wrong"), [
    ("        - kv_transfer_params        # disaggregated", "kv_transfer_param"),
    ("counts: {stop: 16,", "stops"),
    ("allow: [add_generation_prompt,", "add_generaton_prompt"),
])
def test_a_field_name_no_request_model_has_is_a_plan_error_naming_the_line(old: str, wrong: str) -> None:
    """A misspelled field decides nothing (a denied one would pass under ``unknown: pass``)."""
    from scanner.inventory.catalog import load_ref
    from scanner.policy.load import loads

    text = (REPO / "policies" / "vllm-default.yaml").read_text()
    assert old in text
    right = wrong.replace("param", "params").replace("stops", "stop").replace("generaton", "generation")
    policy = loads(text.replace(old, old.replace(right, wrong)), source="p.yaml")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if old in t)
    with pytest.raises(PlanError, match=rf"^p\.yaml:{line}: audience 'inference' fields: {wrong}: no request model"):
        build(load_ref("vllm-0.29.0-default"), policy)
    # the bundled names, some of them fields of another vLLM version only, are all known
    for ref in ("vllm-0.28.0-default", "vllm-0.29.0-everything", "vllm-0.33.0-everything"):
        build(load_ref(ref), loads(text, source="p.yaml"))
    # an inventory that knows no request model cannot tell: not checked
    build(_inventory(), policy)
