"""The plan decides the fleet's shared limits once: which zones are shared (every rate,
concurrency and token-budget zone), and each zone's per-proxy share for on_unavailable: local."""

from pathlib import Path

import pytest

from scanner.errors import PlanError
from scanner.inventory.model import Inventory, Route, Source
from scanner.plan.build import build
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone
from scanner.policy.load import loads

REPO = Path(__file__).resolve().parents[2]
BASE = (REPO / "policies" / "vllm-default.yaml").read_text()
INVENTORY = Inventory(source=Source(kind="asgi", target="t:app"), routes=(
    Route("/v1/chat/completions", ("POST",), guarded=True),
    Route("/v1/models", ("GET",), guarded=True),
    Route("/pause", ("POST",)),
    Route("/health", ("GET",)),
    Route("/metrics", ("GET",)),
))


def _plan(shared: str, extra: str = ""):  # type: ignore[no-untyped-def]
    text = BASE.replace("      concurrency: 16\n", "      concurrency: 16\n      tokens_per_minute: 60000\n", 1)
    return build(INVENTORY, loads(text + extra + ("\nshared:\n" + shared if shared else ""), source="p.yaml"))


def test_every_zone_of_the_plan_is_shared_with_its_local_share() -> None:
    plan = _plan("  redis: redis://127.0.0.1:6379/0\n  replicas: 2\n  on_unavailable: local\n")
    s = plan.shared
    assert s is not None and s.replicas == 2 and s.on_unavailable == "local"
    zones = s.zones
    assert zones == plan.zones   # the plan's zones (Plan.zones), not a second statement of them
    assert zones["rate:inference:key:10/20"] == RateZone("rate:inference:key:10/20", rps=10, burst=20)
    assert zones["conc:inference:key:16"].kind == "concurrency"
    assert zones["tokens:inference:key:60000t/m/15000"] == TokenZone("tokens:inference:key:60000t/m/15000", 60000, 15000)
    assert "rate:monitoring:none:20/40" in zones and "rate:operator:key:2/5" in zones
    # every zone a decision names is in the limiter's file; nothing else is
    named = {z for d in plan.allowed for z in s.route_zones(d)}
    assert named == set(zones)
    chat = plan.decision("POST", "/v1/chat/completions")
    assert chat is not None
    assert s.route_zones(chat) == ("rate:inference:key:10/20", "conc:inference:key:16",
                                   "tokens:inference:key:60000t/m/15000")
    # the local share: each value divided by the replicas (rate: burst + 1 at once, halved)
    assert s.local["rate:inference:key:10/20"] == RateZone("rate:inference:key:10/20", rps=5, burst=9)
    assert s.local["conc:inference:key:16"] == ConcurrencyZone("conc:inference:key:16", 8,
                                                               zones["conc:inference:key:16"].slot_ttl_s)  # type: ignore[union-attr]
    assert s.local["tokens:inference:key:60000t/m/15000"] == TokenZone("tokens:inference:key:60000t/m/15000",
                                                                       30000, 7500)
    # what each proxy keeps on its own (both generators render it): the shares under local
    assert plan.own_zones == s.local and set(s.local) == set(zones)
    doc = plan.body_dict()["shared"]
    assert doc["zones"]["conc:inference:key:16"]["local"]["limit"] == 8
    assert doc["limiter"] == "127.0.0.1:8081" and doc["domain"] == "vllm-perimeter"


def test_without_shared_the_plan_is_unchanged() -> None:
    plan = _plan("")
    assert plan.shared is None and "shared" not in plan.body_dict()
    # each proxy keeps every zone of the plan itself; under deny, none (the limiter's alone)
    assert plan.own_zones == plan.zones and "rate:inference:key:10/20" in plan.zones
    deny = _plan("  redis: redis://127.0.0.1:6379/0\n")
    assert deny.own_zones == {} and deny.shared is not None and deny.shared.zones == plan.zones


def test_the_plan_is_deterministic() -> None:
    a = _plan("  redis: redis://127.0.0.1:6379/0\n").to_json()
    assert a == _plan("  redis: redis://127.0.0.1:6379/0\n").to_json()
    assert '"shared"' in a


def test_local_fallback_that_cannot_divide_a_zone_is_a_plan_error() -> None:
    # operator: concurrency 2 over 3 replicas: each proxy would still admit 1, the fleet 3
    with pytest.raises(PlanError) as err:
        _plan("  redis: redis://127.0.0.1:6379/0\n  replicas: 3\n  on_unavailable: local\n")
    text = str(err.value)
    assert "cannot divide zone conc:operator:key:2" in text and "\n" not in text
    # deny never divides: the same fleet is a valid plan
    assert _plan("  redis: redis://127.0.0.1:6379/0\n  replicas: 3\n").shared is not None
