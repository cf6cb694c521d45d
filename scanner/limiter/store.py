"""The shared store: Redis, reached with redis-py's asyncio client; one typed call per decision.

Every Redis failure (refused, reset, timed out, an error answer such as ``LOADING`` or
``READONLY``) becomes :class:`StoreUnavailableError` naming only the error's class: never the
URL, never the password. Nothing is decided without an answer from Redis.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
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


async def reserve(redis: Client, zones: Sequence[tuple[Zone, str, int]], slot: str) -> Reserved:
    """Take every ``(zone, key, cost)`` in order in ONE script call (scripts.ACQUIRE): all, or on
    the first refusal only the rate zones before it (see scanner.limiter.scripts)."""
    names: list[str] = []
    args: list[str | int | float] = [slot]
    for zone, key, cost in zones:
        if isinstance(zone, ConcurrencyZone):
            names.append(keys.slots(zone.name, key))
            args += ("s", zone.limit, round(zone.slot_ttl_s * 1000), 0)
        else:
            names.append(keys.bucket(zone.name, key))
            args += ("r" if isinstance(zone, RateZone) else "t", zone.per_second, zone.capacity, cost)
    try:
        out = await scripts.run_keys(redis, scripts.ACQUIRE, names, args)
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from None
    answers: list[Taken | Held] = []
    for i, (zone, _key, _cost) in enumerate(zones[:(len(out) - 1) // 3]):
        ok, left, wait = out[1 + 3 * i:4 + 3 * i]
        answers.append(Held(ok == 1, left, wait / 1000) if isinstance(zone, ConcurrencyZone)
                       else Taken(ok == 1, left, None if wait < 0 else wait / 1e6))
    return Reserved(out[0] - 1 if out[0] else None, tuple(answers))


async def release(redis: Client, zone: ConcurrencyZone, key: str, slot: str) -> bool:
    """Free ``slot``; False when it was not held (released already, or expired)."""
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
