"""One request's limits, decided against the shared store: acquire, release, settle.

Both front doors (scanner.limiter.rls for Envoy, scanner.limiter.http_api for njs) call these.

**acquire** takes the zones of one request in order (the generators list rate, then
concurrency, then tokens, the proxies' local order) and stops at the first refusal. What was
taken before it: a rate token stays spent (NGINX's limit_req counts every request it saw; a
request refused for its rate is not charged tokens), a concurrency slot is released and a token
reservation given back (the request will not run: it is neither running nor charged). Per kind:

* rate: take ``cost`` (1 per request) from the bucket of burst + 1 refilled at rps;
* concurrency: hold the request's slot (its id: the caller's, e.g. Envoy's x-request-id, or a
  new random one): a lease of ``slot_lease_s`` renewed by every limiter (scanner.limiter.store.
  renew, the service's loop, from the lease's facts in Redis) until released, the zone's
  ``slot_ttl_s`` has passed, or the proxy holding it is gone (store.Owners);
* tokens: reserve ``cost`` (the request's admitted envelope, scanner.plan.body.token_cost), clamped to
  the bucket's capacity (``burst``) + 1 (a cost over it never fits: Retry-After 60, as the proxies).

A refusal carries its reason (scanner.reasons: ``rate``, ``concurrency``, ``token-budget``)
and Retry-After in whole seconds (at least 1): when the bucket will hold the cost (rate,
tokens) or 1 (concurrency: a slot frees whenever a request ends).

**release** frees the request's slot in each concurrency zone; **settle** gives ``refund``
tokens back to a token zone (scanner.plan.settle: the unused part of the reservation), capped
at the bucket's size.

**Releases in flight**: a slot is released when its stream ends, off the client's path (Envoy's
``apply_on_stream_done``, NGINX's ``post_action``), so a client that sends its next request the
moment the last answer ended can reach the limiter before that answer's release does (measured on
a busy 2-core machine: about 1 answer in 7 still held its slot when the client had read it). A
refusal at a concurrency zone is therefore tried again after RELEASE_WAITS_S (at most 60 ms in
all, only on that refusal): a release on its way lands first, and a sequential client at
concurrency 1 is never refused for its own finished request. The rate zones before the refusal
were charged once; the retry takes them at cost 0 (never twice), and admits only when a slot is
free at that moment (atomic, as the first try): it never admits more than the zone allows.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scanner import reasons
from scanner.errors import LimiterCallError
from scanner.limiter import keys, store
from scanner.limiter.config import MAX_VALUE, LimiterConfig
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone, Zone

NEVER_FITS_S = 60      # a token cost over the whole budget (the proxies answer the same)
SLOT_RETRY_S = 1
# after a refusal at a concurrency zone, the waits before trying again (releases in flight)
RELEASE_WAITS_S: tuple[float, ...] = (0.02, 0.04)
RETRY_ROOM_S = 0.05        # what a try needs before its caller gives up (else it is not made)
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
class Admission:
    statuses: tuple[Status, ...]
    slot: str

    @property
    def admitted(self) -> bool:
        return all(s.admitted for s in self.statuses)

    @property
    def refusal(self) -> Status | None:
        return next((s for s in self.statuses if not s.admitted), None)


@dataclass
class Outage:
    """Since when this process finds the store unavailable (None: it answers). Under
    ``on_unavailable: local`` a request goes to the proxies' local shares only once the outage
    is as old as its zones' ``local_after_s`` (the plan's: what those shares, which start full,
    may hand out at once, refilled at the policy's rate); before, it is 503."""

    began: float | None = None

    def answered(self) -> None:
        self.began = None

    def local(self, config: LimiterConfig, zone_names: Iterable[str]) -> bool:
        """The store failed a call now: may the proxy decide ``zone_names`` with its own share?"""
        now = time.monotonic()
        if self.began is None:
            self.began = now
        return config.on_unavailable == "local" and now - self.began >= config.local_after(zone_names)


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


