"""Envoy's rate limit service (``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``)
on the shared store: the descriptor scheme and the mapping to scanner.limiter.decide.

**Descriptors** (one per zone a request touches; entries in this order)::

    (zone, <zone name>)                      the zones file's name (the plan's zone)
    (principal, <name>) | (remote_address, <ip>)   the key: a principal, or the client address
    (op, acquire|release|settle)             optional, acquire when absent
    (slot, <request id>)                     concurrency zones: the request's slot id
    (owner, <id>)                            concurrency zones: the Envoy worker holding the slot
                                             (its Lua VM's random id; the call's slots' owner
                                             ``envoy:<id>``, scanner.limiter.store.Owners)

What a descriptor adds is its own ``hits_addend`` (else the request's): for a rate zone 1 when
neither is given; for a token zone the request's cost, required (a descriptor without it is
refused as a bad call, so a cost Lua failed to set never charges 1 instead); for settle the
refund (none given: 0, nothing returned). Envoy's side
(to be generated): ``envoy.filters.http.ratelimit`` with ``domain`` = the zones file's domain,
``failure_mode_deny: true``, ``status_on_error: 503``; per route, ``RateLimitPerRoute.rate_limits``
(``typed_per_filter_config``: measured on Envoy 1.40, the route action's own ``rate_limits`` send
no ``hits_addend``) entries whose actions are
``generic_key {descriptor_key: zone, descriptor_value: NAME}``, then
``metadata {descriptor_key: principal, metadata_key: perimeter.principal}`` or
``remote_address {}``, then for concurrency ``request_headers {header_name: x-request-id,
descriptor_key: slot}`` (Envoy makes the id at the edge: with ``use_remote_address`` it replaces a
client's, which must stay so, since one id for several requests is one slot); token zones with
``hits_addend: {format: "%DYNAMIC_METADATA(perimeter:cost)%"}`` (measured on 1.40: an entry whose
format yields no number is not sent at all and the request passes uncharged, so Lua must set the
cost on every request of such a route or refuse it; likewise an action whose header or metadata
is absent drops its whole entry: the principal, the cost and x-request-id must always be there);
a local reply mapper on the
response flag ``RLSE`` adds ``x-perimeter-reason: shared-store-unavailable`` (tests/limiter/
test_envoy.py runs all of this on Envoy 1.40). Release and settle are the
same entries with ``generic_key {descriptor_key: op, descriptor_value: release|settle}`` and
``apply_on_stream_done: true`` (Envoy >= 1.33: sent when the stream ends; settle's hits_addend
is the refund Lua writes into metadata from the answer's usage).

**Answers**: ``overall_code`` OK or OVER_LIMIT; one status per descriptor (its code, the zone's
limit, what is left, the seconds until the cost fits); over the limit the response headers
``retry-after`` and ``x-perimeter-reason`` (``rate``, ``concurrency``, ``token-budget``), which
the filter adds to its 429. Failures are gRPC statuses, which the filter (``failure_mode_deny``)
turns into ``status_on_error``: ``UNAVAILABLE`` (14) with message ``shared-store-unavailable``
when Redis does not answer, ``INVALID_ARGUMENT`` (3) for a call that cannot be read (an unknown
domain or zone, a descriptor without zone or key, a concurrency zone without slot).

**The same descriptors on envoyproxy/ratelimit** (what generate will write for users who run
that service on their Redis; rate zones only, it has no slots and no refunds)::

    domain: vllm-perimeter
    descriptors:
      - key: zone
        value: "inference:key:10/20"
        descriptors:
          - key: principal               # or remote_address
            rate_limit: {unit: second, requests_per_unit: 10}

It counts fixed windows per unit (``requests_per_unit`` per second or minute, no burst), so a
rate zone maps to ``rps`` per second (``round(rps * 60)`` per minute below 1 r/s) and its burst
is not expressed; token zones map to ``per_minute`` per minute charged with ``hits_addend`` but
without settlement; concurrency zones have no counterpart (this service keeps them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from scanner.errors import LimiterCallError
from scanner.limiter import decide, keys, proto, store
from scanner.limiter.config import LimiterConfig, per_unit
from scanner.plan.zones import ConcurrencyZone, TokenZone, Zone

SERVICE_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
KEY_ENTRIES: tuple[str, ...] = ("principal", "remote_address")
OPS: tuple[str, ...] = ("acquire", "release", "settle")


def current_limit(zone: Zone) -> proto.CurrentLimit:
    unit = per_unit(zone)
    if unit is None:   # a concurrency zone: its slots, no time unit
        return proto.CurrentLimit(requests_per_unit=zone.limit if isinstance(zone, ConcurrencyZone) else 0,
                                  name=zone.name)
    count, per = unit
    return proto.CurrentLimit(requests_per_unit=count, name=zone.name,
                              unit=proto.UNIT_SECOND if per == "second" else proto.UNIT_MINUTE)


def owner(request: proto.Request) -> str:
    """The owner the call names for its slots (``envoy:<id>``: one ``owner`` entry, the same in
    every descriptor that has one), "" when none does; LimiterCallError for two or a bad one."""
    named = {v for v in (proto.entry(d, "owner") for d in request.descriptors) if v is not None}
    if not named:
        return ""
    if len(named) > 1:
        raise LimiterCallError("a call names one owner")
    return "envoy:" + keys.checked("owner", named.pop())


def _parts(d: proto.Descriptor) -> tuple[str, str, str, str]:
    """(zone, key, op, slot) of a descriptor; LimiterCallError when it is not in the scheme."""
    zone = proto.entry(d, "zone")
    key = next((e.value for e in d.entries if e.key in KEY_ENTRIES), None)
    op = proto.entry(d, "op") or "acquire"
    if zone is None or key is None:
        raise LimiterCallError("a descriptor needs a zone entry and a principal or remote_address entry")
    if op not in OPS:
        raise LimiterCallError(f"op must be one of {', '.join(OPS)}")
    return zone, key, op, proto.entry(d, "slot") or ""


async def should_rate_limit(redis: store.Client, config: LimiterConfig,
                            request: proto.Request, owner: str = "",
                            until: float | None = None) -> proto.Response:
    """The answer to one ShouldRateLimit call (StoreUnavailableError, LimiterCallError raised);
    ``owner``: who holds its slots (the Envoy worker it names, else its connection: store.Owners);
    ``until`` (monotonic): when Envoy gives this try up (nothing is written after it)."""
    if request.domain != config.domain:
        raise LimiterCallError(f"unknown domain {request.domain[:80]!r}")
    if not request.descriptors:
        raise LimiterCallError("no descriptors")
    parts = [_parts(d) for d in request.descriptors]
    hits = [_hits(config, request, d, p) for d, p in zip(request.descriptors, parts, strict=True)]
    acquiring = [i for i, p in enumerate(parts) if p[2] == "acquire"]
    statuses: dict[int, proto.DescriptorStatus] = {}
    if acquiring:
        verdict = await _acquire(redis, config, [parts[i] for i in acquiring], [hits[i] for i in acquiring],
                                 owner, until)
        statuses.update(zip(acquiring, map(_status, verdict.statuses), strict=True))
        refusal = verdict.refusal
    else:
        refusal = None
    done: list[Awaitable[object]] = []      # release and settle sent together (one round trip)
    for i, (zone, key, op, slot) in enumerate(parts):
        if op == "release":
            done.append(decide.release(redis, config, [zone], key, _need_slot(slot)))
        elif op == "settle":
            done.append(decide.settle(redis, config, zone, key, hits[i], until))
        if op != "acquire":
            statuses[i] = proto.DescriptorStatus(code=proto.CODE_OK,
                                                 current_limit=current_limit(decide.zone_of(config, zone)))
    await _together(done)
    ordered = [statuses[i] for i in range(len(parts))]
    if refusal is None:
        return proto.Response(overall_code=proto.CODE_OK, statuses=ordered)
    headers = [proto.HeaderValue(key="retry-after", value=str(refusal.retry_after_s)),
               proto.HeaderValue(key="x-perimeter-reason", value=refusal.reason)]
    return proto.Response(overall_code=proto.CODE_OVER_LIMIT, statuses=ordered,
                          response_headers_to_add=headers)


async def _acquire(redis: store.Client, config: LimiterConfig, parts: Sequence[tuple[str, str, str, str]],
                   hits: Sequence[int], owner: str = "", until: float | None = None) -> decide.Admission:
    slots = {slot for zone, _k, _o, slot in parts
             if isinstance(decide.zone_of(config, zone), ConcurrencyZone)}
    if "" in slots or len(slots) > 1:
        raise LimiterCallError("a concurrency zone needs one slot entry (the request id) per request")
    calls = [decide.Call(zone, key, n) for (zone, key, _o, _s), n in zip(parts, hits, strict=True)]
    return await decide.acquire(redis, config, calls, next(iter(slots), ""), owner, until)


def _hits(config: LimiterConfig, request: proto.Request, d: proto.Descriptor,
          part: tuple[str, str, str, str]) -> int:
    zone, _key, op, _slot = part
    given = proto.given_hits(request, d)
    if op == "settle":
        return given or 0
    if given is None and op == "acquire" and isinstance(decide.zone_of(config, zone), TokenZone):
        raise LimiterCallError("a token zone needs the request's cost in hits_addend")
    return proto.hits(request, d)


UNAVAILABLE_METADATA: dict[str, str] = {"shared": "unavailable"}


def unavailable(request: proto.Request) -> proto.Response:
    """The answer while the store is down under ``on_unavailable: local``: OK for every
    descriptor, with ``{shared: unavailable}`` in the filter's dynamic metadata, so the proxy's
    local filters (each zone's per-proxy share, counting only requests so marked) decide."""
    ok = [proto.DescriptorStatus(code=proto.CODE_OK) for _ in request.descriptors]
    answer = proto.Response(overall_code=proto.CODE_OK, statuses=ok)
    answer.dynamic_metadata.update(UNAVAILABLE_METADATA)
    return answer


async def _together(calls: Sequence[Awaitable[object]]) -> None:
    """Await every call; the first failure raised once all have ended (none left running)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed


def _need_slot(slot: str) -> str:
    if not slot:
        raise LimiterCallError("release needs the slot entry it acquired with")
    return slot


def _status(s: decide.Status) -> proto.DescriptorStatus:
    status = proto.DescriptorStatus(code=proto.CODE_OK if s.admitted else proto.CODE_OVER_LIMIT,
                                    current_limit=current_limit(s.zone),
                                    limit_remaining=min(max(0, s.remaining), 0xFFFFFFFF))
    if s.retry_after_s:
        status.duration_until_reset.seconds = s.retry_after_s
    return status
