"""The shared store: Redis, reached with redis-py's asyncio client; one typed call per decision.

Every Redis failure (refused, reset, timed out, an error answer such as ``LOADING`` or
``READONLY``) becomes :class:`StoreUnavailableError` naming only the error's class: never the
URL, never the password. Nothing is decided without an answer from Redis.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from scanner.errors import ConfigError, StoreUnavailableError, UsageError
from scanner.limiter import keys, resp, scripts
from scanner.limiter.config import ConcurrencyZone, RateZone, TokenZone, Zone

# Redis answers on loopback in well under a millisecond: a call that takes this long is a store
# that is not there (the proxy turns the answer into 503 shared-store-unavailable).
TIMEOUT_S = 0.5
# a reservation's deadline is this much before the caller gives up: the answer's way back
DEADLINE_MARGIN_S = 0.1
# the offset to Redis's clock: the largest sample of this long (each a lower bound of the true one)
OFFSET_WINDOW_S = 10.0


@dataclass(frozen=True)
class StoreSpec:
    """How to reach Redis: ``redis://host:port/db`` or ``rediss://`` (TLS), a password file
    (the password is never on the command line), a CA file for TLS."""

    url: str
    # a failed call is answered at once (the proxy decides what "unavailable" means), not retried
    password_file: Path | None = None
    ca_file: Path | None = None
    timeout_s: float = TIMEOUT_S
    max_connections: int = 64


@dataclass(frozen=True)
class Taken:
    """A bucket's answer: admitted, whole tokens left, seconds until ``n`` would fit (None:
    never, ``n`` is more than the bucket holds)."""

    admitted: bool
    left: int
    wait_s: float | None


@dataclass(frozen=True)
class Held:
    """A slot's answer: admitted, live slots (with this one), seconds until the oldest expires."""

    admitted: bool
    live: int
    wait_s: float


class Client(Protocol):
    """What the limiter asks of a Redis client: redis-py's ``Redis`` (tests, tools) or the
    pipelined scanner.limiter.resp.Client (the service's hot path)."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any: ...

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...

    def zrem(self, name: Any, *values: Any) -> Any: ...

    def ping(self) -> Any: ...

    def time(self) -> Any: ...

    def aclose(self) -> Any: ...


@dataclass(frozen=True)
class _Parsed:
    host: str
    port: int
    db: int
    username: str | None
    password: str | None
    tls: bool


def _parse(spec: StoreSpec) -> _Parsed:
    parts = urlsplit(spec.url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise UsageError("--redis: expected redis://HOST:PORT[/DB] or rediss://HOST:PORT[/DB]")
    if parts.password:
        raise UsageError("--redis: no password in the URL; give --redis-password-file")
    if spec.ca_file is not None and parts.scheme != "rediss":
        raise UsageError("--redis-ca-file needs a rediss:// URL")
    try:
        port = parts.port or 6379
        db = int(parts.path.lstrip("/") or 0)
    except ValueError:
        raise UsageError("--redis: the port and database must be numbers") from None
    password = _password(spec.password_file) if spec.password_file else None
    return _Parsed(parts.hostname, port, db, parts.username or None, password, parts.scheme == "rediss")


def connect(spec: StoreSpec) -> Redis:
    """A redis-py client for ``spec`` (connections are opened on first use); UsageError for a bad URL."""
    p = _parse(spec)
    options: dict[str, Any] = {
        "host": p.host, "port": p.port, "db": p.db, "username": p.username,
        "password": p.password, "socket_timeout": spec.timeout_s, "socket_connect_timeout": spec.timeout_s,
        "retry": Retry(NoBackoff(), 0), "health_check_interval": 0}
    if p.tls:
        options.update(connection_class=SSLConnection, ssl_cert_reqs=ssl.CERT_REQUIRED,
                       ssl_check_hostname=True, ssl_ca_certs=str(spec.ca_file) if spec.ca_file else None)
    # more calls in flight than connections wait for one (up to the timeout), not fail at once
    pool = BlockingConnectionPool(max_connections=spec.max_connections, timeout=spec.timeout_s, **options)
    return Redis.from_pool(pool)


def connect_fast(spec: StoreSpec) -> resp.Client:
    """The service's client for ``spec``: one pipelined connection (scanner.limiter.resp), the same
    URL, password file, TLS (the CA file, the host name checked) and timeout as ``connect``."""
    p = _parse(spec)
    tls = None
    if p.tls:
        tls = ssl.create_default_context(cafile=str(spec.ca_file) if spec.ca_file else None)
    return resp.Client(resp.Target(p.host, p.port, p.db, p.username, p.password, spec.timeout_s, tls))


def _password(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--redis-password-file {path}: cannot read it "
                          f"({exc.__class__.__name__})") from None
    value = text.strip()
    if not value or "\n" in value:
        raise ConfigError(f"--redis-password-file {path}: expected one line holding the password")
    return value


async def ping(redis: Client) -> None:
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None


async def take(redis: Client, zone: RateZone | TokenZone, key: str, n: int) -> Taken:
    """Take ``n`` from ``key``'s bucket of ``zone`` when they are there."""
    ok, left, wait_us = await _run(redis, scripts.BUCKET, keys.bucket(zone.name, key),
                                   (zone.per_second, zone.capacity, n, "take"))
    return Taken(ok == 1, left, None if wait_us < 0 else wait_us / 1e6)


