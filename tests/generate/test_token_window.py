"""Bounded token windows (issue 27, item 4): a budget of N tokens a minute is one bucket of the
plan's capacity C (``Decision.token_capacity``: ``limits.tokens_burst``, default ceil(N / 4))
refilled at N / 60 a second, on NGINX 1.31 (njs's bucket in the shared dict) and Envoy 1.40
(local_ratelimit with max_tokens C, tokens_per_fill N per 60 s). A saturating sender (one
principal, a kept-alive connection, requests of a known cost back to back, their answers made by
the upstream witness without usage, so nothing is refunded) is admitted at most C + N x t / 60
tokens in t seconds (plus one request's cost: the bucket holds a part of a request at the end),
and not far below it: the bucket really refills. The same with ``tokens_burst`` = N: the old
capacity, about 2 N in the first minute."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import body as plan_body
from scanner.plan.model import REASON_HEADER, Decision
from scanner.probe.checks.tokens import body_of_cost
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from scanner.witness_asgi import ANSWER_PARAM, PROBE_PARAM
from tests.probe.realproxy import proxy_named, unpaced
from tests.probe.test_token_budget import token_policy

CATALOG = "vllm-0.29.0-default"
CHAT = "/v1/chat/completions"
TPM = 1200          # 20 tokens a second
COST = 40           # one request's charge: a bucket of 300 holds 7, the refill one every 2 s
HORIZON_S = 6.0


@dataclass
class Saturated:
    decision: Decision
    admitted: int        # requests that reached the upstream
    refused: int         # 429 token-budget
    took: float          # from the first request sent to the last answer

    @property
    def tokens(self) -> int:
        return self.admitted * COST

    @property
    def most(self) -> float:
        d = self.decision
        return d.token_capacity + (d.limits.tokens_per_minute or 0) * self.took / 60


def saturate(proxy: Proxy, tmp: Path, burst: int | None) -> Saturated:
    """One principal sends requests of cost COST back to back for HORIZON_S seconds through a
    generated ``proxy``; the witness answers each it receives 400 itself (no usage: no refund)."""
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, unpaced(token_policy(TPM, burst), 1000), tmp, port)
    d = s.plan.decision("POST", CHAT)
    assert d is not None and d.token_zone
    body = body_of_cost(d, COST, {}, 1 << 20)
    assert body is not None and plan_body.token_cost(d, body) == COST
    who = next(c for c in s.credentials if c.role == "user")
    public = next(v.address or "" for v in s.vantages if v.name == "public")
    admitted = refused = 0
    with StandinThread(inventory, "127.0.0.1", port), ExitStack() as stack:
        proxy.write(s.plan, tmp / "proxy")
        loop.start_checked(proxy, s.plan, tmp / "proxy", stack)
        conn = http.client.HTTPConnection(s.plan.listen.address, s.plan.listen.port, timeout=10,
                                          source_address=(public, 0))
        t0 = time.monotonic()
        last = t0
        try:
            for i in range(100000):
                if time.monotonic() - t0 >= HORIZON_S:
                    break
                conn.request("POST", f"{CHAT}?{PROBE_PARAM}=sat{i}&{ANSWER_PARAM}=400", body,
                             {**who.headers(), "Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                last = time.monotonic()
                reason = resp.getheader(REASON_HEADER) or ""
                if resp.status == 429 and reason == "token-budget":
                    refused += 1
                else:
                    assert (resp.status, reason) == (400, ""), (resp.status, reason)   # the witness's own
                    admitted += 1
        finally:
            conn.close()
    return Saturated(d, admitted, refused, last - t0)


@pytest.fixture(params=["nginx", "envoy"])
def proxy(request: pytest.FixtureRequest) -> Iterator[Proxy]:
    p = proxy_named(request.param)
    if request.param == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    yield p


def test_a_saturating_sender_gets_the_bucket_and_its_refill(proxy: Proxy, tmp_path: Path) -> None:
    got = saturate(proxy, tmp_path, None)
    assert got.decision.token_capacity == 300                       # the default: N / 4
    print(proxy.kind, f"admitted {got.tokens} tokens in {got.took:.2f}s; bound {got.most:.0f}; "
          f"{got.refused} refused")
    assert got.refused > 0
    assert got.tokens <= got.most + COST, (got.tokens, got.most)
    assert got.tokens >= 0.85 * got.most - 2 * COST, (got.tokens, got.most)   # it refills


def test_tokens_burst_sets_the_capacity(proxy: Proxy, tmp_path: Path) -> None:
    got = saturate(proxy, tmp_path, TPM)
    assert got.decision.token_capacity == TPM
    print(proxy.kind, f"burst {TPM}: admitted {got.tokens} tokens in {got.took:.2f}s; bound {got.most:.0f}")
    assert got.tokens <= got.most + COST, (got.tokens, got.most)
    assert got.tokens >= 0.85 * got.most - 2 * COST, (got.tokens, got.most)
