"""The plan's limiter zones: one model, made once from the plan's decisions (``Plan.zones``).

A zone is a family of buckets or slots, one per principal (or client address for ``auth: none``),
of one kind:

* ``rate``        :class:`RateZone`: ``burst + 1`` requests at once, refilled at ``rps`` a second;
* ``concurrency`` :class:`ConcurrencyZone`: at most ``limit`` requests in flight;
* ``tokens``      :class:`TokenZone`: a bucket of ``burst`` tokens refilled at ``per_minute / 60``
  a second.

Zone names are the plan's own zone families (Decision.rate_zone, conn_zone, token_zone), each
prefixed with its kind (``rate:``, ``conc:``, ``tokens:``) so no two kinds can share a name.
A concurrency slot lives as long as the longest request of its zone may run: the largest
``timeout_s`` of its routes plus :data:`SLOT_MARGIN_S`; a zone with a route without timeout gets
:data:`UNTIMED_SLOT_S` (a proxy that dies holding a slot leaks it that long, not forever).

Who reads them: the shared limiter (scanner.limiter: its zones file is these zones, written by
``generate``), both generators (NGINX's ``limit_req_zone`` / ``limit_conn_zone`` and njs token
dicts, Envoy's ``local_ratelimit`` filters and circuit-breaking clusters are views of a zone),
and the fleet's ``local`` fallback (:func:`local_share`, :func:`local_after`: a zone per replica).
This module imports nothing of the plan at run time, so the plan's model and the limiter both
read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from scanner.plan.model import Decision

ZoneKind = Literal["rate", "concurrency", "tokens"]
ZONE_KINDS: tuple[ZoneKind, ...] = ("rate", "concurrency", "tokens")
# the Envoy rate limit domain the limiter answers for (the zones file's ``domain``)
DEFAULT_DOMAIN = "vllm-perimeter"
SLOT_MARGIN_S = 10.0
UNTIMED_SLOT_S = 3600.0


@dataclass(frozen=True)
class RateZone:
    """A token bucket of ``burst + 1`` requests refilled at ``rps`` a second (NGINX ``limit_req``
    with ``burst`` and ``nodelay``: burst + 1 at once from idle, then the rate)."""

    name: str
    rps: float
    burst: int
    kind: Literal["rate"] = "rate"

    @property
    def capacity(self) -> float:
        return float(self.burst + 1)

    @property
    def per_second(self) -> float:
        return self.rps


@dataclass(frozen=True)
class ConcurrencyZone:
    """At most ``limit`` live slots per key; a slot not released expires after ``slot_ttl_s``."""

    name: str
    limit: int
    slot_ttl_s: float
    kind: Literal["concurrency"] = "concurrency"


@dataclass(frozen=True)
class TokenZone:
    """A bucket of ``burst`` tokens refilled continuously at ``per_minute / 60`` a second (Envoy's
    local_ratelimit bucket with max_tokens = burst, tokens_per_fill = per_minute, fill_interval
    60 s): at most burst + per_minute x t / 60 in any t seconds. ``burst`` is the plan's decided
    capacity (Decision.token_capacity); 0 (a hand-written zones file without one): per_minute."""

    name: str
    per_minute: int
    burst: int = 0
    kind: Literal["tokens"] = "tokens"

    def __post_init__(self) -> None:
        if self.burst <= 0:
            object.__setattr__(self, "burst", self.per_minute)

    @property
    def capacity(self) -> float:
        return float(self.burst)

    @property
    def per_second(self) -> float:
        return self.per_minute / 60.0


Zone = RateZone | ConcurrencyZone | TokenZone


def zone_json(z: Zone) -> dict[str, object]:
    """A zone's entry in the zones file and in the plan's JSON (its name is the key)."""
    if isinstance(z, RateZone):
        return {"kind": z.kind, "rps": z.rps, "burst": z.burst}
    if isinstance(z, ConcurrencyZone):
        return {"kind": z.kind, "limit": z.limit, "slot_ttl_s": z.slot_ttl_s}
    return {"kind": z.kind, "per_minute": z.per_minute, "burst": z.burst}


# --- a decision's zones ---------------------------------------------------------------------

def rate_name(d: Decision) -> str:
    """The zone of ``d``'s rate (its kind prefixed: no two kinds share a name); "" none."""
    return f"rate:{d.rate_zone}" if d.rate_zone else ""


def conc_name(d: Decision) -> str:
    return f"conc:{d.conn_zone}" if d.conn_zone else ""


def tokens_name(d: Decision) -> str:
    return f"tokens:{d.token_zone}" if d.token_zone else ""


def route_zones(d: Decision) -> tuple[str, ...]:
    """The zones a request of ``d`` is taken through, in the limiter's order: rate, then
    concurrency, then tokens (scanner.limiter.decide.acquire)."""
    return tuple(n for n in (rate_name(d), conc_name(d), tokens_name(d)) if n)


def rate_of(zones: Mapping[str, Zone], d: Decision) -> RateZone | None:
    """``d``'s rate zone among ``zones`` (the plan's, or a proxy's shares); None without one."""
    z = zones.get(rate_name(d)) if d.rate_zone else None
    return z if isinstance(z, RateZone) else None


def conc_of(zones: Mapping[str, Zone], d: Decision) -> ConcurrencyZone | None:
    z = zones.get(conc_name(d)) if d.conn_zone else None
    return z if isinstance(z, ConcurrencyZone) else None


def tokens_of(zones: Mapping[str, Zone], d: Decision) -> TokenZone | None:
    z = zones.get(tokens_name(d)) if d.token_zone else None
    return z if isinstance(z, TokenZone) else None


def of_decisions(decisions: Iterable[Decision]) -> dict[str, Zone]:
    """Every zone of the allowed ``decisions``, sorted by name (Plan.zones). A zone's values are
    those of the first decision naming it (a name states its values: ``audience:auth:values``)."""
    allowed = [d for d in decisions if d.allowed]
    zones: dict[str, Zone] = {}
    for d in allowed:
        rate = d.limits.rate
        if rate is not None and d.rate_zone:
            zones.setdefault(rate_name(d), RateZone(rate_name(d), rps=rate.rps, burst=rate.burst))
        if d.limits.tokens_per_minute and d.token_zone:
            zones.setdefault(tokens_name(d), TokenZone(tokens_name(d), per_minute=d.limits.tokens_per_minute,
                                                       burst=d.token_capacity))
    for name in sorted({conc_name(d) for d in allowed if d.conn_zone}):
        members = [d for d in allowed if conc_name(d) == name]
        zones[name] = ConcurrencyZone(name, limit=members[0].limits.concurrency or 1,
                                      slot_ttl_s=slot_ttl([d.limits.timeout_s for d in members]))
    return dict(sorted(zones.items()))


def slot_ttl(timeouts: Iterable[float | None]) -> float:
    values = list(timeouts)
    if not values or any(t is None for t in values):
        return UNTIMED_SLOT_S
    return min(UNTIMED_SLOT_S, max(t for t in values if t is not None) + SLOT_MARGIN_S)


# --- the fleet's local fallback -------------------------------------------------------------

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
