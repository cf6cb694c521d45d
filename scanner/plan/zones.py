"""The zones file from a plan (what ``generate`` will write beside the proxy configs), the zones
of one route in the order the limiter takes them, and the ``local`` fallback's per-replica share.

Zone names are the plan's own zone families (Decision.rate_zone, conn_zone, token_zone), each
prefixed with its kind (``rate:``, ``conc:``, ``tokens:``) so no two kinds can share a name.
A concurrency slot lives as long as the longest request of its zone may run: the largest
``timeout_s`` of its routes plus :data:`SLOT_MARGIN_S`; a zone with a route without timeout gets
:data:`UNTIMED_SLOT_S` (a proxy that dies holding a slot leaks it that long, not forever).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scanner.limiter.config import (
    DEFAULT_DOMAIN,
    ConcurrencyZone,
    LimiterConfig,
    RateZone,
    TokenZone,
    Zone,
)
from scanner.plan.model import Plan, conc_name, rate_name, route_zones, tokens_name

__all__ = ["conc_name", "from_plan", "local_share", "rate_name", "route_zones", "slot_ttl", "tokens_name"]

SLOT_MARGIN_S = 10.0
UNTIMED_SLOT_S = 3600.0


def from_plan(plan: Plan, domain: str = DEFAULT_DOMAIN) -> LimiterConfig:
    """Every zone of the plan's allowed routes (HTTP and gRPC); deterministic (sorted by name)."""
    allowed = [d for d in (*plan.decisions, *(plan.grpc.decisions if plan.grpc else ())) if d.allowed]
    zones: dict[str, Zone] = {}
    for d in allowed:
        rate = d.limits.rate
        if rate is not None and d.rate_zone:
            zones[rate_name(d)] = RateZone(rate_name(d), rps=rate.rps, burst=rate.burst)
        if d.limits.tokens_per_minute and d.token_zone:
            zones[tokens_name(d)] = TokenZone(tokens_name(d), per_minute=d.limits.tokens_per_minute,
                                              burst=d.token_capacity)
    for name in sorted({conc_name(d) for d in allowed if d.conn_zone}):
        members = [d for d in allowed if conc_name(d) == name]
        zones[name] = ConcurrencyZone(name, limit=members[0].limits.concurrency or 1,
                                      slot_ttl_s=slot_ttl([d.limits.timeout_s for d in members]))
    return LimiterConfig(zones=dict(sorted(zones.items())), domain=domain)


def slot_ttl(timeouts: Iterable[float | None]) -> float:
    values = list(timeouts)
    if not values or any(t is None for t in values):
        return UNTIMED_SLOT_S
    return min(UNTIMED_SLOT_S, max(t for t in values if t is not None) + SLOT_MARGIN_S)


def local_share(zone: Zone, replicas: int) -> Zone:
    """What one of ``replicas`` proxies enforces on its own under ``on_unavailable: local``: each
    value divided by the replica count and rounded down, so the fleet admits no more than the
    policy: rps / N; burst + 1 at once becomes floor((burst + 1) / N); concurrency,
    tokens_per_minute and the token bucket's capacity floor(x / N). Each is at least what one
    proxy can express (1 request at once, 1 slot, 1 token): only a policy value below N gives the
    fleet more than the policy."""
    n = max(1, replicas)
    if isinstance(zone, RateZone):
        return RateZone(zone.name, rps=zone.rps / n, burst=max(0, (zone.burst + 1) // n - 1))
    if isinstance(zone, ConcurrencyZone):
        return ConcurrencyZone(zone.name, limit=max(1, zone.limit // n), slot_ttl_s=zone.slot_ttl_s)
    return TokenZone(zone.name, per_minute=max(1, math.floor(zone.per_minute / n)),
                     burst=max(1, math.floor(zone.burst / n)))


def local_after(zone: Zone, replicas: int) -> float:
    """How long an outage must last before ``zone``'s requests go to the local shares: what the
    ``replicas`` shares hand out at once (each starts full: NGINX's limit_req and njs dict, Envoy's
    local_ratelimit cannot start empty) over the policy's rate, so the fleet's local burst is no
    more than the policy refilled meanwhile (rate: ``N * floor((burst + 1) / N) / rps``; tokens:
    ``N * floor(burst / N) / (per_minute / 60)``, about 60 x burst / per_minute s). 0 for
    concurrency (slots are not a rate). Rounded up to the millisecond."""
    share = local_share(zone, replicas)
    n = max(1, replicas)
    if isinstance(zone, RateZone) and isinstance(share, RateZone):
        at_once = n * (share.burst + 1)
    elif isinstance(zone, TokenZone) and isinstance(share, TokenZone):
        at_once = n * share.burst
    else:
        return 0.0
    return math.ceil(at_once / zone.per_second * 1000) / 1000
