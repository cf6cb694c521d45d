"""Bounded token windows for a fleet (issue 27, item 4): two replicas (Envoy 1.40, NGINX 1.31), the
limiter and Redis; one principal's saturating sender alternates between the replicas with
requests of a known cost (answered 400 by the witness: no usage, nothing refunded). The limiter's
bucket (the plan's capacity C = ceil(N / 4), refilled at N / 60 a second) admits at most
C + N x t / 60 tokens in t seconds for the whole fleet (plus one request's cost), and not far
below it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from scanner.plan import body as plan_body
from scanner.probe.checks.tokens import body_of_cost
from scanner.witness_asgi import ANSWER_PARAM, PROBE_PARAM
from tests.limiter.fleet import FleetStack, fleet_policy
from tests.probe.realproxy import proxy_named

TPM = 1200           # 20 tokens a second; the default bucket: 300
HORIZON_S = 6.0
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module", params=[pytest.param("envoy", marks=pytest.mark.envoy),
                                        pytest.param("nginx", marks=pytest.mark.nginx)])
def stack(request: pytest.FixtureRequest) -> Iterator[FleetStack]:
    s = FleetStack(proxy_named(request.param), policy=fleet_policy(tpm=TPM, burst=None))
    try:
        yield s.start()
    finally:
        s.stop()


def test_a_saturating_sender_gets_the_fleets_bucket_and_its_refill(stack: FleetStack) -> None:
    d = stack.plan.decision("POST", CHAT)
    assert d is not None and d.token_capacity == 300
    raw = body_of_cost(d, 40, {}, 1 << 20)
    assert raw is not None
    body = json.loads(raw)
    cost = plan_body.token_cost(d, json.dumps(body).encode())   # as FleetStack sends it
    time.sleep(1.0)                                   # the rate bucket full
    admitted = refused = 0
    t0 = time.monotonic()
    last = t0
    for i in range(100000):
        if time.monotonic() - t0 >= HORIZON_S:
            break
        status, reason, _ = stack.call(i % 2, "POST", f"{CHAT}?{PROBE_PARAM}=fleet{i}&{ANSWER_PARAM}=400", body)
        last = time.monotonic()
        if (status, reason) == (429, "token-budget"):
            refused += 1
        elif status == 429 and reason == "rate":
            continue                                  # refused before it was charged
        else:
            assert (status, reason) == (400, ""), (status, reason)
            admitted += 1
    took = last - t0
    most = d.token_capacity + TPM * took / 60
    tokens = admitted * cost
    print(stack.proxy, f"fleet: admitted {tokens} tokens in {took:.2f}s; bound {most:.0f}; {refused} refused")
    assert refused > 0
    assert tokens <= most + cost, (tokens, most)
    assert tokens >= 0.85 * most - 2 * cost, (tokens, most)
