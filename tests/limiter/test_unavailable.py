"""Redis stopped mid-run (by pid): every answer says shared-store-unavailable, nothing is admitted;
Redis back on its port: the service answers again without a restart."""

from __future__ import annotations

from pathlib import Path

from scanner.limiter import proto
from tests.limiter.clients import GrpcClient, HttpClient, descriptor
from tests.limiter.harness import limiter_process, redis_process, restart, url


def test_redis_stopped_mid_run(tmp_path: Path) -> None:
    redis = redis_process(tmp_path).start()
    service = limiter_process(tmp_path, url(redis))
    try:
        service.start()
        grpc, http = GrpcClient("127.0.0.1", service.port), HttpClient("127.0.0.1", service.port)
        ok = grpc.call(proto.request("vllm-perimeter", (descriptor("wide", "k"),)))
        assert ok.response and ok.response.overall_code == proto.CODE_OK
        assert http.post("/v1/acquire", {"key": "k", "zone": "wide"})[1]["allow"] is True

        redis.stop()
        down = [grpc.call(proto.request("vllm-perimeter", (descriptor(z, "k", ("slot", "s"), hits=1),)))
                for z in ("wide", "conc:2", "tokens:600")]
        assert [(d.grpc_status, d.message) for d in down] == [(14, "shared-store-unavailable")] * 3
        for zone in ("wide", "conc:2", "tokens:600"):
            assert http.post("/v1/acquire", {"key": "k", "zone": zone, "cost": 1}) == (
                503, {"allow": False, "reason": "shared-store-unavailable"})
        assert http.post("/v1/settle", {"key": "k", "zone": "tokens:600", "refund": 1})[0] == 503
        assert http.get("/v1/health") == (503, {"allow": False, "reason": "shared-store-unavailable"})

        restart(redis)                     # the same port: the service reconnects by itself
        back = grpc.call(proto.request("vllm-perimeter", (descriptor("wide", "k"),)))
        assert back.response and back.response.overall_code == proto.CODE_OK
        assert http.get("/v1/health") == (200, {"store": "ok"})
        grpc.close()
        http.close()
    finally:
        service.stop()
        redis.stop()


def test_redis_stopped_under_local_envoy_is_told_to_decide_itself(tmp_path: Path) -> None:
    """A zones file with on_unavailable: local: without Redis the gRPC answer is OK with
    {shared: unavailable} in the filter's metadata (Envoy's local filters at the per-proxy share
    then decide); the HTTP door still answers 503 (njs falls back itself)."""
    from tests.limiter.harness import ZONES

    redis = redis_process(tmp_path)
    service = limiter_process(tmp_path, url(redis), {**ZONES, "on_unavailable": "local"})
    try:
        service.start()
        grpc, http = GrpcClient("127.0.0.1", service.port), HttpClient("127.0.0.1", service.port)
        down = grpc.call(proto.request("vllm-perimeter", (descriptor("wide", "k"),
                                                          descriptor("conc:2", "k", ("slot", "s")))))
        assert down.grpc_status == 0 and down.response is not None
        assert down.response.overall_code == proto.CODE_OK and len(down.response.statuses) == 2
        assert dict(down.response.dynamic_metadata) == {"shared": "unavailable"}
        assert http.post("/v1/acquire", {"key": "k", "zone": "wide"})[0] == 503
        grpc.close()
        http.close()
    finally:
        service.stop()
