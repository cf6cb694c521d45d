"""The plan's zones from the bundled policy (Plan.zones), the limiter's zones file from them, a
route's zones, the local fallback's share (scanner/plan/zones.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.inventory.model import Inventory, Route, Source
from scanner.limiter import config
from scanner.plan import zones
from scanner.plan.build import build
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone
from scanner.policy.load import loads

REPO = Path(__file__).resolve().parents[2]


def plan():  # type: ignore[no-untyped-def]
    routes = (Route("/v1/chat/completions", ("POST",), guarded=True), Route("/v1/models", ("GET",), guarded=True),
              Route("/health", ("GET",)), Route("/pause", ("POST",)))
    text = (REPO / "policies" / "vllm-default.yaml").read_text(encoding="utf-8")
    text = text.replace("      concurrency: 16\n", "      concurrency: 16\n      tokens_per_minute: 200000\n", 1)
    return build(Inventory(source=Source(kind="asgi", target="t:app"), routes=routes),
                 loads(text, source="vllm-default.yaml", base_dir=REPO / "policies"))


def test_zones_file_from_the_bundled_policy() -> None:
    p = plan()
    cfg = config.LimiterConfig(zones=p.zones)
    chat = p.decision("POST", "/v1/chat/completions")
    assert chat is not None and chat.limits.rate is not None
    names = zones.route_zones(chat)
    assert names[0] == f"rate:{chat.rate_zone}" and all(n in cfg.zones for n in names)
    rate = cfg.zones[names[0]]
    assert rate == RateZone(names[0], rps=chat.limits.rate.rps, burst=chat.limits.rate.burst)
    for d in p.allowed:
        for n in zones.route_zones(d):
            zone = cfg.zones[n]
            if isinstance(zone, ConcurrencyZone):
                assert zone.limit == d.limits.concurrency
                assert zone.slot_ttl_s >= (d.limits.timeout_s or 0) + zones.SLOT_MARGIN_S
            if isinstance(zone, TokenZone):
                assert zone.per_minute == d.limits.tokens_per_minute
    # deterministic, and what the service reads back
    assert config.dumps(cfg) == config.dumps(config.LimiterConfig(zones=plan().zones))
    assert config.parse(cfg.to_json()) == cfg
    assert list(cfg.zones) == sorted(cfg.zones)
    assert {z.kind for z in cfg.zones.values()} == {"rate", "concurrency", "tokens"}
    assert names == (f"rate:{chat.rate_zone}", f"conc:{chat.conn_zone}", f"tokens:{chat.token_zone}")


def test_slot_ttl() -> None:
    assert zones.slot_ttl([300.0, 60.0]) == 310.0
    assert zones.slot_ttl([300.0, None]) == zones.UNTIMED_SLOT_S
    assert zones.slot_ttl([]) == zones.UNTIMED_SLOT_S


@pytest.mark.parametrize(("zone", "n", "share"), [
    (RateZone("r", 10, 20), 2, RateZone("r", 5, 9)),          # 21 at once -> 10 each (20 in sum)
    (RateZone("r", 10, 20), 3, RateZone("r", 10 / 3, 6)),     # 7 each, 21 in sum
    (RateZone("r", 1, 0), 2, RateZone("r", 0.5, 0)),          # 1 at once each: below N, 2 > 1
    (ConcurrencyZone("c", 5, 30), 2, ConcurrencyZone("c", 2, 30)),
    (TokenZone("t", 200001), 2, TokenZone("t", 100000)),    # no burst: per_minute, halved
    (TokenZone("t", 200001, 50001), 2, TokenZone("t", 100000, 25000)),
    (TokenZone("t", 60000, 60000), 3, TokenZone("t", 20000, 20000)),
    (TokenZone("t", 1), 4, TokenZone("t", 1)),
])
def test_local_share(zone: zones.Zone, n: int, share: zones.Zone) -> None:
    assert zones.local_share(zone, n) == share


def test_on_unavailable_in_the_zones_file() -> None:
    from scanner.errors import ConfigError

    base = {"version": 1, "zones": {"r": {"kind": "rate", "rps": 1, "burst": 0}}}
    assert config.parse(base).on_unavailable == "deny" and "on_unavailable" not in config.parse(base).to_json()
    local = config.parse({**base, "on_unavailable": "local"})
    assert local.on_unavailable == "local" and config.parse(local.to_json()) == local
    with pytest.raises(ConfigError, match="on_unavailable 'open' is not deny or local"):
        config.parse({**base, "on_unavailable": "open"})