async def give(redis: Client, zone: RateZone | TokenZone, key: str, n: int) -> Taken:
    """Give ``n`` back to ``key``'s bucket of ``zone`` (capped at the bucket's size)."""
    _ok, left, _wait = await _run(redis, scripts.BUCKET, keys.bucket(zone.name, key),
                                  (zone.per_second, zone.capacity, n, "give"))
    return Taken(True, left, 0.0)


async def hold(redis: Client, zone: ConcurrencyZone, key: str, slot: str) -> Held:
    """Hold ``slot`` in ``key``'s slots of ``zone`` when fewer than its limit are live."""
    ok, live, wait_ms = await _run(redis, scripts.SLOT, keys.slots(zone.name, key),
                                   (zone.limit, slot, round(zone.slot_ttl_s * 1000)))
    return Held(ok == 1, live, wait_ms / 1000)


@dataclass(frozen=True)
class Reserved:
    """One request's reservation over its zones (``reserve``): the index of the first refusal
    (None: all admitted) and an answer per zone up to and including it (Taken or Held)."""

    refused: int | None
    answers: tuple[Taken | Held, ...]


@dataclass
class Clock:
    """Redis's clock seen from this process (scripts.ACQUIRE's deadline and floor, in Redis µs).

    ``offset_us`` is Redis's ``TIME`` minus this process's monotonic clock, learned from every
    answer that carries Redis's time: a sample taken when the answer arrives is a lower bound
    (Redis read its clock before), so the largest of the last OFFSET_WINDOW_S is kept and a
    deadline made from it falls at or before the caller's real give-up time (a script never runs
    after it; one may be refused up to a round trip early). Clock skew between hosts does not
    matter; a Redis clock stepped backwards weakens the deadline for at most the window.
    ``floor_us`` is Redis's time when this client last reconnected after a failure (``synced``;
    0 after its first connection: nothing was admitted without Redis before it)."""

    offset_us: int | None = None
    sampled_at: float = 0.0
    floor_us: int = 0
    connections: int = -1

    def learn(self, redis_us: int, received: float) -> None:
        sample = redis_us - round(received * 1e6)
        stale = received - self.sampled_at > OFFSET_WINDOW_S
        if self.offset_us is None or sample >= self.offset_us or stale:
            self.offset_us, self.sampled_at = sample, received

    def deadline_us(self, timeout_s: float) -> int:
        assert self.offset_us is not None
        return int(round((time.monotonic() + timeout_s - DEADLINE_MARGIN_S) * 1e6) + self.offset_us)


@dataclass
class Leases:
    """The slots this process reserved for requests still in flight (admitted, not released):
    ``(slots key, slot id) -> monotonic time`` after which they are no longer renewed (the zone's
    ``slot_ttl_s``: the longest its requests may run). ``renew`` extends each by the lease."""

    held: dict[tuple[str, str], float] = field(default_factory=dict)


@dataclass
class Session:
    clock: Clock = field(default_factory=Clock)
    leases: Leases = field(default_factory=Leases)


_SESSIONS: weakref.WeakKeyDictionary[Client, Session] = weakref.WeakKeyDictionary()


def session(redis: Client) -> Session:
    """The clock and the leases of ``redis`` (one per client: the service has one)."""
    found = _SESSIONS.get(redis)
    if found is None:
        found = _SESSIONS[redis] = Session()
    return found


def _timeout_s(redis: Client) -> float:
    target = getattr(redis, "target", None)
    return float(getattr(target, "timeout_s", TIMEOUT_S))


