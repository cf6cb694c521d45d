"""The shared store: Redis, reached with redis-py's asyncio client (with hiredis's parser); one
typed call per decision.

Three layouts, one URL (``--redis``, the policy's ``shared.redis``)::

    redis://HOST:PORT[/DB]                               one Redis (rediss://: TLS)
    redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]  Sentinel: the sentinels and the master's
                                                         name (rediss+sentinel://: TLS to both)
    redis+cluster://HOST:PORT[,HOST:PORT...]             Redis Cluster: some of its nodes (the rest
                                                         are found); rediss+cluster://: TLS

Sentinel: redis-py asks the sentinels for the master and asks them again after a failure (a
master demoted answers READONLY: the connection is dropped). Cluster: a call goes to the node of
its keys' slot (one request's keys share it: the hash tag ``{key}``, scanner.limiter.keys); a
node that does not know a script answers NOSCRIPT and gets it by EVAL (scanner.limiter.scripts),
so scripts are loaded per node as they are used.

Every Redis failure (refused, reset, timed out, an error answer such as ``LOADING`` or
``READONLY``) becomes :class:`StoreUnavailableError` naming only the error's class: never the
URL, never the password. Nothing is decided without an answer from Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis, SSLConnection
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from scanner import store_url as url
from scanner.errors import ConfigError, StoreUnavailableError, UsageError
from scanner.limiter import keys, scripts
from scanner.limiter.config import OWNER_SILENT_S
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone, Zone

# Redis answers on loopback in well under a millisecond: a call that takes this long is a store
# that is not there (the proxy turns the answer into 503 shared-store-unavailable).
TIMEOUT_S = 0.5
# a reservation's deadline is this much before the caller gives up: the answer's way back
DEADLINE_MARGIN_S = 0.1
# the offset to Redis's clock: the largest sample of this long (each a lower bound of the true one)
OFFSET_WINDOW_S = 10.0


@dataclass(frozen=True)
class StoreSpec:
    """How to reach Redis: a URL (scanner.store_url: one Redis, Sentinel or Cluster), a password file
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


# the one Redis client of the limiter: redis-py's (one Redis, or its master through Sentinel; or
# a Redis Cluster)
Client = Redis | RedisCluster
def connect(spec: StoreSpec) -> Client:
    """The client for ``spec`` (connections are opened on first use); UsageError for a bad URL."""
    try:
        p = url.parse_url(spec.url)
    except url.UrlError as exc:
        raise UsageError(f"--redis: {exc}") from None
    if spec.ca_file is not None and not p.tls:
        raise UsageError("--redis-ca-file needs a rediss:// URL")
    password = _password(spec.password_file) if spec.password_file else None
    # a failed call is answered at once (the proxy decides what "unavailable" means), not retried
    options: dict[str, Any] = {
        "username": p.username, "password": password, "socket_timeout": spec.timeout_s,
        "socket_connect_timeout": spec.timeout_s, "retry": Retry(NoBackoff(), 0)}
    tls: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_check_hostname": True,
                           "ssl_ca_certs": str(spec.ca_file) if spec.ca_file else None} if p.tls else {}
    client: Client
    if p.layout == "cluster":
        client = RedisCluster(startup_nodes=[ClusterNode(h, port) for h, port in p.hosts],
                              max_connections=spec.max_connections, ssl=p.tls, **tls, **options)
    elif p.layout == "sentinel":
        # the sentinels' own connections: the same timeouts and TLS, no password (a sentinel's
        # AUTH is its own; give none here)
        sentinel = Sentinel(list(p.hosts), sentinel_kwargs={
            "socket_timeout": spec.timeout_s, "socket_connect_timeout": spec.timeout_s,
            **({"ssl": True, **tls} if p.tls else {})}, **({"ssl": True, **tls} if p.tls else {}),
            db=p.db, **options)
        client = sentinel.master_for(p.master, max_connections=spec.max_connections)
    else:
        host, port = p.hosts[0]
        single: dict[str, Any] = {"host": host, "port": port, "db": p.db, "health_check_interval": 0,
                                  **options}
        if p.tls:
            single.update(connection_class=SSLConnection, **tls)
        # more calls in flight than connections wait for one (up to the timeout), not fail at once
        pool = BlockingConnectionPool(max_connections=spec.max_connections, timeout=spec.timeout_s, **single)
        client = Redis.from_pool(pool)
    own = session(client)
    own.timeout_s, own.layout = spec.timeout_s, p.layout
    return client


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
        raise await _unavailable(redis, exc) from None


