"""The limiter's gRPC door against grpcio's asyncio server with the same handler (issue 27 item 5:
serve with grpcio if it is simpler and not slower). Not a test:
``.venv/bin/python -m tests.limiter.bench_grpc [CALLS]`` (default 2000 per server; seconds).

Both servers run in this process on one redis-server started here, answering the same
``rls.should_rate_limit`` (one rate descriptor); the client is the same blocking h2 client one call
at a time, so the difference in latency and in the process's CPU per call is the servers'."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from scanner.limiter import config as zones_config
from scanner.limiter import proto, rls, server, store
from scanner.net import free_port
from tests.limiter.clients import GrpcClient, descriptor
from tests.limiter.harness import ZONES, redis_process, url


class Servicer(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, redis: store.Client, config: zones_config.LimiterConfig) -> None:
        self.redis, self.config = redis, config

    async def ShouldRateLimit(self, request: rls_pb2.RateLimitRequest,
                              context: object) -> rls_pb2.RateLimitResponse:
        return await rls.should_rate_limit(self.redis, self.config, request)


def serve(kind: str, redis_url: str, port: int, ready: threading.Event) -> None:
    config = zones_config.parse(ZONES)

    async def main() -> None:
        redis = store.connect(store.StoreSpec(redis_url))
        if kind == "grpc.aio":
            s = grpc.aio.server()
            rls_pb2_grpc.add_RateLimitServiceServicer_to_server(Servicer(redis, config), s)
            s.add_insecure_port(f"127.0.0.1:{port}")
            await s.start()
            ready.set()
            await s.wait_for_termination()
        else:
            await server.serve(server.Service(redis, config), "127.0.0.1", port, lambda _h, _p: ready.set())

    asyncio.run(main())


def measure(kind: str, port: int, calls: int) -> str:
    client = GrpcClient("127.0.0.1", port)
    request = proto.request("vllm-perimeter", (descriptor("wide", "bench"),))
    for _ in range(200):
        assert client.call(request).grpc_status == 0
    cpu, times = time.process_time(), []
    for _ in range(calls):
        t = time.perf_counter()
        client.call(request)
        times.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu
    client.close()
    q = statistics.quantiles(times, n=100)
    return (f"{kind:14s} p50 {q[49] * 1000:.3f} ms  p99 {q[98] * 1000:.3f} ms  "
            f"process CPU {cpu / calls * 1e6:.0f} us per call (client included)")


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp, redis_process(Path(tmp)) as redis:
        for kind in ("h2 (service)", "grpc.aio"):
            port, ready = free_port(), threading.Event()
            threading.Thread(target=serve, args=(kind, url(redis), port, ready), daemon=True).start()
            assert ready.wait(10), f"{kind} did not start"
            print(measure(kind, port, calls))


if __name__ == "__main__":
    main()
