"""The limiter's figures (issue 21): added latency per call on loopback (p50, p99) beside the 1 ms
target, through Envoy with and without the ratelimit filter, and the service's throughput per
core. Not a test: ``.venv/bin/python -m tests.limiter.bench [CALLS]`` (bounded: CALLS per loop,
default 2000; about 30 s). Starts its own redis-server, limiter and Envoy on random ports."""

from __future__ import annotations

import http.client
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scanner.limiter import proto
from tests.limiter.clients import GrpcClient, HttpClient, descriptor
from tests.limiter.test_envoy import Stack
from tests.limiter.test_njs import NjsStack

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICKS


def timed(calls: int, fn: Callable[[], object]) -> list[float]:
    for _ in range(min(200, calls)):   # warm-up
        fn()
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def line(name: str, times: list[float]) -> str:
    q = statistics.quantiles(times, n=100)
    return f"{name:44s} p50 {q[49] * 1000:6.3f} ms  p99 {q[98] * 1000:6.3f} ms  (n={len(times)})"


def throughput(port: int, pid: int, redis_pid: int, calls: int, threads: int, door: str) -> str:
    """``threads`` clients, ``calls`` each, one door; the service's and Redis's CPU per call."""
    def work(n: int) -> None:
        if door == "grpc":
            g = GrpcClient("127.0.0.1", port)
            req = proto.request("vllm-perimeter", (descriptor("wide", f"t{n}"),))
            for _ in range(calls):
                g.call(req)
            g.close()
        else:
            h = HttpClient("127.0.0.1", port)
            for _ in range(calls):
                h.post("/v1/acquire", {"key": f"t{n}", "zone": "wide"})
            h.close()
    c0, r0, t0 = cpu_s(pid), cpu_s(redis_pid), time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall, cpu, rcpu = time.perf_counter() - t0, cpu_s(pid) - c0, cpu_s(redis_pid) - r0
    total = calls * threads
    return (f"{door:4s} {threads} clients x {calls}: {total / wall:7.0f} calls/s wall, service "
            f"{total / cpu:7.0f} calls per CPU-second, redis-server {total / max(rcpu, 1e-9):7.0f}")


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            stack.start(Path(tmp))
            port = stack.limiter.port
            g, h = GrpcClient("127.0.0.1", port), HttpClient("127.0.0.1", port)
            req = proto.request("vllm-perimeter", (descriptor("wide", "bench"),))
            three = {"key": "bench3", "zones": ["wide", "tokens:600", "conc:2"], "cost": 0}
            print(line("gRPC ShouldRateLimit (1 rate descriptor)", timed(calls, lambda: g.call(req))))
            print(line("HTTP /v1/acquire (1 rate zone)", timed(calls, lambda: h.post(
                "/v1/acquire", {"key": "bench", "zone": "wide"}))))
            print(line("HTTP /v1/acquire + /v1/release (3 zones)", timed(calls, lambda: (
                h.post("/v1/acquire", three), h.post("/v1/release", {**three, "slot": "x", "zones": ["conc:2"]})))))
            conn = http.client.HTTPConnection("127.0.0.1", stack.front, timeout=10)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def through(path: str) -> None:
                conn.request("GET", path, headers={"x-principal": "bench"})
                reply = conn.getresponse()
                reply.read()
                assert reply.status == 200, reply.status
            plain, shared = timed(calls, lambda: through("/plain")), timed(calls, lambda: through("/wide"))
            print(line("Envoy, no rate limit filter call", plain))
            print(line("Envoy, ratelimit filter -> limiter -> Redis", shared))
            print(f"{'added by the shared limit (Envoy)':44s} p50 "
                  f"{(statistics.median(shared) - statistics.median(plain)) * 1000:6.3f} ms  (target <= 1 ms)")
            g.close()
            h.close()
            conn.close()
            pid = stack.limiter._proc.pid if stack.limiter._proc else 0
            rpid = stack.redis._proc.pid if stack.redis._proc else 0
            for door in ("grpc", "http"):
                print(throughput(port, pid, rpid, calls // 2, 4, door))
        finally:
            stack.stop()
    with tempfile.TemporaryDirectory() as tmp:
        njs = NjsStack(Path(tmp))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", njs.port, timeout=10)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def nginx(path: str) -> None:
                conn.request("GET", path, headers={"X-Principal": "bench"})
                reply = conn.getresponse()
                reply.read()
                assert reply.status == 200, reply.status
            plain, shared = timed(calls, lambda: nginx("/plain")), timed(calls, lambda: nginx("/wide"))
            print(line("NGINX 1.31, no limiter call", plain))
            print(line("NGINX 1.31, njs ngx.fetch -> limiter -> Redis", shared))
            print(f"{'added by the shared limit (NGINX njs)':44s} p50 "
                  f"{(statistics.median(shared) - statistics.median(plain)) * 1000:6.3f} ms  (target <= 1 ms)")
            conn.close()
        finally:
            njs.stop()


if __name__ == "__main__":
    main()