async def take(redis: Client, zone: RateZone | TokenZone, key: str, n: int) -> Taken:
    """Take ``n`` from ``key``'s bucket of ``zone`` when they are there."""
    ok, left, wait_us = await _run(redis, scripts.BUCKET, keys.bucket(zone.name, key),
                                   (zone.per_second, zone.capacity, n, "take"))
    return Taken(ok == 1, left, None if wait_us < 0 else wait_us / 1e6)


async def give(redis: Client, zone: RateZone | TokenZone, key: str, n: int,
               until: float | None = None) -> Taken:
    """Give ``n`` back to ``key``'s bucket of ``zone`` (capped at the bucket's size); with ``until``
    (the caller's give-up time) nothing is given once Redis's clock has passed it
    (StoreUnavailableError): a refund its caller sends again is never given twice."""
    deadline = 0
    if until is not None:
        deadline = (await synced(redis)).deadline_us(call_timeout(redis, until))
    ok, left, _wait = await _run(redis, scripts.BUCKET, keys.bucket(zone.name, key),
                                 (zone.per_second, zone.capacity, n, "give", deadline))
    if ok < 0:
        session(redis).failures += 1
        raise StoreUnavailableError("shared store unavailable (late)")
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
    failures: int = -1      # the client's failures when the clock was last read (Session.failures)

    def learn(self, redis_us: int, received: float) -> None:
        sample = redis_us - round(received * 1e6)
        stale = received - self.sampled_at > OFFSET_WINDOW_S
        if self.offset_us is None or sample >= self.offset_us or stale:
            self.offset_us, self.sampled_at = sample, received

    def deadline_us(self, timeout_s: float) -> int:
        """Redis's time at which a call of ``timeout_s`` is given up, less a margin for the answer's
        way back (DEADLINE_MARGIN_S, at most half a short timeout)."""
        assert self.offset_us is not None
        margin = min(DEADLINE_MARGIN_S, timeout_s / 2)
        return int(round((time.monotonic() + timeout_s - margin) * 1e6) + self.offset_us)


def call_timeout(redis: Client, until: float | None) -> float:
    """The time a call may take: the client's timeout, or less when its caller gives up sooner
    (``until``, monotonic: Envoy's try timeout, scanner.limiter.server); StoreUnavailableError
    when that has passed already (nothing is sent to Redis)."""
    timeout = session(redis).timeout_s
    if until is not None:
        timeout = min(timeout, until - time.monotonic())
        if timeout <= 0:
            raise StoreUnavailableError("shared store unavailable (late)")
    return timeout


@dataclass(frozen=True)
class Lease:
    """One slot this process reserved: renewed until ``until`` (monotonic: the zone's
    ``slot_ttl_s`` after admission, the longest its request may run) while ``owner`` is alive."""

    until: float
    owner: str = ""


@dataclass
class Leases:
    """The slots this process reserved for requests still in flight (admitted, not released):
    ``(slots key, slot id) -> Lease``. ``renew`` extends each by the lease while its owner lives."""

    held: dict[tuple[str, str], Lease] = field(default_factory=dict)


@dataclass
class Owners:
    """Who holds the slots this process leases: the proxy that asked, so that a proxy killed
    mid-stream (SIGKILL: no release ever comes) gets no more renewals and its slots come back
    within a lease, while a live proxy's long stream keeps its slot.

    * ``conn:N`` (Envoy): the gRPC connection the acquire came on, alive while it is open (a
      killed Envoy's connections are closed by its kernel);
    * ``replica:ID`` (NGINX, njs >= 0.8): the replica's id (per NGINX instance: a new one after a
      restart), alive while heard from (an acquire, a release, its heartbeat every HEARTBEAT_S)
      within OWNER_SILENT_S;
    * ``""``: a caller that names none (njs 0.7, a hand-made call): alive while this process is,
      its slots renewed until the zone's slot_ttl_s as before.

    ``seen`` maps an owner to the monotonic time it was last heard (inf: a connection open)."""

    seen: dict[str, float] = field(default_factory=dict)
    silent_s: float = OWNER_SILENT_S

    def heard(self, owner: str) -> None:
        if owner and self.seen.get(owner) != math.inf:
            self.seen[owner] = time.monotonic()

    def opened(self, owner: str) -> None:
        self.seen[owner] = math.inf

    def closed(self, owner: str) -> None:
        self.seen.pop(owner, None)

    def alive(self, owner: str, now: float) -> bool:
        return not owner or self.seen.get(owner, -math.inf) >= now - self.silent_s

    def forget_silent(self, now: float) -> None:
        for owner in [o for o, t in self.seen.items() if t < now - self.silent_s]:
            del self.seen[owner]


@dataclass
class Session:
    """What this process keeps beside its client: Redis's clock, the slots it leases, the call
    timeout, and how many calls failed so far (a failure is followed by a reconnection: Redis
    restarted, failed over, stopped, frozen or unreachable in between)."""

    clock: Clock = field(default_factory=Clock)
    leases: Leases = field(default_factory=Leases)
    owners: Owners = field(default_factory=Owners)
    timeout_s: float = TIMEOUT_S
    failures: int = 0
    layout: url.Layout = "single"


