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

    def redis_ms(self, at: float) -> int:
        """Redis's time (ms) at this process's monotonic ``at`` (from the offset: at most a round
        trip early)."""
        assert self.offset_us is not None
        return (round(at * 1e6) + self.offset_us) // 1000


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


@dataclass
class Owners:
    """Who holds slots, as this process knows it: the proxy that asked, so that a proxy killed
    mid-stream (SIGKILL: no release ever comes) gets no more renewals and its slots come back
    within a lease, while a live proxy's long stream keeps its slot (renew):

    * ``envoy:ID`` (Envoy): the Lua VM of an Envoy worker (a random id per VM, sent as the
      ``owner`` entry of its descriptors), alive here while a gRPC connection that carried it is
      open (a killed Envoy's connections are closed by its kernel);
    * ``conn:P:N`` (an Envoy call naming no owner): the gRPC connection itself, the same way;
    * ``replica:ID`` (NGINX, njs >= 0.8): the replica's id (per NGINX instance: a new one after a
      restart), alive here while heard from (an acquire, a release, its heartbeat every
      HEARTBEAT_S) within OWNER_SILENT_S;
    * ``""``: a caller that names none (njs 0.7, a hand-made call): keys.ANONYMOUS, whose slots
      every limiter renews until their zone's slot_ttl_s.

    ``seen`` maps an owner to the monotonic time it was last heard (inf: a connection open here,
    ``conns`` counts them); ``registered``: the owners this process entered into the registry
    (keys.OWNERS) before their first slot (reserve); ``gone`` holds the owners this process saw
    go (a connection closed by its peer, a replica silent): renew takes them out of the registry,
    so that no other limiter carries their slots on."""

    seen: dict[str, float] = field(default_factory=dict)
    conns: dict[str, int] = field(default_factory=dict)
    registered: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    silent_s: float = OWNER_SILENT_S

    def heard(self, owner: str) -> None:
        if owner and owner not in self.conns:
            self.seen[owner] = time.monotonic()
            self.gone.discard(owner)

    def opened(self, owner: str) -> None:
        self.conns[owner] = self.conns.get(owner, 0) + 1
        self.seen[owner] = math.inf
        self.gone.discard(owner)

    def closed(self, owner: str, peer_gone: bool = True) -> None:
        """A connection that carried ``owner`` closed; the last one closed by its peer (not by this
        process shutting down): the owner is gone."""
        left = self.conns.get(owner, 0) - 1
        if left > 0:
            self.conns[owner] = left
            return
        self.conns.pop(owner, None)
        self.seen.pop(owner, None)
        self.registered.discard(owner)
        if peer_gone:
            self.gone.add(owner)

    def vouched(self, now: float) -> list[str]:
        """The owners alive here (the silent ones forgotten first, and marked gone)."""
        for owner in [o for o, t in self.seen.items() if t < now - self.silent_s]:
            del self.seen[owner]
            self.registered.discard(owner)
            self.gone.add(owner)
        return sorted(self.seen)


@dataclass
class Session:
    """What this process keeps beside its client: Redis's clock, the owners of slots it hears
    from, the call timeout, and how many calls failed so far (a failure is followed by a
    reconnection: Redis restarted, failed over, stopped, frozen or unreachable in between). The
    leases themselves are in Redis (keys.leases, keys.OWNERS: renew)."""

    clock: Clock = field(default_factory=Clock)
    owners: Owners = field(default_factory=Owners)
    timeout_s: float = TIMEOUT_S
    failures: int = 0
    layout: url.Layout = "single"


_SESSIONS: weakref.WeakKeyDictionary[Client, Session] = weakref.WeakKeyDictionary()


def session(redis: Client) -> Session:
    """The clock and the owners of ``redis`` (one per client: the service has one)."""
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
    ``owner``: the proxy holding the slots (Owners): written into its index first (keys.leases),
    from which every limiter renews them while the owner may be alive (renew). ``until``
    (monotonic): when the caller gives up, if sooner than the client's timeout (call_timeout)."""
    clock = await synced(redis)
    names: list[str] = []
    deadline = clock.deadline_us(call_timeout(redis, until))
    held = [(z, k) for z, k, _c in zones if isinstance(z, ConcurrencyZone)]
    clustered = session(redis).layout == "cluster"
    if held and owner and owner not in session(redis).owners.registered:
        await _register(redis, clock, owner)
    if held and clustered:      # the index's own hash slot: written first
        await _index(redis, clock, held, slot, lease_s, owner)
    args: list[str | int | float] = [slot, deadline, clock.floor_us if floor else 0]
    for zone, key, cost in zones:
        if isinstance(zone, ConcurrencyZone):
            names.append(keys.slots(zone.name, key))
            ttl_ms = round(zone.slot_ttl_s * 1000)
            args += ("s", zone.limit, min(ttl_ms, round(lease_s * 1000)), ttl_ms)
        else:
            names.append(keys.bucket(zone.name, key))
            args += ("r" if isinstance(zone, RateZone) else "t", zone.per_second, zone.capacity, cost)
    if held and not clustered:  # the index, in the same atomic call
        names.append(keys.leases(owner))
        args += ("i", _keep_ms(held, lease_s), 0, 0)
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
    return Reserved(refused, tuple(answers))