async def synced(redis: Client) -> Clock:
    """The client's clock, read from Redis (``TIME``) first when it has no offset yet or the
    client connected anew since (its ``connections`` count; a Redis restarted, stopped, frozen or
    unreachable in between): the floor is then that time."""
    clock = session(redis).clock
    if clock.offset_us is not None and clock.connections == getattr(redis, "connections", 0):
        return clock
    try:
        sec, usec = await redis.time()
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None
    now_us = int(sec) * 1_000_000 + int(usec)
    clock.offset_us = None
    clock.learn(now_us, time.monotonic())
    clock.connections = getattr(redis, "connections", 0)
    # a reconnection (a connection tried before) follows a failure: the outage's floor
    clock.floor_us = now_us if clock.connections > 1 else 0
    return clock


async def reserve(redis: Client, zones: Sequence[tuple[Zone, str, int]], slot: str, lease_s: float,
                  floor: bool = False) -> Reserved:
    """Take every ``(zone, key, cost)`` in order in ONE script call (scripts.ACQUIRE): all, or on
    the first refusal only the rate zones before it (see scanner.limiter.scripts). The call
    carries its deadline (past it Redis writes nothing: StoreUnavailableError); slots are leases
    of ``lease_s`` (at most the zone's slot_ttl_s), renewed by ``renew`` until released; ``floor``
    (on_unavailable: local): buckets are not refilled for the time before the last reconnection."""
    clock = await synced(redis)
    names: list[str] = []
    deadline = clock.deadline_us(_timeout_s(redis))
    args: list[str | int | float] = [slot, deadline, clock.floor_us if floor else 0]
    for zone, key, cost in zones:
        if isinstance(zone, ConcurrencyZone):
            names.append(keys.slots(zone.name, key))
            args += ("s", zone.limit, round(min(zone.slot_ttl_s, lease_s) * 1000), 0)
        else:
            names.append(keys.bucket(zone.name, key))
            args += ("r" if isinstance(zone, RateZone) else "t", zone.per_second, zone.capacity, cost)
    try:
        out = await scripts.run_keys(redis, scripts.ACQUIRE, names, args)
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None
    clock.learn(out[1], time.monotonic())
    if out[0] < 0:      # Redis ran it after its deadline: nothing written
        raise StoreUnavailableError("shared store unavailable (late)")
    answers: list[Taken | Held] = []
    for i, (zone, _key, _cost) in enumerate(zones[:(len(out) - 2) // 3]):
        ok, left, wait = out[2 + 3 * i:5 + 3 * i]
        answers.append(Held(ok == 1, left, wait / 1000) if isinstance(zone, ConcurrencyZone)
                       else Taken(ok == 1, left, None if wait < 0 else wait / 1e6))
    refused = out[0] - 1 if out[0] else None
    if refused is None:
        held = session(redis).leases.held
        until = time.monotonic()
        for zone, key, _cost in zones:
            if isinstance(zone, ConcurrencyZone):
                held[(keys.slots(zone.name, key), slot)] = until + zone.slot_ttl_s
    return Reserved(refused, tuple(answers))


async def renew(redis: Client, lease_s: float) -> int:
    """Extend every slot this client holds for a request in flight by ``lease_s`` (one RENEW per
    slots key, sent together); forget those released elsewhere, expired, or past their zone's
    slot_ttl_s. The number renewed. A Redis failure: StoreUnavailableError (kept for next time)."""
    held = session(redis).leases.held
    now = time.monotonic()
    for entry in [e for e, until in held.items() if until <= now]:
        del held[entry]
    by_key: dict[str, list[str]] = {}
    for key, slot in held:
        by_key.setdefault(key, []).append(slot)
    lease_ms = round(lease_s * 1000)
    try:
        answers = await asyncio.gather(*(scripts.run(redis, scripts.RENEW, key, (lease_ms, *slots))
                                         for key, slots in by_key.items()))
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None
    renewed = 0
    for (key, slots), gone in zip(by_key.items(), answers, strict=True):
        for i in gone:
            held.pop((key, slots[i - 1]), None)
        renewed += len(slots) - len(gone)
    return renewed


async def release(redis: Client, zone: ConcurrencyZone, key: str, slot: str) -> bool:
    """Free ``slot``; False when it was not held (released already, or expired)."""
    session(redis).leases.held.pop((keys.slots(zone.name, key), slot), None)
    try:
        return int(await redis.zrem(keys.slots(zone.name, key), slot)) == 1
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None


async def _run(redis: Client, script: scripts.Script, key: str,
               args: tuple[str | int | float, ...]) -> list[int]:
    try:
        return await scripts.run(redis, script, key, args)
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None


def _unavailable(exc: BaseException) -> StoreUnavailableError:
    return StoreUnavailableError(f"shared store unavailable ({exc.__class__.__name__})")
