"""The HTTP/1.1 JSON door, for NGINX's njs (``ngx.fetch`` from the access phase).

::

    POST /v1/acquire {"key": K, "zones": [Z, ...], "cost": C, "slot": S}
         200 {"allow": true,  "slot": S, "retry_after": 0, "reason": ""}
         200 {"allow": false, "slot": S, "retry_after": 3, "reason": "rate", "zone": Z}
    POST /v1/release {"key": K, "zones": [Z, ...], "slot": S}      200 {"released": true}
    POST /v1/release {..., "settle": T, "refund": R}                200 {"released": true, "left": N}
    POST /v1/settle  {"key": K, "zone": Z, "refund": R}            200 {"left": N}
    POST /v1/alive   {"replica": ID}                               200 {"alive": true}
    GET  /v1/health                                                200 {"store": "ok"}

``zones`` are taken in order (scanner.limiter.decide.acquire): a rate zone takes 1, a token zone
``cost`` (required with one: never a default charge), a concurrency zone holds the slot
(``slot``: the caller's id, e.g. ``$request_id`` bound to a variable, which njs otherwise reads
anew each time; or a new one in the answer), to release with. ``"zone": Z`` is short for
``"zones": [Z]``. ``"replica": ID`` (on acquire and release; njs >= 0.8: one id per NGINX
instance) names the proxy holding the slot: its leases are renewed only while that replica is
heard from, by those calls or its heartbeat ``/v1/alive``, at any limiter (or no live limiter
hears it: then until slot_ttl_s; scanner.limiter.store.Owners, renew); without it a slot is
renewed until its zone's slot_ttl_s. A release may carry the settlement of the same
request's token zone ``T`` (one call once answered instead of two). Redis unavailable: **503**
``{"allow": false, "reason": "shared-store-unavailable"}``: the proxy answers 503 with that
reason; under ``on_unavailable: local``, once the outage is as old as the zones'
``local_after_s`` (decide.Outage), an acquire's 503 adds ``"local": true``: the proxy decides
with its local share. A call that cannot be read: **400** ``{"error": ...}`` (the proxy refuses).
Bodies over 16 KiB: 413. Anything else: 404 / 405.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass

from scanner.errors import LimiterCallError, StoreUnavailableError
from scanner.limiter import decide, keys, store
from scanner.limiter.config import LimiterConfig
from scanner.plan.zones import TokenZone

MAX_BODY = 16 * 1024
ROUTES: Mapping[str, str] = {"/v1/acquire": "POST", "/v1/release": "POST", "/v1/settle": "POST",
                             "/v1/alive": "POST", "/v1/health": "GET"}


@dataclass(frozen=True)
class Answer:
    status: int
    body: Mapping[str, object]

    def encoded(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


async def handle(redis: store.Client, config: LimiterConfig, method: str, path: str, body: bytes,
                 outage: decide.Outage | None = None) -> Answer:
    """The answer to one request; never raises for what a caller sends. ``outage``: the
    service's (an acquire without Redis may send the proxy to its local share, ``"local": true``,
    under on_unavailable: local once the outage is old enough; decide.Outage)."""
    outage = outage if outage is not None else decide.Outage()
    zones: list[str] = []
    want = ROUTES.get(path)
    if want is None:
        return Answer(404, {"error": "not found"})
    if method != want:
        return Answer(405, {"error": f"use {want}"})
    try:
        if path == "/v1/health":
            await store.ping(redis)
            return Answer(200, {"store": "ok"})
        call = _json(body)
        owner = _owner(call)
        store.session(redis).owners.heard(owner)
        if path == "/v1/alive":
            if not owner:
                raise LimiterCallError("replica must be a non-empty string")
            return Answer(200, {"alive": True})
        if path == "/v1/acquire":
            zones = _zones(call)
            answer = await _acquire(redis, config, call, owner)
            outage.answered()
            return answer
        if path == "/v1/release":
            return await _release(redis, config, call)
        refund = call.get("refund", 0)
        return Answer(200, {"left": await decide.settle(redis, config, _str(call, "zone"), _str(call, "key"),
                                                        refund)})
    except StoreUnavailableError:
        if zones and outage.local(config, zones):
            return Answer(503, {"allow": False, "reason": decide.UNAVAILABLE, "local": True})
        return Answer(503, {"allow": False, "reason": decide.UNAVAILABLE})
    except LimiterCallError as exc:
        return Answer(400, {"error": exc.message})


async def _acquire(redis: store.Client, config: LimiterConfig, call: Mapping[str, object],
                   owner: str = "") -> Answer:
    key, cost = _str(call, "key"), call.get("cost")
    slot = call.get("slot", "")
    if not isinstance(slot, str):
        raise LimiterCallError("slot must be a string")
    calls = [decide.Call(z, key, _cost(cost) if isinstance(decide.zone_of(config, z), TokenZone) else 1)
             for z in _zones(call)]
    verdict = await decide.acquire(redis, config, calls, slot, owner)
    refusal = verdict.refusal
    if refusal is None:
        return Answer(200, {"allow": True, "slot": verdict.slot, "retry_after": 0, "reason": ""})
    return Answer(200, {"allow": False, "slot": verdict.slot, "retry_after": refusal.retry_after_s,
                        "reason": refusal.reason, "zone": refusal.zone.name})


async def _release(redis: store.Client, config: LimiterConfig, call: Mapping[str, object]) -> Answer:
    """The slots freed and, with ``settle``, that token zone's refund given back: one call from
    the proxy, both Redis calls sent together."""
    key, zones, slot = _str(call, "key"), _zones(call), _str(call, "slot")
    if "settle" not in call:
        return Answer(200, {"released": await decide.release(redis, config, zones, key, slot)})
    token_zone = _str(call, "settle")
    held, left = await asyncio.gather(decide.release(redis, config, zones, key, slot),
                                      decide.settle(redis, config, token_zone, key, call.get("refund", 0)))
    return Answer(200, {"released": held, "left": left})


def _owner(call: Mapping[str, object]) -> str:
    """The lease owner a call names (``"replica": ID``: ``replica:ID``), "" when it names none."""
    if "replica" not in call:
        return ""
    return "replica:" + keys.checked("replica", _str(call, "replica"))


def _cost(cost: object) -> int:
    if cost is None:
        raise LimiterCallError("a token zone needs the request's cost")
    return decide.check_cost(cost)


def _json(body: bytes) -> Mapping[str, object]:
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise LimiterCallError("the body is not JSON") from None
    if not isinstance(value, dict):
        raise LimiterCallError("the body must be a JSON object")
    return value


def _str(call: Mapping[str, object], name: str) -> str:
    value = call.get(name)
    if not isinstance(value, str) or not value:
        raise LimiterCallError(f"{name} must be a non-empty string")
    return value


def _zones(call: Mapping[str, object]) -> list[str]:
    zones = call.get("zones", [call["zone"]] if "zone" in call else None)
    if not isinstance(zones, list) or not zones or len(zones) > 16 \
            or not all(isinstance(z, str) for z in zones):
        raise LimiterCallError("zones must be a list of 1 to 16 zone names")
    return zones