_SESSIONS: weakref.WeakKeyDictionary[Client, Session] = weakref.WeakKeyDictionary()


def session(redis: Client) -> Session:
    """The clock and the leases of ``redis`` (one per client: the service has one)."""
    found = _SESSIONS.get(redis)
    if found is None:
        found = _SESSIONS[redis] = Session()
    return found


async def synced(redis: Client) -> Clock:
    """The client's clock, read from Redis (``TIME``) first when it has no offset yet or a call
    failed since (Session.failures): the floor is then that time (0 when nothing ever failed:
    nothing was admitted without Redis before)."""
    own = session(redis)
    clock = own.clock
    if clock.offset_us is not None and clock.failures == own.failures:
        return clock
    try:
        sec, usec = await redis.time()
    except (RedisError, OSError) as exc:
        raise await _unavailable(redis, exc) from None
    now_us = int(sec) * 1_000_000 + int(usec)
    clock.offset_us = None
    clock.learn(now_us, time.monotonic())
    clock.failures = own.failures
    clock.floor_us = now_us if own.failures else 0
    return clock


async def reserve(redis: Client, zones: Sequence[tuple[Zone, str, int]], slot: str, lease_s: float,
                  floor: bool = False, owner: str = "", until: float | None = None) -> Reserved:
    """Take every ``(zone, key, cost)`` in order in ONE script call (scripts.ACQUIRE): all, or on
    the first refusal only the rate zones before it (see scanner.limiter.scripts). The call
    carries its deadline (past it Redis writes nothing: StoreUnavailableError); slots are leases
    of ``lease_s`` (at most the zone's slot_ttl_s), renewed by ``renew`` until released; ``floor``
    (on_unavailable: local): buckets are not refilled for the time before the last reconnection.
    ``owner``: the proxy holding the slots (Owners), renewed only while it is alive. ``until``
    (monotonic): when the caller gives up, if sooner than the client's timeout (call_timeout)."""
    clock = await synced(redis)
    names: list[str] = []
    deadline = clock.deadline_us(call_timeout(redis, until))
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
        raise await _unavailable(redis, exc) from None
    clock.learn(out[1], time.monotonic())
    if out[0] < 0:      # Redis ran it after its deadline: nothing written
        session(redis).failures += 1
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
                held[(keys.slots(zone.name, key), slot)] = Lease(until + zone.slot_ttl_s, owner)
    return Reserved(refused, tuple(answers))


async def renew(redis: Client, lease_s: float) -> int:
    """Extend every slot this client holds for a request in flight by ``lease_s`` (one RENEW per
    slots key, sent together); forget those released elsewhere, expired, past their zone's
    slot_ttl_s, or whose owner is gone (Owners: its slots then lapse within the lease). The
    number renewed. A Redis failure: StoreUnavailableError (kept for next time)."""
    own = session(redis)
    held = own.leases.held
    now = time.monotonic()
    for entry, lease in list(held.items()):
        if lease.until <= now or not own.owners.alive(lease.owner, now):
            del held[entry]
    own.owners.forget_silent(now)
    by_key: dict[str, list[str]] = {}
    for key, slot in held:
        by_key.setdefault(key, []).append(slot)
    lease_ms = round(lease_s * 1000)
    try:
        answers = await asyncio.gather(*(scripts.run(redis, scripts.RENEW, key, (lease_ms, *slots))
                                         for key, slots in by_key.items()))
    except (RedisError, OSError) as exc:
        raise await _unavailable(redis, exc) from None
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
        raise await _unavailable(redis, exc) from None


async def _run(redis: Client, script: scripts.Script, key: str,
               args: tuple[str | int | float, ...]) -> list[int]:
    try:
        return await scripts.run(redis, script, key, args)
    except (RedisError, OSError) as exc:
        raise await _unavailable(redis, exc) from None


async def _unavailable(redis: Client, exc: BaseException) -> StoreUnavailableError:
    """The failure of a call, counted (the next call reads Redis's clock anew, Session.failures).
    Through Sentinel the client's connections are dropped too: a master demoted or cut off from
    its replica keeps them open and answers every write with an error (READONLY, NOREPLICAS), so
    the next call asks the sentinels for the master again."""
    own = session(redis)
    own.failures += 1
    if own.layout == "sentinel" and isinstance(redis, Redis):
        with contextlib.suppress(RedisError, OSError):
            await redis.connection_pool.disconnect()
    return StoreUnavailableError(f"shared store unavailable ({exc.__class__.__name__})")
