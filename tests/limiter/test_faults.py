"""Redis faults against the limiter service as users run it (issue 27): a frozen Redis (SIGSTOP)
runs the reservations queued meanwhile once it resumes, and they must take nothing (their deadline
passed: the limiter answered 503 already); slots are leases renewed while their request is in
flight, so a slot whose limiter is killed, or whose request outlives its zone's slot_ttl_s, comes
back within the lease, and a released one is never brought back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from redis.asyncio import Redis

from scanner.limiter import keys
from scanner.runtime.process import ManagedProcess
from tests.limiter.clients import HttpClient
from tests.limiter.harness import ZONES, limiter_process, redis_process, run, url

LEASE_S = 1.5
ZONES_LEASED = {**ZONES, "slot_lease_s": LEASE_S,
                "zones": {**ZONES["zones"],   # type: ignore[dict-item]
                          "conc:short": {"kind": "concurrency", "limit": 1, "slot_ttl_s": 3}}}


def _pid(proc: ManagedProcess) -> int:
    assert proc._proc is not None
    return proc._proc.pid


def _acquire(port: int, key: str, zones: list[str], slot: str) -> tuple[int, dict[str, object]]:
    client = HttpClient("127.0.0.1", port)
    try:
        return client.post("/v1/acquire", {"key": key, "zones": zones, "slot": slot})
    finally:
        client.close()


def _live(redis: ManagedProcess, zone: str, key: str) -> int:
    async def go(r: Redis) -> int:
        return int(await r.zcard(keys.slots(zone, key)))
    return run(go, redis)


def _unexpired(redis: ManagedProcess, zone: str, key: str) -> int:
    """Slots whose lease has not run out (an expired one stays in the set until the next acquire)."""
    async def go(r: Redis) -> int:
        sec, usec = await r.time()
        return int(await r.zcount(keys.slots(zone, key), f"({int(sec) * 1000 + int(usec) // 1000}", "+inf"))
    return run(go, redis)


def _evalsha_calls(redis: ManagedProcess) -> int:
    async def go(r: Redis) -> int:
        stats = await r.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return run(go, redis)


def test_a_frozen_redis_runs_the_queued_reservations_and_they_take_nothing(tmp_path: Path) -> None:
    redis = redis_process(tmp_path).start()
    service = limiter_process(tmp_path, url(redis))
    zones = ["rate:2/3", "conc:2"]
    try:
        service.start()
        ok = _acquire(service.port, "warm", zones, "w1")      # connected, Redis's clock learned
        assert ok[0] == 200 and ok[1]["allow"] is True
        before = _evalsha_calls(redis)
        os.kill(_pid(redis), signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(4) as pool:               # sent together: queued on one connection
                down = list(pool.map(lambda i: _acquire(service.port, "frozen", zones, f"s{i}"), range(4)))
        finally:
            os.kill(_pid(redis), signal.SIGCONT)
        assert [d[0] for d in down] == [503] * 4, down
        assert all(d[1]["reason"] == "shared-store-unavailable" for d in down)
        time.sleep(0.5)
        ran = _evalsha_calls(redis) - before
        # Redis ran what was queued once resumed (at least the first call's script), past its deadline
        assert ran >= 1, ran
        assert _live(redis, "conc:2", "frozen") == 0           # no slot taken for a refused request
        again = [_acquire(service.port, "frozen", zones, f"t{i}") for i in range(2)]
        assert [a[1]["allow"] for a in again] == [True, True]  # the principal at once: its 2 slots free
    finally:
        service.stop()
        redis.stop()


def test_slots_are_leases_renewed_in_flight_and_freed_by_a_killed_limiter(tmp_path: Path) -> None:
    redis = redis_process(tmp_path).start()
    service = limiter_process(tmp_path, url(redis), ZONES_LEASED)
    try:
        service.start()
        assert [_acquire(service.port, "k", ["conc:2"], s)[1]["allow"] for s in ("a", "b")] == [True, True]
        # released: gone, and never renewed back
        client = HttpClient("127.0.0.1", service.port)
        assert client.post("/v1/release", {"key": "k", "zones": ["conc:2"], "slot": "b"})[1] == {"released": True}
        client.close()
        # in flight (not released): renewed beyond its lease, several times
        time.sleep(3 * LEASE_S)
        assert _live(redis, "conc:2", "k") == 1
        assert _acquire(service.port, "k", ["conc:2"], "c")[1]["allow"] is True
        assert _acquire(service.port, "k", ["conc:2"], "d")[1]["reason"] == "concurrency"
        # a request that outlives its zone's slot_ttl_s (3 s): no longer renewed, back within the lease
        assert _acquire(service.port, "k", ["conc:short"], "x")[1]["allow"] is True
        time.sleep(3 + LEASE_S + 0.5)
        assert _live(redis, "conc:short", "k") == 0
        assert _live(redis, "conc:2", "k") == 2                # a and c: still renewed

        os.kill(_pid(service), signal.SIGKILL)                 # the limiter gone: nobody renews
        killed = time.monotonic()
        for _ in range(100):
            if _live(redis, "conc:2", "k") == 0:
                break
            time.sleep(0.1)
        back_after = time.monotonic() - killed
        assert _live(redis, "conc:2", "k") == 0 and back_after <= LEASE_S + 0.2, back_after
    finally:
        service.stop()
        redis.stop()


def test_a_late_reservation_is_refused_by_its_deadline(redis_server: ManagedProcess) -> None:
    """The script itself: a deadline in the past (Redis time) writes nothing and answers -1."""
    from scanner.limiter import scripts

    async def go(r: Redis) -> tuple[list[int], int, list[int]]:
        sec, usec = await r.time()
        now = int(sec) * 1_000_000 + int(usec)
        args = ("s1", now - 1, 0, "s", 2, 10_000, 0, "r", 1, 4, 1)
        names = (keys.slots("late", "k"), keys.bucket("late-r", "k"))
        late = await scripts.run_keys(r, scripts.ACQUIRE, names, args)
        exists = int(await r.exists(*names))
        on_time = await scripts.run_keys(r, scripts.ACQUIRE, names, ("s1", now + 10_000_000, *args[2:]))
        return late, exists, on_time

    late, exists, on_time = run(go, redis_server)
    assert late[0] == -1 and len(late) == 2 and exists == 0
    assert on_time[0] == 0 and on_time[2:] == [1, 1, 0, 1, 3, 0]


def test_the_floor_refills_no_outage(redis_server: ManagedProcess) -> None:
    """A bucket last written before the floor (the reconnection after an outage, under
    on_unavailable: local) holds at most what it held, refilled from the floor only; an absent
    one (a restarted Redis) starts empty there."""
    from scanner.limiter import scripts

    async def go(r: Redis) -> tuple[list[int], list[int], list[int]]:
        sec, usec = await r.time()
        now = int(sec) * 1_000_000 + int(usec)
        spent = ("x", 0, 0, "r", 1, 6, 6)               # 1 r/s, 6 at once: all six taken
        key = (keys.bucket("floor", "k"),)
        await scripts.run_keys(r, scripts.ACQUIRE, key, spent)
        await asyncio.sleep(0.3)
        floor = now + 200_000                            # "reconnected" after the take
        one = ("x", 0, floor, "r", 1, 6, 1)
        after = await scripts.run_keys(r, scripts.ACQUIRE, key, one)       # ~0.1 s of refill: none
        plain = await scripts.run_keys(r, scripts.ACQUIRE, (keys.bucket("floor2", "k"),), spent)
        absent = await scripts.run_keys(r, scripts.ACQUIRE, (keys.bucket("floor3", "k"),),
                                        ("x", 0, floor, "r", 1, 6, 1))
        return after, plain, absent

    after, plain, absent = run(go, redis_server)
    assert after[0] == 1 and after[3] == 0             # refused: empty at the floor
    assert plain[0] == 0                                # no floor: an absent bucket is full
    assert absent[0] == 1 and absent[3] == 0           # absent after a floor: empty, not full


def test_a_replica_s_slots_are_renewed_while_it_is_heard_from(tmp_path: Path) -> None:
    """An acquire naming its replica (njs >= 0.8): its slot is renewed while the replica says it
    is alive (/v1/alive), and no longer once it falls silent: back within OWNER_SILENT_S + the
    lease; a slot without a replica is renewed as before (until its zone's slot_ttl_s)."""
    from scanner.limiter.config import HEARTBEAT_S, OWNER_SILENT_S

    redis = redis_process(tmp_path).start()
    service = limiter_process(tmp_path, url(redis), ZONES_LEASED)
    try:
        service.start()
        client = HttpClient("127.0.0.1", service.port)
        taken = client.post("/v1/acquire", {"key": "r", "zones": ["conc:2"], "slot": "a", "replica": "A-1"})
        assert taken[1]["allow"] is True
        assert _acquire(service.port, "r", ["conc:2"], "plain")[1]["allow"] is True
        beats = 0
        end = time.monotonic() + OWNER_SILENT_S + 2 * LEASE_S     # past the silence and the lease
        while time.monotonic() < end and beats < 50:
            assert client.post("/v1/alive", {"replica": "A-1"}) == (200, {"alive": True})
            beats += 1
            time.sleep(HEARTBEAT_S)
        assert _unexpired(redis, "conc:2", "r") == 2                   # heard from: kept
        silent = time.monotonic()                                   # the replica killed: no word
        for _ in range(200):
            if _unexpired(redis, "conc:2", "r") == 1:
                break
            time.sleep(0.1)
        back_after = time.monotonic() - silent
        assert _unexpired(redis, "conc:2", "r") == 1, "the silent replica's slot is still held"
        assert back_after <= OWNER_SILENT_S + LEASE_S + 0.3, back_after
        assert client.post("/v1/alive", {})[0] == 400               # a heartbeat names its replica
        assert client.post("/v1/alive", {"replica": "a b"})[0] == 400
        client.close()
    finally:
        service.stop()
        redis.stop()


ZONES_TTL6 = {**ZONES_LEASED, "zones": {**ZONES_LEASED["zones"],   # type: ignore[dict-item]
                                        "conc:ttl6": {"kind": "concurrency", "limit": 1, "slot_ttl_s": 6}}}


def test_a_second_limiter_carries_on_the_leases_of_a_killed_one(tmp_path: Path) -> None:
    """Two limiters on one Redis; three slots taken through the first: an NGINX replica's (it
    heartbeats), one naming no owner (njs 0.7) and an Envoy worker's (gRPC, its owner entry; then
    idle). The first limiter SIGKILLed: the second carries all three on past the lease; the ones
    nobody can vouch for (no owner, the idle worker) until their zone's slot_ttl_s (6 s), the
    replica's while it heartbeats (to the second) and no longer once it falls silent."""
    from scanner.limiter import proto
    from scanner.limiter.config import HEARTBEAT_S, OWNER_SILENT_S
    from tests.limiter.clients import GrpcClient, descriptor

    redis = redis_process(tmp_path).start()
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    first = limiter_process(tmp_path / "first", url(redis), ZONES_TTL6)
    second = limiter_process(tmp_path / "second", url(redis), ZONES_TTL6)
    try:
        first.start()
        second.start()
        client = HttpClient("127.0.0.1", first.port)
        assert client.post("/v1/acquire", {"key": "r", "zones": ["conc:2"], "slot": "r1",
                                           "replica": "R-1"})[1]["allow"] is True
        assert client.post("/v1/acquire", {"key": "a", "zones": ["conc:ttl6"], "slot": "a1"})[1]["allow"] is True
        client.close()
        grpc = GrpcClient("127.0.0.1", first.port)
        taken = grpc.call(proto.request("vllm-perimeter", (
            descriptor("conc:ttl6", "e", ("slot", "e1"), ("owner", "W-1")),)))
        assert taken.response is not None and taken.response.overall_code == proto.CODE_OK
        admitted = time.monotonic()
        os.kill(_pid(first), signal.SIGKILL)                       # no goodbye; the worker idle
        killed = time.monotonic()
        beat = HttpClient("127.0.0.1", second.port)
        held: dict[str, list[int]] = {"r": [], "a": [], "e": []}
        end = killed + OWNER_SILENT_S + 2 * LEASE_S                # past the silence and the lease
        for _ in range(50):
            assert beat.post("/v1/alive", {"replica": "R-1"}) == (200, {"alive": True})
            if time.monotonic() - killed > LEASE_S + LEASE_S / 3 + 0.5 and time.monotonic() - admitted < 5.5:
                for key, zone in (("r", "conc:2"), ("a", "conc:ttl6"), ("e", "conc:ttl6")):
                    held[key].append(_unexpired(redis, zone, key))
            if time.monotonic() > end:
                break
            time.sleep(min(HEARTBEAT_S, 0.5))
        assert held["r"] and held == {"r": [1] * len(held["r"]), "a": [1] * len(held["a"]),
                                      "e": [1] * len(held["e"])}, held   # carried on past the lease
        assert _unexpired(redis, "conc:2", "r") == 1                 # heard from: still kept
        # past slot_ttl_s (6 s from admission) and a lease: no longer renewed
        time.sleep(max(0.0, admitted + 6 + LEASE_S + 0.3 - time.monotonic()))
        assert (_unexpired(redis, "conc:ttl6", "a"), _unexpired(redis, "conc:ttl6", "e")) == (0, 0)
        silent = time.monotonic()                                   # the replica killed
        beat.close()
        for _ in range(200):
            if _unexpired(redis, "conc:2", "r") == 0:
                break
            time.sleep(0.1)
        back_after = time.monotonic() - silent
        assert _unexpired(redis, "conc:2", "r") == 0, "the silent replica's slot is still held"
        assert back_after <= OWNER_SILENT_S + LEASE_S + LEASE_S / 3 + 0.3, back_after
        grpc.close()
    finally:
        first.stop()
        second.stop()
        redis.stop()