async def acquire(redis: store.Client, config: LimiterConfig, calls: Sequence[Call],
                  slot: str = "", owner: str = "", until: float | None = None) -> Admission:
    """Take every call's zone in order, stopping at the first refusal (see the module docstring):
    one Redis script call for all the zones (store.reserve), atomic across them. ``owner``: the
    proxy that holds the slot (store.Owners): its lease is renewed only while that proxy lives."""
    zones = [_zone_cost(zone_of(config, c.zone), keys.checked("key", c.key), check_cost(c.cost))
             for c in calls]
    slot = keys.checked("slot", slot) if slot else new_slot()
    for wait in (0.0, *RELEASE_WAITS_S):
        if wait and until is not None and time.monotonic() + wait + RETRY_ROOM_S > until:
            break                  # no time left for another try before the caller gives up
        await asyncio.sleep(wait)
        reserved = await store.reserve(redis, zones, slot, config.slot_lease_s,
                                       floor=config.on_unavailable == "local", owner=owner, until=until)
        done = [_status(z, a) for (z, _k, _c), a in zip(zones, reserved.answers, strict=False)]
        if not done or done[-1].admitted or not isinstance(done[-1].zone, ConcurrencyZone):
            break
        # refused for its slots: once more when a release in flight may have landed, the rate
        # zones before the refusal (charged already) at cost 0
        zones = [(z, k, 0 if i < len(done) - 1 and isinstance(z, RateZone) else c)
                 for i, (z, k, c) in enumerate(zones)]
    done += [Status(z, True, 0, evaluated=False) for z, _k, _c in zones[len(done):]]
    return Admission(tuple(done), slot)


def _zone_cost(zone: Zone, key: str, cost: int) -> tuple[Zone, str, int]:
    """A token zone's cost clamped to its capacity + 1 (more never fits: refused, Retry-After 60)."""
    return zone, key, min(cost, zone.burst + 1) if isinstance(zone, TokenZone) else cost


def _status(zone: Zone, answer: store.Taken | store.Held) -> Status:
    if isinstance(answer, store.Held):
        limit = zone.limit if isinstance(zone, ConcurrencyZone) else 0
        return Status(zone, answer.admitted, max(0, limit - answer.live),
                      0 if answer.admitted else SLOT_RETRY_S)
    assert isinstance(zone, RateZone | TokenZone)
    return Status(zone, answer.admitted, answer.left,
                  0 if answer.admitted else _retry_after(zone, answer.wait_s))


def _retry_after(zone: RateZone | TokenZone, wait_s: float | None) -> int:
    if wait_s is None:
        return NEVER_FITS_S if isinstance(zone, TokenZone) else max(1, math.ceil(zone.capacity / zone.rps))
    return max(1, math.ceil(wait_s))


async def release(redis: store.Client, config: LimiterConfig, zone_names: Sequence[str], key: str,
                  slot: str) -> bool:
    """Free ``slot`` in each concurrency zone named; True when every one was held. The ZREMs
    are sent together (concurrently, each on its own pooled connection)."""
    key, slot = keys.checked("key", key), keys.checked("slot", slot)
    zones: list[ConcurrencyZone] = []
    for name in zone_names:
        zone = zone_of(config, name)
        if not isinstance(zone, ConcurrencyZone):
            raise LimiterCallError(f"zone {name[:80]!r} is a {zone.kind} zone: only slots are released")
        zones.append(zone)
    return all(await asyncio.gather(*(store.release(redis, z, key, slot) for z in zones)))


async def settle(redis: store.Client, config: LimiterConfig, zone_name: str, key: str, refund: object,
                 until: float | None = None) -> int:
    """Give ``refund`` tokens back to ``key``'s budget in a token zone; the whole tokens it then holds."""
    zone = zone_of(config, zone_name)
    if not isinstance(zone, TokenZone):
        raise LimiterCallError(f"zone {zone_name[:80]!r} is a {zone.kind} zone: only tokens are settled")
    refund = min(check_cost(refund), zone.burst)
    return (await store.give(redis, zone, keys.checked("key", key), refund, until)).left
