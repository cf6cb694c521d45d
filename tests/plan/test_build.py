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
