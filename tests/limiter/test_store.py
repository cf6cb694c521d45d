"""The Redis scripts' semantics against a real redis-server (scanner/limiter/store.py, scripts.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from scanner import store_url as url_
from scanner.errors import StoreUnavailableError, UsageError
from scanner.limiter import keys, store
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone
from scanner.runtime.process import ManagedProcess
from tests.limiter.harness import redis_process, run, url


def test_rate_admits_burst_plus_one_then_the_rate(redis_server: ManagedProcess) -> None:
    zone = RateZone("rate-burst", rps=10, burst=4)

    async def go(r: Redis) -> tuple[list[bool], float | None, bool]:
        answers = [await store.take(r, zone, "alice", 1) for _ in range(7)]
        wait = answers[-1].wait_s
        await asyncio.sleep(0.11)
        later = await store.take(r, zone, "alice", 1)
        return [a.admitted for a in answers], wait, later.admitted

    admitted, wait, later = run(go, redis_server)
    assert admitted == [True] * 5 + [False, False]          # burst + 1 at once, as NGINX limit_req
    assert wait is not None and 0.05 < wait <= 0.1          # the next token in < 1/rps
    assert later                                            # refilled at the rate


def test_rate_holds_its_value_over_a_second(redis_server: ManagedProcess) -> None:
    zone = RateZone("rate-value", rps=20, burst=2)

    async def go(r: Redis) -> tuple[int, float]:
        start, admitted = time.monotonic(), 0
        for _ in range(3000):
            if time.monotonic() - start >= 1.0:
                break
            admitted += (await store.take(r, zone, "bob", 1)).admitted
        return admitted, time.monotonic() - start

    admitted, elapsed = run(go, redis_server)
    expected = zone.capacity + zone.rps * elapsed
    assert expected - 1.5 <= admitted <= expected + 1, (admitted, elapsed)


def test_keys_are_separate_and_expire(redis_server: ManagedProcess) -> None:
    rate, tokens, conc = RateZone("r-ttl", 5, 0), TokenZone("t-ttl", 100), ConcurrencyZone("c-ttl", 1, 2.0)

    async def go(r: Redis) -> tuple[bool, bool, list[int]]:
        a = await store.take(r, rate, "k1", 1)
        b = await store.take(r, rate, "k2", 1)          # another key: its own bucket
        await store.take(r, tokens, "k1", 10)
        await store.hold(r, conc, "k1", "s1")
        ttls = [int(await r.pttl(k)) for k in (keys.bucket("r-ttl", "k1"), keys.bucket("t-ttl", "k1"),
                                                keys.slots("c-ttl", "k1"))]
        return a.admitted, b.admitted, ttls

    a, b, ttls = run(go, redis_server)
    assert a and b
    # rate: refilled in 1/5 s + 1 s; tokens: 60 s + 1 s; slots: with the last slot (2 s)
    assert 0 < ttls[0] <= 1200 and 60000 < ttls[1] <= 61000 and 1000 < ttls[2] <= 2001, ttls


def test_token_budget_reserve_refund_and_retry_after(redis_server: ManagedProcess) -> None:
    zone = TokenZone("tokens", per_minute=600)        # 10 tokens a second

    async def go(r: Redis) -> list[object]:
        first = await store.take(r, zone, "carol", 500)
        over = await store.take(r, zone, "carol", 200)
        refunded = await store.give(r, zone, "carol", 300)
        again = await store.take(r, zone, "carol", 200)
        capped = await store.give(r, zone, "carol", 10**6)
        never = await store.take(r, zone, "carol", 601)
        return [first, over, refunded, again, capped, never]

    first, over, refunded, again, capped, never = run(go, redis_server)
    assert first.admitted and first.left == 100
    assert not over.admitted and over.wait_s is not None and 9.5 < over.wait_s <= 10.0   # (200 - 100) / 10
    assert refunded.left == 400 and again.admitted and again.left == 200
    assert capped.left == 600                          # a refund never grows the bucket past its size
    assert not never.admitted and never.wait_s is None


def test_concurrency_slots_release_and_expiry(redis_server: ManagedProcess) -> None:
    zone = ConcurrencyZone("conc", limit=2, slot_ttl_s=1.0)

    async def go(r: Redis) -> list[object]:
        a = await store.hold(r, zone, "dave", "a")
        b = await store.hold(r, zone, "dave", "b")
        c = await store.hold(r, zone, "dave", "c")
        a_again = await store.hold(r, zone, "dave", "a")     # a retried call: the same slot, admitted
        freed = await store.release(r, zone, "dave", "a")
        freed_twice = await store.release(r, zone, "dave", "a")
        c2 = await store.hold(r, zone, "dave", "c")
        d = await store.hold(r, zone, "dave", "d")
        await asyncio.sleep(1.05)                             # b and c were never released: expired
        d2 = await store.hold(r, zone, "dave", "d")
        return [a, b, c, a_again, freed, freed_twice, c2, d, d2]

    a, b, c, a_again, freed, freed_twice, c2, d, d2 = run(go, redis_server)
    assert a.admitted and b.admitted and not c.admitted and 0.9 < c.wait_s <= 1.0
    assert a_again.admitted and a_again.live == 2
    assert freed is True and freed_twice is False
    assert c2.admitted and not d.admitted
    assert d2.admitted and d2.live == 1


def test_two_proxies_share_one_limit(redis_server: ManagedProcess) -> None:
    """Two clients ("proxies") interleaved on one key: the sum admitted is exactly the limit."""
    rate = RateZone("shared-rate", rps=0.001, burst=9)           # 10 at once, then 1 in 1000 s
    tokens = TokenZone("shared-tokens", per_minute=1000)         # 10 of cost 100 (+1.7 a 100 ms)
    conc = ConcurrencyZone("shared-conc", limit=3, slot_ttl_s=60)

    async def proxy(n: int) -> tuple[int, int, int]:
        client = store.connect(store.StoreSpec(url(redis_server)))
        try:
            got = [0, 0, 0]
            for i in range(20):
                got[0] += (await store.take(client, rate, "eve", 1)).admitted
                got[1] += (await store.take(client, tokens, "eve", 100)).admitted
                got[2] += (await store.hold(client, conc, "eve", f"p{n}-{i}")).admitted
            return got[0], got[1], got[2]
        finally:
            await client.aclose()

    async def both() -> list[tuple[int, int, int]]:
        return list(await asyncio.gather(proxy(1), proxy(2)))

    one, two = asyncio.run(both())
    assert (one[0] + two[0], one[1] + two[1], one[2] + two[2]) == (10, 10, 3)
    assert min(one) > 0 and min(two) > 0, (one, two)          # both really took part


def test_noscript_falls_back_to_eval(redis_server: ManagedProcess) -> None:
    zone = RateZone("noscript", rps=1, burst=1)

    async def go(r: Redis) -> tuple[bool, bool]:
        first = await store.take(r, zone, "k", 1)
        await r.script_flush()
        second = await store.take(r, zone, "k", 1)       # EVALSHA -> NOSCRIPT -> EVAL
        return first.admitted, second.admitted

    assert run(go, redis_server) == (True, True)


def test_store_down_is_unavailable_without_secrets(tmp_path: Path) -> None:
    proc = redis_process(tmp_path).start()
    zone = RateZone("down", rps=1, burst=1)

    async def go() -> str:
        client = store.connect(store.StoreSpec(url(proc)))
        try:
            assert (await store.take(client, zone, "k", 1)).admitted
            proc.stop()
            with pytest.raises(StoreUnavailableError) as err:
                await store.take(client, zone, "k", 1)
            return str(err.value)
        finally:
            await client.aclose()

    try:
        message = asyncio.run(go())
    finally:
        proc.stop()
    assert message.startswith("shared store unavailable (") and "127.0.0.1" not in message


@pytest.mark.parametrize("bad", ["http://h:1", "redis://:pw@h:1", "redis://h:x", "redis:///0",
                                 "redis://a:1,b:2/0", "redis+sentinel://s:26379", "redis+sentinel://:pw@s:1/m",
                                 "redis+cluster://a:1/3", "redis+cluster://a:1,:2", "redis://h:1/x"])
def test_bad_redis_url_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError) as err:
        store.connect(store.StoreSpec(bad))
    assert "pw" not in str(err.value)


@pytest.mark.parametrize(("text", "parsed"), [
    ("redis://127.0.0.1:6380/2", url_.Parsed("single", (("127.0.0.1", 6380),), 2, None, False)),
    ("rediss://user@redis.internal/0", url_.Parsed("single", (("redis.internal", 6379),), 0, "user", True)),
    ("redis+sentinel://10.0.0.1,10.0.0.2:26380/mymaster/1",
     url_.Parsed("sentinel", (("10.0.0.1", 26379), ("10.0.0.2", 26380)), 1, None, False, "mymaster")),
    ("rediss+cluster://n1:7000,n2:7001", url_.Parsed("cluster", (("n1", 7000), ("n2", 7001)), 0, None, True)),
])
def test_store_urls(text: str, parsed: url_.Parsed) -> None:
    assert url_.parse_url(text) == parsed


def test_a_frozen_store_times_out_then_recovers(tmp_path: Path) -> None:
    """Redis stopped with SIGSTOP: every call waiting fails within the timeout (never admitted);
    continued, the next call is answered on a fresh connection."""
    import os
    import signal

    proc = redis_process(tmp_path).start()
    zone = RateZone("frozen", rps=1000, burst=1000)
    pid = proc._proc.pid if proc._proc else 0

    async def go() -> tuple[int, float, bool]:
        client = store.connect(store.StoreSpec(url(proc), timeout_s=0.3))
        try:
            assert (await store.take(client, zone, "k", 1)).admitted
            os.kill(pid, signal.SIGSTOP)
            t = time.monotonic()
            try:
                answers = await asyncio.gather(*(store.take(client, zone, "k", 1) for _ in range(5)),
                                               return_exceptions=True)
            finally:
                os.kill(pid, signal.SIGCONT)
            waited = time.monotonic() - t
            failed = sum(isinstance(a, StoreUnavailableError) for a in answers)
            return failed, waited, (await store.take(client, zone, "k", 1)).admitted
        finally:
            await client.aclose()

    try:
        failed, waited, after = asyncio.run(go())
    finally:
        proc.stop()
    assert failed == 5 and waited < 2.0 and after


def test_password_file(tmp_path: Path) -> None:
    proc = redis_process(tmp_path, ("--requirepass", "s3cret-pass")).start()
    (tmp_path / "pw").write_text("s3cret-pass\n")
    (tmp_path / "wrong").write_text("nope\n")

    async def go(pw: str) -> None:
        client = store.connect(store.StoreSpec(url(proc), password_file=tmp_path / pw))
        try:
            await store.ping(client)
        finally:
            await client.aclose()

    try:
        asyncio.run(go("pw"))
        with pytest.raises(StoreUnavailableError) as err:
            asyncio.run(go("wrong"))
        assert "nope" not in str(err.value) and "s3cret" not in str(err.value)
    finally:
        proc.stop()


def test_tls_with_a_ca_file(tmp_path: Path) -> None:
    """rediss:// with --redis-ca-file: verified against that CA (and the host name); without it
    the system CAs do not know the server: unavailable, never an unverified connection."""
    from scanner.net import free_port
    from tests.generate.certs import CertAuthority
    from tests.limiter.harness import redis_binary

    ca = CertAuthority(tmp_path)
    server = ca.issue("redis", dns=("localhost",), ips=("127.0.0.1",))
    port = free_port()
    argv = [redis_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path), "--tls-cert-file", str(server.cert),
            "--tls-key-file", str(server.key), "--tls-ca-cert-file", str(ca.pair.cert), "--tls-auth-clients", "no"]
    proc = ManagedProcess("redis-tls", argv, "127.0.0.1", port, log=tmp_path / "redis.log").start()

    async def go(ca_file: Path | None) -> bool:
        client = store.connect(store.StoreSpec(f"rediss://localhost:{port}/0", ca_file=ca_file))
        try:
            return (await store.take(client, RateZone("tls", 1, 1), "k", 1)).admitted
        finally:
            await client.aclose()

    try:
        assert asyncio.run(go(ca.pair.cert)) is True
        with pytest.raises(StoreUnavailableError):
            asyncio.run(go(None))
    finally:
        proc.stop()


def test_more_calls_in_flight_than_connections(redis_server: ManagedProcess) -> None:
    """200 calls at once on a client of 4 connections: every one answered, the limit exact."""
    zone = RateZone("flood", rps=0.001, burst=49)

    async def go() -> list[bool]:
        client = store.connect(store.StoreSpec(url(redis_server), max_connections=4))
        try:
            answers = await asyncio.gather(*(store.take(client, zone, "k", 1) for _ in range(200)))
            return [a.admitted for a in answers]
        finally:
            await client.aclose()

    assert asyncio.run(go()).count(True) == 50


def test_a_refusal_gives_back_what_later_zones_took(redis_server: ManagedProcess) -> None:
    """The zones are asked at once; the outcome is the ordered one: a request refused for its rate
    holds no slot and is charged no tokens (what those zones took is given back)."""
    from scanner.limiter import config as zones_config
    from scanner.limiter import decide
    from tests.limiter.harness import ZONES, run

    config = zones_config.parse(ZONES)
    key = "ordered"

    async def main(redis: Redis) -> tuple[bool, bool, tuple[bool, ...]]:
        for _ in range(4):                             # burst 3: 4 at once, then the rate
            assert (await decide.acquire(redis, config, [decide.Call("rate:2/3", key)])).admitted
        refused = await decide.acquire(redis, config, [decide.Call("rate:2/3", key), decide.Call("conc:2", key),
                                                        decide.Call("tokens:600", key, 500)], "s1")
        assert refused.refusal is not None and refused.refusal.zone.name == "rate:2/3"
        whole = await decide.acquire(redis, config, [decide.Call("conc:2", key),
                                                      decide.Call("tokens:600", key, 600)], "s2")
        other = await decide.acquire(redis, config, [decide.Call("conc:2", key)], "s3")
        return whole.admitted, other.admitted, tuple(s.evaluated for s in refused.statuses)

    assert run(main, redis_server) == (True, True, (True, False, False))


def test_a_reservation_over_several_zones_is_one_redis_call(redis_server: ManagedProcess) -> None:
    """Rate, concurrency and tokens of one request: one command sent to Redis (an EVALSHA), and
    the keys of one request share a Redis Cluster hash slot."""
    from scanner.limiter import config as zones_config
    from scanner.limiter import decide
    from tests.limiter.harness import ZONES, run

    config = zones_config.parse(ZONES)
    three = [decide.Call("wide", "one"), decide.Call("conc:2", "one"), decide.Call("tokens:600", "one", 5)]

    async def main(redis: Redis) -> tuple[int, bool, set[int]]:
        await decide.acquire(redis, config, three, "warm")       # the script cached (EVAL once at most)
        sent: list[object] = []
        real = redis.execute_command

        async def counted(*args: object, **options: object) -> object:
            sent.append(args[0])
            return await real(*args, **options)
        redis.execute_command = counted  # type: ignore[method-assign]
        verdict = await decide.acquire(redis, config, three, "s1")
        calls = len(sent) if sent == ["EVALSHA"] else -len(sent)
        tags = {key_slot(k.encode())
                for k in (keys.bucket("wide", "one"), keys.slots("conc:2", "one"), keys.bucket("tokens:600", "one"))}
        return calls, verdict.admitted, tags

    calls, admitted, tags = run(main, redis_server)
    assert admitted and calls == 1 and len(tags) == 1


def test_a_refusal_in_the_middle_keeps_the_rate_and_takes_nothing_after(redis_server: ManagedProcess) -> None:
    """Concurrency refuses: the rate zone before it stays charged (limit_req counted the request),
    the token zone after it is neither asked nor charged, and no slot is held by the refused one."""
    from scanner.limiter import config as zones_config
    from scanner.limiter import decide
    from tests.limiter.harness import ZONES, run

    config = zones_config.parse(ZONES)
    key = "middle"

    async def main(redis: Redis) -> tuple[bool, tuple[bool, ...], int, int, int]:
        for slot in ("a", "b"):
            assert (await decide.acquire(redis, config, [decide.Call("conc:2", key)], slot)).admitted
        refused = await decide.acquire(redis, config, [decide.Call("rate:2/3", key), decide.Call("conc:2", key),
                                                        decide.Call("tokens:600", key, 600)], "c")
        rate_left = int(float(await redis.hget(keys.bucket("rate:2/3", key), "v") or -1))
        tokens_there = int(await redis.exists(keys.bucket("tokens:600", key)))
        live = int(await redis.zcard(keys.slots("conc:2", key)))
        return refused.admitted, tuple(s.evaluated for s in refused.statuses), rate_left, tokens_there, live

    admitted, evaluated, rate_left, tokens_there, live = run(main, redis_server)
    assert not admitted and evaluated == (True, True, False)
    assert rate_left == 3 and tokens_there == 0 and live == 2


def test_a_release_in_flight_lands_before_a_concurrency_refusal(redis_server: ManagedProcess) -> None:
    """Both slots held; one is released 10 ms after the next acquire started (its release was
    on its way, decide.RELEASE_WAITS_S): admitted, its rate charged once. With no release it is
    still refused after the waits, and the rate zone is charged once for all the tries."""
    from scanner.limiter import config as zones_config
    from scanner.limiter import decide
    from tests.limiter.harness import ZONES, run

    config = zones_config.parse(ZONES)
    key = "in-flight"
    calls = [decide.Call("rate:2/3", key), decide.Call("conc:2", key)]

    async def main(redis: Redis) -> tuple[bool, bool, float, int, int]:
        for slot in ("a", "b"):
            assert (await decide.acquire(redis, config, [decide.Call("conc:2", key)], slot)).admitted

        async def late_release() -> None:
            await asyncio.sleep(0.01)
            assert await decide.release(redis, config, ["conc:2"], key, "a")

        started = time.monotonic()
        landed, _ = await asyncio.gather(decide.acquire(redis, config, calls, "c"), late_release())
        refused = await decide.acquire(redis, config, calls, "d")        # b and c held: nothing on its way
        waited = time.monotonic() - started
        rate_left = int(float(await redis.hget(keys.bucket("rate:2/3", key), "v") or -1))
        live = int(await redis.zcard(keys.slots("conc:2", key)))
        return landed.admitted, refused.admitted, waited, rate_left, live

    landed, refused, waited, rate_left, live = run(main, redis_server)
    assert landed and not refused and live == 2
    assert waited >= sum(decide.RELEASE_WAITS_S)          # the refusal came after the waits
    assert rate_left == 2                                 # capacity 4, two requests: one token each


def test_a_call_given_up_by_its_caller_writes_nothing(redis_server: ManagedProcess) -> None:
    """Envoy ends a try at its per-try timeout and sends the call again (scanner.limiter.server.
    try_timeout): an acquire or a refund whose caller has given up (``until`` passed) writes
    nothing, so the retry is the only one charged or refunded."""
    from scanner.limiter import config as zones_config
    from scanner.limiter import decide
    from tests.limiter.harness import ZONES, run

    config = zones_config.parse(ZONES)
    key = "given-up"
    calls = [decide.Call("rate:2/3", key), decide.Call("conc:2", key), decide.Call("tokens:600", key, 100)]

    async def main(redis: Redis) -> tuple[list[str], int, int, int]:
        late: list[str] = []
        for call in (decide.acquire(redis, config, calls, "a", until=time.monotonic() - 0.01),
                     decide.settle(redis, config, "tokens:600", key, 50, until=time.monotonic() - 0.01)):
            try:
                await call
            except StoreUnavailableError as exc:
                late.append(str(exc))
        written = int(await redis.exists(keys.bucket("rate:2/3", key), keys.slots("conc:2", key),
                                          keys.bucket("tokens:600", key)))
        again = await decide.acquire(redis, config, calls, "a", until=time.monotonic() + 0.25)
        assert again.admitted
        tokens = int(float(await redis.hget(keys.bucket("tokens:600", key), "v") or -1))
        refunded = await decide.settle(redis, config, "tokens:600", key, 40, until=time.monotonic() + 0.25)
        return late, written, tokens, refunded

    late, written, tokens, refunded = run(main, redis_server)
    assert len(late) == 2 and all("late" in m for m in late)
    assert written == 0                                   # neither call touched Redis
    assert tokens == 500 and refunded == 540              # charged once, refunded once


def test_leases_live_in_redis_and_any_limiter_carries_them(redis_server: ManagedProcess) -> None:
    """Two limiters (two clients, each its own session) on one Redis: the slots one admitted are
    renewed by the other, which never heard their owners (the registry, each owner's index); an
    owner seen gone (its connection closed by its peer) leaves the registry and nobody renews it
    any more; a released slot leaves its index; an expired one is never renewed back."""
    from scanner.limiter import scripts

    zone = ConcurrencyZone("c-carry", 3, 30.0)
    own_db = f"redis://127.0.0.1:{redis_server.port}/7"     # the anonymous index: this test's own

    async def go(_r: Redis) -> list[object]:
        a = store.connect(store.StoreSpec(own_db, timeout_s=5.0))
        b = store.connect(store.StoreSpec(own_db, timeout_s=5.0))
        seen: list[object] = []
        try:
            await a.flushdb()
            store.session(a).owners.opened("envoy:W")                       # a worker's connection
            await store.reserve(a, [(zone, "k", 1)], "s1", 1.0, owner="envoy:W")
            await store.reserve(a, [(zone, "k", 1)], "s2", 1.0)              # naming no owner
            seen.append(await store.renew(b, 1.0))                            # b carries both
            store.session(a).owners.closed("envoy:W")                        # closed by the worker
            await store.renew(a, 1.0)                                         # out of the registry
            seen.append(await store.renew(b, 1.0))                            # the anonymous one only
            await store.release(a, zone, "k", "s2")
            seen.append(await store.renew(b, 1.0))
            seen.append(await a.hlen(keys.leases("")))                        # its entry gone
            slots = keys.slots(zone.name, "k")
            await a.zadd(slots, {"old": 1})                                   # expired long ago
            seen.append(await scripts.run(a, scripts.RENEW, slots, (1000, "old")))
            seen.append(await a.zscore(slots, "old"))
        finally:
            await a.flushdb()
            await a.aclose()
            await b.aclose()
        return seen

    assert run(go, redis_server) == [2, 1, 0, 0, [1], 1.0]


def test_what_another_writer_left_in_the_leases_does_not_stop_the_renewals(redis_server: ManagedProcess) -> None:
    """A registry entry and index entries that are not the limiter's shape (no number, no slot id)
    are dropped as lapsed; the slot beside them is still renewed."""
    zone = ConcurrencyZone("c-odd", 2, 30.0)
    own_db = f"redis://127.0.0.1:{redis_server.port}/8"

    async def go(_r: Redis) -> tuple[int, int, list[bytes]]:
        a = store.connect(store.StoreSpec(own_db, timeout_s=5.0))
        try:
            await a.flushdb()
            await store.reserve(a, [(zone, "k", 1)], "s1", 1.0, owner="replica:odd")
            await a.hset(keys.OWNERS, "replica:odd", "soon")
            await a.hset(keys.leases("replica:odd"), mapping={"no-slot-id": "1", f"{keys.slots(zone.name, 'k')} s9": "x"})
            renewed = await store.renew(a, 1.0)
            return renewed, int(await a.hlen(keys.leases("replica:odd"))), await a.hkeys(keys.leases("replica:odd"))
        finally:
            await a.flushdb()
            await a.aclose()

    renewed, left, names = run(go, redis_server)
    assert (renewed, left) == (1, 1) and names == [f"{keys.slots('c-odd', 'k')} s1".encode()]
