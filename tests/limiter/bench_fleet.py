"""Added latency of the fleet's shared limits (issue 21): the generated config of the bundled
policy (rates raised so nothing is refused) for Envoy 1.40 and NGINX 1.31, run once with its
local limits and once as a replica of a fleet (the limiter and a redis-server on loopback), the
same requests through each (GET /v1/models: a rate and a concurrency zone; POST
/v1/chat/completions: rate, concurrency and a token budget with settlement), one at a time on a
kept-alive connection (``--fresh``: a new connection each). Not a test:
``.venv/bin/python -m tests.limiter.bench_fleet [CALLS] [--fresh]`` (default 1000 per route and
config; about a minute)."""

from __future__ import annotations

import http.client
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.model import Plan
from scanner.policy.load import loads
from scanner.runtime import fleet
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.limiter.fleet import DEFAULT, PUBLIC
from tests.probe.realproxy import proxy_named

FRESH = "--fresh" in sys.argv     # a new connection per request instead of one kept alive
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})


def policy_text() -> str:
    text = DEFAULT.read_text().replace("      rate: {rps: 10, burst: 20}\n      concurrency: 16\n",
                                       "      rate: {rps: 100000, burst: 100000}\n      concurrency: 16\n"
                                       "      tokens_per_minute: 100000000\n", 1)
    return text


def timed(calls: int, fn: Callable[[], int]) -> list[float]:
    for _ in range(min(100, calls)):
        assert fn() == 200
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        status = fn()
        out.append(time.perf_counter() - t)
        assert status == 200, status
    return out


def caller(port: int, headers: dict[str, str], method: str, path: str, body: str | None) -> Callable[[], int]:
    """One request at a time on a kept-alive connection; with FRESH, a new connection each (what
    the proxy does after an answer, e.g. NGINX's post_action release, then delays no next request)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(PUBLIC, 0))

    def call() -> int:
        nonlocal conn
        if FRESH:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(PUBLIC, 0))
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status
    return call


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000


def measure(proxy: Proxy, plan: Plan, headers: dict[str, str], calls: int, shared: bool) -> dict[str, tuple[float, float]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    if shared:
        fp = fleet.plan_for(plan, 2, free_port(), free_port())
        f = fleet.Fleet(fp, proxy, tmp, (plan.listen.port,))
        f.write()
        ctx = f
    else:
        proxy.write(plan, tmp)
        ctx = proxy.start(plan, tmp)
    out = {}
    with ctx:
        time.sleep(0.5)
        for name, method, path, body in (("GET /v1/models", "GET", "/v1/models", None),
                                         ("POST /v1/chat/completions", "POST", "/v1/chat/completions", CHAT)):
            hs = {**headers, **({"Content-Type": "application/json"} if body else {})}
            xs = timed(calls, caller(plan.listen.port, hs, method, path, body))
            out[name] = (pct(xs, 0.5), pct(xs, 0.99))
    return out


def main(calls: int) -> None:
    inv = load_ref("vllm-0.29.0-default")
    for name in ("envoy", "nginx"):
        tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-setup-"))
        up = free_port()
        s = loop.setup(inv, loads(policy_text()), tmp, up)
        user = next(c for c in s.credentials if c.role == "user")
        proxy = proxy_named(name)
        with StandinThread(inv, "127.0.0.1", up):
            local = measure(proxy, s.plan, user.headers(), calls, shared=False)
            shared = measure(proxy, replace(s.plan, listen=replace(s.plan.listen, port=free_port())),
                             user.headers(), calls, shared=True)
        for route in local:
            (l50, l99), (s50, s99) = local[route], shared[route]
            print(f"{name:6s} {route:27s} local p50 {l50:.3f} ms p99 {l99:.3f} | shared p50 {s50:.3f} ms "
                  f"p99 {s99:.3f} | added p50 {s50 - l50:+.3f} ms p99 {s99 - l99:+.3f} ms", flush=True)


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    main(int(numbers[0]) if numbers else 1000)
