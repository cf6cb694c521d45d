"""One request's limits, decided against the shared store: acquire, release, settle.

Both front doors (scanner.limiter.rls for Envoy, scanner.limiter.http_api for njs) call these.

**acquire** takes the zones of one request in order (the generators list rate, then
concurrency, then tokens, the proxies' local order) and stops at the first refusal. What was
taken before it: a rate token stays spent (NGINX's limit_req counts every request it saw; a
request refused for its rate is not charged tokens), a concurrency slot is released and a token
reservation given back (the request will not run: it is neither running nor charged). Per kind:

* rate: take ``cost`` (1 per request) from the bucket of burst + 1 refilled at rps;
* concurrency: hold the request's slot (its id: the caller's, e.g. Envoy's x-request-id, or a
  new random one), expiring after the zone's ``slot_ttl_s`` unless released;
* tokens: reserve ``cost`` (the request's admitted envelope, Decision.token_cost), clamped to
  ``per_minute + 1`` (a cost over the whole budget never fits: Retry-After 60, as the proxies).

A refusal carries its reason (scanner.reasons: ``rate``, ``concurrency``, ``token-budget``)
and Retry-After in whole seconds (at least 1): when the bucket will hold the cost (rate,
tokens) or 1 (concurrency: a slot frees whenever a request ends).

**release** frees the request's slot in each concurrency zone; **settle** gives ``refund``
tokens back to a token zone (scanner.plan.settle: the unused part of the reservation), capped
at the bucket's size.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from scanner import reasons
from scanner.errors import LimiterCallError
from scanner.limiter import keys, store
from scanner.limiter.config import MAX_VALUE, ConcurrencyZone, LimiterConfig, RateZone, TokenZone, Zone

NEVER_FITS_S = 60      # a token cost over the whole budget (the proxies answer the same)
SLOT_RETRY_S = 1
# zone kind -> the refusal's reason (scanner.reasons: the proxies' X-Perimeter-Reason, 429 each)
REASONS: Mapping[str, str] = {"rate": reasons.token("rate"), "concurrency": reasons.token("concurrency"),
                              "tokens": reasons.token("token-budget")}
# the answer a proxy turns into 503 under on_unavailable: deny
UNAVAILABLE = reasons.token("shared-store-unavailable")


@dataclass(frozen=True)
class Call:
    """One zone of one request: its key (principal, or client address) and cost."""

    zone: str
    key: str
    cost: int = 1


@dataclass(frozen=True)
class Status:
    """One zone's answer; ``evaluated`` False for zones after the first refusal."""

    zone: Zone
    admitted: bool
    remaining: int
    retry_after_s: int = 0
    evaluated: bool = True

    @property
    def reason(self) -> str:
        return "" if self.admitted else REASONS[self.zone.kind]


@dataclass(frozen=True)
class Verdict:
    statuses: tuple[Status, ...]
    slot: str

    @property
    def admitted(self) -> bool:
        return all(s.admitted for s in self.statuses)

    @property
    def refusal(self) -> Status | None:
        return next((s for s in self.statuses if not s.admitted), None)


def zone_of(config: LimiterConfig, name: str) -> Zone:
    zone = config.zones.get(name)
    if zone is None:
        raise LimiterCallError(f"unknown zone {name[:80]!r}")
    return zone


def check_cost(cost: object) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= MAX_VALUE:
        raise LimiterCallError(f"bad cost: a whole number from 0 to {MAX_VALUE}")
    return cost


def new_slot() -> str:
    return secrets.token_hex(12)


async def acquire(redis: Redis, config: LimiterConfig, calls: Sequence[Call], slot: str = "") -> Verdict:
    """Take every call's zone as if in order, stopping at the first refusal (see the module
    docstring). The zones are asked at once (one round trip's time, not one per zone); what a
    zone after the first refusal took is given back, so the outcome is the ordered one."""
    zones = [(zone_of(config, c.zone), keys.checked("key", c.key), check_cost(c.cost)) for c in calls]
    slot = keys.checked("slot", slot) if slot else new_slot()
    answers = list(await asyncio.gather(*(_one(redis, z, k, c, slot) for z, k, c in zones)))
    first = next((i for i, s in enumerate(answers) if not s.admitted), None)
    if first is None:
        return Verdict(tuple(answers), slot)
    later = zip(zones[first + 1:], answers[first + 1:], strict=True)
    after = [(z, k, c) for (z, k, c), s in later if s.admitted]
    await asyncio.gather(_undo(redis, zones[:first], slot), _undo(redis, after, slot, rates=True))
    done = [*answers[:first + 1], *(Status(z, True, 0, evaluated=False) for z, _k, _c in zones[first + 1:])]
    return Verdict(tuple(done), slot)


async def _one(redis: Redis, zone: Zone, key: str, cost: int, slot: str) -> Status:
    if isinstance(zone, ConcurrencyZone):
        held = await store.hold(redis, zone, key, slot)
        return Status(zone, held.admitted, max(0, zone.limit - held.live),
                      0 if held.admitted else SLOT_RETRY_S)
    if isinstance(zone, TokenZone):
        cost = min(cost, zone.per_minute + 1)
    taken = await store.take(redis, zone, key, cost)
    return Status(zone, taken.admitted, taken.left, 0 if taken.admitted else _retry_after(zone, taken.wait_s))


def _retry_after(zone: RateZone | TokenZone, wait_s: float | None) -> int:
    if wait_s is None:
        return NEVER_FITS_S if isinstance(zone, TokenZone) else max(1, math.ceil(zone.capacity / zone.rps))
    return max(1, math.ceil(wait_s))


async def _undo(redis: Redis, taken: Sequence[tuple[Zone, str, int]], slot: str, rates: bool = False) -> None:
    """Give back what ``taken`` holds: slots and token reservations; with ``rates`` rate tokens too
    (a zone the ordered walk would not have reached)."""
    for zone, key, cost in taken:
        if isinstance(zone, ConcurrencyZone):
            await store.release(redis, zone, key, slot)
        elif isinstance(zone, TokenZone):
            await store.give(redis, zone, key, min(cost, zone.per_minute + 1))
        elif rates:
            await store.give(redis, zone, key, cost)


async def release(redis: Redis, config: LimiterConfig, zone_names: Sequence[str], key: str,
                  slot: str) -> bool:
    """Free ``slot`` in each concurrency zone named; True when every one was held."""
    key, slot = keys.checked("key", key), keys.checked("slot", slot)
    held = True
    for name in zone_names:
        zone = zone_of(config, name)
        if not isinstance(zone, ConcurrencyZone):
            raise LimiterCallError(f"zone {name[:80]!r} is a {zone.kind} zone: only slots are released")
        held = await store.release(redis, zone, key, slot) and held
    return held


async def settle(redis: Redis, config: LimiterConfig, zone_name: str, key: str, refund: object) -> int:
    """Give ``refund`` tokens back to ``key``'s budget in a token zone; the whole tokens it then holds."""
    zone = zone_of(config, zone_name)
    if not isinstance(zone, TokenZone):
        raise LimiterCallError(f"zone {zone_name[:80]!r} is a {zone.kind} zone: only tokens are settled")
    refund = min(check_cost(refund), zone.per_minute)
    return (await store.give(redis, zone, keys.checked("key", key), refund)).left
