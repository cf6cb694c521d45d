"""A limiter restarted mid-stream (issue 27, item 2: "a limiter restart"): the leases' facts are in
Redis (each slot in its owner's index, the owners a limiter vouches for in the registry:
scanner.limiter.store.renew), so the restarted limiter carries on the slots of the streams in
flight, and the principal's next request is still refused 429 ``concurrency`` after more than a
lease; the slots come back when the streams end.

Two replicas, the limiter, one Redis (tests.limiter.fleet), a lease of LEASE_S, streams of about
10 s: two streams on replica A hold the principal's 2 slots; the limiter is SIGKILLed and started
again (same port); past the lease and a renewal step since the kill, a third request through B
and through A is refused; the streams end, the principal is admitted again.

Before the leases were in Redis (the limiter kept them in its memory), the restarted limiter
renewed nothing: the slots lapsed within the lease while the streams still ran and the third
request was admitted (NGINX 1.31 and Envoy 1.40: measured with this test on the tree before)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.limiter.fleet import CONCURRENCY, FleetStack, chat
from tests.limiter.harness import restart
from tests.probe.realproxy import proxy_named

LEASE_S = 3.0
STREAM_DELAY_S = 1.5     # the stand-in's STREAM_TOKENS a stream, 1.5 s apart: about 10.5 s a stream
STREAM_TOKENS = 7
# past the lease and a renewal step (a third of a lease) since the kill, and a margin: a slot
# nobody renewed is gone by then
LAPSED_S = LEASE_S + LEASE_S / 3 + 1.0


@pytest.fixture(params=[pytest.param("envoy", marks=pytest.mark.envoy),
                        pytest.param("nginx", marks=pytest.mark.nginx)])
def stack(request: pytest.FixtureRequest) -> Iterator[FleetStack]:
    s = FleetStack(proxy_named(request.param), tokens=False, stream_delay=STREAM_DELAY_S,
                   slot_lease_s=LEASE_S)
    try:
        yield s.start()
    finally:
        s.stop()


def _answer(stack: FleetStack, replica: int) -> tuple[int, str]:
    status, reason, _ = stack.call(replica, "POST", "/v1/chat/completions", chat(5))
    return status, reason


def test_a_restarted_limiter_carries_on_the_slots_of_streams_in_flight(stack: FleetStack) -> None:
    held = [stack.open(0, "POST", "/v1/chat/completions", chat(STREAM_TOKENS, stream=True)) for _ in range(CONCURRENCY)]
    opened = time.monotonic()
    assert [h.status for h in held] == [200] * CONCURRENCY
    assert _answer(stack, 1) == (429, "concurrency")             # both slots held, through B too
    limiter = stack.fleet.limiter
    assert limiter._proc is not None
    os.killpg(limiter._proc.pid, signal.SIGKILL)                 # mid-stream: no goodbye
    killed = time.monotonic()
    limiter.stop()                                               # reaped
    restart(limiter)                                             # the same port, a new process
    down_s = time.monotonic() - killed
    time.sleep(max(0.0, killed + LAPSED_S - time.monotonic()))
    after = [_answer(stack, 1), _answer(stack, 0)]
    since = time.monotonic() - killed
    print(f"{stack.proxy}: limiter down {down_s:.2f} s; {since:.1f} s after the kill (lease {LEASE_S} s): "
          f"B {after[0]}, A {after[1]}; slots held {stack.slots_held()}")
    assert after == [(429, "concurrency")] * 2, after
    for h in held:
        h.read()
        h.close()
    ran = time.monotonic() - opened
    assert ran > LAPSED_S + 2, ran                               # the streams outlived the restart
    stack.released()                                             # released at their end (new limiter)
    assert _answer(stack, 1) == (200, "")
    again = [stack.open(1, "POST", "/v1/chat/completions", chat(3, stream=True)) for _ in range(CONCURRENCY)]
    assert [h.status for h in again] == [200] * CONCURRENCY       # both slots back, not one
    for h in again:
        h.read()
        h.close()


def test_after_a_restart_a_killed_replica_s_slots_still_come_back_within_the_lease(stack: FleetStack) -> None:
    """The limiter restarted mid-stream carries the slots on; then replica A, which holds them, is
    SIGKILLed: the restarted limiter has heard A again (the calls through it: Envoy's worker on a
    new connection, NGINX's heartbeat), so A's slots come back within the lease (Envoy) or the
    silence + the lease (NGINX), as with a limiter that never restarted (test_fleet_kill)."""
    from scanner.limiter.config import OWNER_SILENT_S
    bound = {"envoy": LEASE_S + LEASE_S / 3 + 0.5, "nginx": OWNER_SILENT_S + LEASE_S + LEASE_S / 3 + 0.5}
    held = [stack.open(0, "POST", "/v1/chat/completions", chat(STREAM_TOKENS, stream=True))
            for _ in range(CONCURRENCY)]
    assert [h.status for h in held] == [200] * CONCURRENCY
    limiter = stack.fleet.limiter
    assert limiter._proc is not None
    os.killpg(limiter._proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    limiter.stop()
    restart(limiter)
    time.sleep(max(0.0, killed + LEASE_S + LEASE_S / 3 - time.monotonic()))
    assert [_answer(stack, 0), _answer(stack, 1)] == [(429, "concurrency")] * 2   # carried on
    replica_a = stack.fleet.replicas[0]._proc
    assert replica_a is not None
    os.killpg(replica_a.pid, signal.SIGKILL)                     # A and its workers, mid-stream
    gone = time.monotonic()
    for h in held:
        h.close()
    back = None
    for _ in range(200):
        status, reason = _answer(stack, 1)
        if status == 200:
            back = time.monotonic() - gone
            break
        assert (status, reason) == (429, "concurrency"), (status, reason)
        time.sleep(0.25)
    print(f"{stack.proxy}: after the restart, the killed replica's slots back after {back} s "
          f"(bound {bound[stack.proxy]:.1f} s)")
    assert back is not None and back <= bound[stack.proxy], back
