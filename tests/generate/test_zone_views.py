"""Both generators render the plan's zones (scanner.plan.zones, Plan.zones / Plan.own_zones): each
NGINX zone and each Envoy local filter is a view of one plan zone (the plan's own without a fleet,
its per-proxy share under shared: local, none under deny), never a second statement of its values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from scanner.generate import envoy_model, nginx_model, shared
from scanner.generate.interface import GenerateOptions
from scanner.inventory.model import Inventory, Route, Source
from scanner.limiter import config as limiter_config
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone, Zone
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
OPTIONS = GenerateOptions(runtime_dir="/run/p", output_dir="/run/p", access_log="/run/p/a.log", error_log="/run/p/e.log")


def _plan(section: str) -> Plan:
    text = BASE.replace("      concurrency: 16\n", "      concurrency: 16\n      tokens_per_minute: 60000\n", 1)
    return build(INVENTORY, loads(text + ("\nshared:\n" + section if section else ""), source="p.yaml"))


def _of(zones: Mapping[str, Zone], kind: type) -> set[Zone]:
    return {z for z in zones.values() if isinstance(z, kind)}


@pytest.mark.parametrize("section", ["", "  redis: redis://127.0.0.1:6379/0\n  replicas: 2\n  on_unavailable: local\n",
                                    "  redis: redis://127.0.0.1:6379/0\n  on_unavailable: deny\n"])
def test_each_local_limit_is_a_view_of_one_plan_zone(section: str) -> None:
    plan = _plan(section)
    own = plan.own_zones
    if not section:
        assert own == plan.zones
    elif "local" in section:
        assert plan.shared is not None and own == plan.shared.local and own != plan.zones
    else:
        assert own == {}
    nginx = nginx_model.build_model(plan, OPTIONS)
    assert {v.zone for v in nginx.rate_zones} == _of(own, RateZone)
    assert {v.zone for v in nginx.conn_zones} == _of(own, ConcurrencyZone)
    envoy = envoy_model.build_model(plan, OPTIONS)
    assert {f.zone for f in envoy.rate_filters} == _of(own, RateZone)
    assert {f.zone for f in envoy.token_filters} == _of(own, TokenZone)
    # njs's token zones: the plan's own (the body check's token spec: the cost it computes, charged
    # by njs without a fleet, sent to the limiter with one) and, under local, the shares
    assert {v.zone for v in nginx.token_zones} == _of(plan.zones, TokenZone) | _of(own, TokenZone)
    # the rendered values are the zone's
    for v in nginx.rate_zones:
        assert isinstance(v.zone, RateZone) and v.rate == nginx_model._rate(v.zone.rps) and v.burst == v.zone.burst
    for v in nginx.conn_zones:
        assert isinstance(v.zone, ConcurrencyZone) and v.limit == v.zone.limit and v.rate == ""
    for f in envoy.rate_filters:
        assert f.bucket == envoy_model.bucket(f.zone)
    for t in envoy.token_filters:
        assert (t.limit, t.burst) == (t.zone.per_minute, t.zone.burst)


def test_a_zone_view_renders_its_zone() -> None:
    rate = nginx_model.NginxZoneView("perimeter_rate_1", "$perimeter_principal", RateZone("rate:a", 0.5, 3))
    assert (rate.rate, rate.burst, rate.limit, rate.tokens) == ("30r/m", 3, 0, 0)
    slots = nginx_model.NginxZoneView("perimeter_conn_1", "$binary_remote_addr", ConcurrencyZone("conc:a", 4, 60.0))
    assert (slots.rate, slots.burst, slots.limit, slots.tokens) == ("", 0, 4, 0)
    tokens = nginx_model.NginxZoneView("t1", "principal", TokenZone("tokens:a", 1200, 300))
    assert (tokens.rate, tokens.burst, tokens.limit, tokens.tokens) == ("", 300, 0, 1200)
    b = envoy_model.bucket(RateZone("rate:a", 0.5, 3))
    assert (b.max_tokens, b.tokens_per_fill, b.fill_interval) == (3, 1, "2s")


def test_the_limiters_zones_file_holds_the_plans_zones() -> None:
    """limiter-zones.json (scanner.generate.shared) is the plan's zones with the fleet's domain,
    failure policy and outage waits; a lease only when the plan sets one (the limiter's default)."""
    plan = _plan("  redis: redis://127.0.0.1:6379/0\n  replicas: 2\n  on_unavailable: local\n")
    s = plan.shared
    assert s is not None and s.local_after_s
    read = limiter_config.parse(json.loads(shared.files(plan)[0].content))
    assert (read.zones, read.domain, read.on_unavailable, read.local_after_s, read.slot_lease_s) == (
        plan.zones, s.domain, "local", s.local_after_s, limiter_config.SLOT_LEASE_S)
    leased = replace(plan, shared=replace(s, slot_lease_s=3.0))
    assert limiter_config.parse(json.loads(shared.files(leased)[0].content)).slot_lease_s == 3.0