async def _register(redis: Client, clock: Clock, owner: str) -> None:
    """``owner`` entered into the registry before its first slot here (renew vouches for it on
    every step after): a limiter that starts after this one is killed finds its slots."""
    try:
        await redis.hset(keys.OWNERS, owner, clock.redis_ms(time.monotonic()))
    except (RedisError, OSError) as exc:
        raise await _unavailable(redis, exc) from None
    session(redis).owners.registered.add(owner)


def _keep_ms(held: Sequence[tuple[ConcurrencyZone, str]], lease_s: float) -> int:
    """How long an owner's index lives at least after a slot entered it."""
    return round((max(z.slot_ttl_s for z, _k in held) + lease_s) * 1000)


async def _index(redis: Client, clock: Clock, held: Sequence[tuple[ConcurrencyZone, str]], slot: str,
                 lease_s: float, owner: str) -> None:
    """In a Cluster: the slots ``slot`` is about to take, written first into ``owner``'s index
    (scripts.INDEX: its own hash slot), each until its zone's slot_ttl_s from now, so that no
    slot exists without its entry (elsewhere ACQUIRE writes the index itself)."""
    if not held:
        return
    now_ms = clock.redis_ms(time.monotonic())
    entries: list[str | int] = []
    for zone, key in held:
        entries += (f"{keys.slots(zone.name, key)} {slot}", now_ms + round(zone.slot_ttl_s * 1000))
    try:
        await scripts.run(redis, scripts.INDEX, keys.leases(owner), (_keep_ms(held, lease_s), *entries))
    except (RedisError, OSError) as exc:
        raise await _unavailable(redis, exc) from None


async def renew(redis: Client, lease_s: float) -> int:
    """One renewal step of this process (every third of a lease), from the leases' facts in Redis,
    so that any limiter carries on what another admitted:

    1. the owners this process saw go leave the registry (keys.OWNERS), the owners alive here
       that it registered (reserve: those it took slots for) are vouched for in it (Owners);
    2. the owners to carry: those, every other one in the registry (vouched for by
       another limiter, or by one that is gone: nobody can say their proxy is dead, so their
       slots are kept, each until its zone's slot_ttl_s: never more than the plan, a bounded
       hold), and keys.ANONYMOUS;
    3. each one's index (keys.leases): every slot before its until gets ``lease_s`` more
       (scripts.RENEW, one call per slots key, sent together); a slot released, expired or past
       its until is taken out of the index (never brought back), and an owner of the registry
       with an empty index out of the registry.

    The number renewed. A Redis failure: StoreUnavailableError (tried again next time)."""
    own = session(redis)
    try:
        clock = await synced(redis)
        now = time.monotonic()
        here = own.owners.vouched(now)
        gone = sorted(own.owners.gone)
        now_ms = clock.redis_ms(now)
        if gone:
            await redis.hdel(keys.OWNERS, *gone)
            own.owners.gone.difference_update(gone)
        mine = [o for o in here if o in own.owners.registered]     # the rest hold no slot here
        if mine:
            await redis.hset(keys.OWNERS, mapping=dict.fromkeys(mine, now_ms))
        vouched = {_text(o): _ms(t) for o, t in (await redis.hgetall(keys.OWNERS)).items()}
        registry = set(vouched) - set(gone)
        owners = sorted(registry | set(mine) | {keys.ANONYMOUS})
        indexes = await asyncio.gather(*(redis.hgetall(keys.leases(o)) for o in owners))
        renewing: dict[str, list[tuple[str, str]]] = {}     # slots key -> [(owner, slot id)]
        lapsed: dict[str, list[str]] = {}                    # owner -> its index entries to drop
        lease_ms = round(lease_s * 1000)
        # out of the registry: an owner without slots that no limiter vouched for within a lease
        empty = [o for o, index in zip(owners, indexes, strict=True)
                 if not index and o in registry and o not in here and vouched[o] < now_ms - lease_ms]
        for owner, index in zip(owners, indexes, strict=True):
            for name, until in index.items():
                entry = _text(name)
                key, _sp, slot = entry.partition(" ")
                if not slot or _ms(until) <= now_ms:
                    lapsed.setdefault(owner, []).append(entry)
                else:
                    renewing.setdefault(key, []).append((owner, slot))
        answers = await asyncio.gather(*(scripts.run(redis, scripts.RENEW, key,
                                                     (lease_ms, *(slot for _o, slot in held)))
                                         for key, held in renewing.items()))
        renewed = 0
        for (key, held), missing in zip(renewing.items(), answers, strict=True):
            for i in missing:
                owner, slot = held[i - 1]
                lapsed.setdefault(owner, []).append(f"{key} {slot}")
            renewed += len(held) - len(missing)
        await asyncio.gather(*(redis.hdel(keys.leases(o), *entries) for o, entries in lapsed.items()),
                             *([redis.hdel(keys.OWNERS, *empty)] if empty else []))
    except (RedisError, OSError) as exc:
        raise await _unavailable(redis, exc) from None
    return renewed


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _ms(value: bytes | str) -> int:
    """A time the registry or an index holds (Redis ms); 0 (long past) for one that is not a number,
    so that nothing another writer put there stops the renewals."""
    text = _text(value)
    return int(text) if text.isdigit() else 0


async def release(redis: Client, zone: ConcurrencyZone, key: str, slot: str) -> bool:
    """Free ``slot``; False when it was not held (released already, or expired). Its index entry
    goes at the next renewal step (renew: RENEW reports it gone)."""
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
