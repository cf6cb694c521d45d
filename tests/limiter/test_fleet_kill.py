"""A proxy killed mid-stream (issue 27, item 2): its concurrency slots come back within seconds,
not at the slot's time to live (the route's timeout + 10 s), while a live proxy's long stream
keeps its slot. Two replicas, the limiter, one Redis (tests.limiter.fleet), a lease of LEASE_S:

* Envoy 1.40: the slots an acquire took on a gRPC connection are renewed while it is open; the
  kernel closes a killed Envoy's connections: back within the lease;
* NGINX 1.31 (njs >= 0.8): the acquire names the replica (njs replicaId), which says it is alive
  every HEARTBEAT_S (js_periodic): back within OWNER_SILENT_S + the lease;
* NGINX 1.22 (njs 0.7, no js_periodic): no replica named, the slot is renewed until its zone's
  slot_ttl_s as before (not tested here: docs/shared-limits.md says so).

Replica A is SIGKILLed with its whole process group (started by the test), in the middle of two
streams holding both slots of the principal; then the principal asks replica B until admitted."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from scanner.limiter.config import OWNER_SILENT_S
from tests.limiter.fleet import CONCURRENCY, FleetStack, chat
from tests.probe.realproxy import proxy_named

LEASE_S = 3.0
STREAM_DELAY_S = 1.5     # the stand-in's 10 tokens a stream, 1.5 s apart: about 16 s a stream
# back within: Envoy the lease (its connection closes at the kill), NGINX the silence that marks a
# replica gone + the lease; plus the limiter's renewal step (a third of a lease) and a poll's step
BOUND_S = {"envoy": LEASE_S + LEASE_S / 3 + 0.5, "nginx": OWNER_SILENT_S + LEASE_S + LEASE_S / 3 + 0.5}


@pytest.fixture(params=[pytest.param("envoy", marks=pytest.mark.envoy),
                        pytest.param("nginx", marks=pytest.mark.nginx)])
def stack(request: pytest.FixtureRequest) -> Iterator[FleetStack]:
    s = FleetStack(proxy_named(request.param), tokens=False, stream_delay=STREAM_DELAY_S,
                   slot_lease_s=LEASE_S)
    try:
        yield s.start()
    finally:
        s.stop()


def _refused_for_concurrency(stack: FleetStack, replica: int) -> bool:
    return stack.call(replica, "POST", "/v1/chat/completions", chat(5))[:2] == (429, "concurrency")


def test_a_long_stream_on_a_live_replica_keeps_its_slot(stack: FleetStack) -> None:
    held = [stack.open(0, "POST", "/v1/chat/completions", chat(10, stream=True)) for _ in range(CONCURRENCY)]
    start = time.monotonic()
    assert [h.status for h in held] == [200] * CONCURRENCY
    # past the silence that would mark the replica gone, the lease and a renewal step: without
    # its heartbeat (or its connection) the slots would be gone by now; both still held
    time.sleep(OWNER_SILENT_S + LEASE_S + LEASE_S / 3 + 1.0)
    assert _refused_for_concurrency(stack, 1), "a live replica's stream lost its slot"
    assert _refused_for_concurrency(stack, 0)
    for h in held:
        h.read()
        h.close()
    ran = time.monotonic() - start
    assert ran > OWNER_SILENT_S + LEASE_S, ran                  # the streams outlived the lease
    time.sleep(0.5)
    assert stack.call(1, "POST", "/v1/chat/completions", chat(5))[0] == 200   # released at the end


def test_a_killed_replica_s_slots_come_back_within_the_lease(stack: FleetStack) -> None:
    held = [stack.open(0, "POST", "/v1/chat/completions", chat(10, stream=True)) for _ in range(CONCURRENCY)]
    assert [h.status for h in held] == [200] * CONCURRENCY
    assert _refused_for_concurrency(stack, 1)                    # both slots held, through B too
    replica_a = stack.fleet.replicas[0]._proc
    assert replica_a is not None
    os.killpg(replica_a.pid, signal.SIGKILL)                     # A and its workers, mid-stream
    killed = time.monotonic()
    for h in held:
        h.close()
    back = None
    for _ in range(200):
        status, reason, _ = stack.call(1, "POST", "/v1/chat/completions", chat(5))
        if status == 200:
            back = time.monotonic() - killed
            break
        assert (status, reason) == (429, "concurrency"), (status, reason)
        time.sleep(0.25)
    print(f"{stack.proxy}: the killed replica's slots back after {back} s (bound {BOUND_S[stack.proxy]:.1f} s)")
    assert back is not None and back <= BOUND_S[stack.proxy], back
    # both slots back, not one, within the same bound: two streams at once through B. The request
    # that found the first slot back released it after its answer, off its path (Envoy's
    # stream-done call, NGINX's post_action); under load that release can land after the next
    # acquire's waits (decide.RELEASE_WAITS_S), so the pair is tried until the bound has passed
    # (CI of 89c6e2d: [200, 429] 2.8 s after the kill, one try)
    tries: list[list[int]] = []
    while True:
        again = [stack.open(1, "POST", "/v1/chat/completions", chat(3, stream=True)) for _ in range(CONCURRENCY)]
        tries.append([h.status for h in again])
        both = tries[-1] == [200] * CONCURRENCY
        for h in again:
            if both:
                h.read()
            h.close()            # a stream left early (a pair short of a slot) releases its slot
        if both or time.monotonic() - killed > BOUND_S[stack.proxy]:
            break
        time.sleep(0.3)
    assert both, tries
