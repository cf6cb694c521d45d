"""The service's two doors on one port (scanner/limiter/server.py, rls.py, http_api.py) against a
real redis-server: gRPC (Envoy's rate limit service) from an h2 client, JSON over HTTP/1.1."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import pytest

from scanner.limiter import config, proto, rls
from scanner.runtime.process import ManagedProcess
from tests.limiter.clients import GrpcClient, HttpClient, descriptor
from tests.limiter.harness import ZONES

DOMAIN = "vllm-perimeter"


@pytest.fixture
def grpc(limiter: ManagedProcess) -> Iterator[GrpcClient]:
    client = GrpcClient("127.0.0.1", limiter.port)
    yield client
    client.close()


@pytest.fixture
def http(limiter: ManagedProcess) -> Iterator[HttpClient]:
    client = HttpClient("127.0.0.1", limiter.port)
    yield client
    client.close()


def fresh() -> str:
    return uuid.uuid4().hex[:12]


def headers(response: proto.Response) -> dict[str, str]:
    return {h.key: h.value for h in response.response_headers_to_add}


# --- gRPC: envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit --------------------------

def test_grpc_rate_burst_then_over_limit(grpc: GrpcClient) -> None:
    key = fresh()
    answers = [grpc.call(proto.request(DOMAIN, (descriptor("rate:2/3", key),))) for _ in range(5)]
    assert all(a.grpc_status == 0 and a.response for a in answers)
    codes = [a.response.overall_code for a in answers if a.response]
    assert codes == [proto.CODE_OK] * 4 + [proto.CODE_OVER_LIMIT]          # burst 3 + 1
    last = answers[-1].response
    assert last is not None
    assert headers(last) == {"retry-after": "1", "x-perimeter-reason": "rate"}
    status = last.statuses[0]
    assert status.current_limit == proto.CurrentLimit(requests_per_unit=2, unit=proto.UNIT_SECOND, name="rate:2/3")
    assert status.code == proto.CODE_OVER_LIMIT and status.duration_until_reset.seconds == 1


def test_grpc_tokens_charge_hits_addend_and_settle(grpc: GrpcClient) -> None:
    key = fresh()
    first = grpc.call(proto.request(DOMAIN, (descriptor("tokens:600", key, hits=500),)))
    over = grpc.call(proto.request(DOMAIN, (descriptor("tokens:600", key, hits=200),)))
    settled = grpc.call(proto.request(DOMAIN, (descriptor("tokens:600", key, ("op", "settle"), hits=300),)))
    again = grpc.call(proto.request(DOMAIN, (descriptor("tokens:600", key, hits=200),)))
    assert first.response and first.response.overall_code == proto.CODE_OK
    assert first.response.statuses[0].limit_remaining == 100
    assert over.response and over.response.overall_code == proto.CODE_OVER_LIMIT
    assert headers(over.response) == {"retry-after": "10", "x-perimeter-reason": "token-budget"}
    assert settled.response and settled.response.overall_code == proto.CODE_OK
    # a settle without a refund given returns nothing (not Envoy's default hit of 1)
    nothing = grpc.call(proto.request(DOMAIN, (descriptor("tokens:600", key, ("op", "settle")),)))
    assert nothing.response and nothing.response.overall_code == proto.CODE_OK
    settle = proto.request(DOMAIN, (descriptor("tokens:600", key, ("op", "settle")),))
    cfg = config.parse(ZONES)
    assert rls._hits(cfg, settle, settle.descriptors[0], ("tokens:600", key, "settle", "")) == 0
    assert again.response and again.response.overall_code == proto.CODE_OK


def test_grpc_concurrency_needs_and_releases_slots(grpc: GrpcClient) -> None:
    key = fresh()

    def acquire(slot: str) -> int:
        a = grpc.call(proto.request(DOMAIN, (descriptor("conc:2", key, ("slot", slot)),)))
        assert a.response is not None
        return a.response.overall_code

    assert [acquire("r1"), acquire("r2"), acquire("r3")] == [1, 1, 2]
    released = grpc.call(proto.request(DOMAIN, (descriptor("conc:2", key, ("op", "release"), ("slot", "r1")),)))
    assert released.response and released.response.overall_code == proto.CODE_OK
    assert acquire("r3") == proto.CODE_OK
    no_slot = grpc.call(proto.request(DOMAIN, (descriptor("conc:2", key),)))
    assert no_slot.grpc_status == 3 and "slot" in no_slot.message


def test_grpc_refusal_undoes_earlier_slots_and_tokens(grpc: GrpcClient) -> None:
    """rate spent, then tokens refused: the concurrency slot taken before is released."""
    key = fresh()
    request = proto.request(DOMAIN, (descriptor("conc:2", key, ("slot", "a")),
                                     descriptor("tokens:600", key, hits=700)))
    refused = grpc.call(request)
    assert refused.response and refused.response.overall_code == proto.CODE_OVER_LIMIT
    assert [s.code for s in refused.response.statuses] == [proto.CODE_OK, proto.CODE_OVER_LIMIT]
    assert headers(refused.response)["retry-after"] == "60"     # never fits
    both = [grpc.call(proto.request(DOMAIN, (descriptor("conc:2", key, ("slot", s)),))) for s in "bc"]
    assert all(b.response and b.response.overall_code == proto.CODE_OK for b in both)


@pytest.mark.parametrize(("request_", "status", "words"), [
    (proto.request("other", (descriptor("rate:2/3", "k"),)), 3, "domain"),
    (proto.request(DOMAIN, ()), 3, "descriptors"),
    (proto.request(DOMAIN, (proto.descriptor((("zone", "rate:2/3"),)),)), 3, "principal"),
    (proto.request(DOMAIN, (descriptor("nope", "k"),)), 3, "unknown zone"),
    (proto.request(DOMAIN, (descriptor("rate:2/3", "a{b}"),)), 3, "bad key"),
    (proto.request(DOMAIN, (descriptor("rate:2/3", "k", ("op", "delete")),)), 3, "op"),
    (proto.request(DOMAIN, (descriptor("rate:2/3", "k", ("op", "settle")),)), 3, "rate zone"),
    (proto.request(DOMAIN, (descriptor("tokens:600", "k"),)), 3, "needs the request's cost"),
    (proto.request(DOMAIN, (descriptor("conc:2", "k", ("slot", "s"), ("owner", "a b")),)), 3, "bad owner"),
    (proto.request(DOMAIN, (descriptor("conc:2", "k", ("slot", "s"), ("owner", "w1")),
                            descriptor("rate:2/3", "k", ("owner", "w2")))), 3, "one owner"),
])
def test_grpc_bad_calls_are_invalid_argument(grpc: GrpcClient, request_: proto.Request, status: int,
                                             words: str) -> None:
    answer = grpc.call(request_)
    assert answer.grpc_status == status and words in answer.message


def test_grpc_message_is_percent_encoded(grpc: GrpcClient) -> None:
    answer = grpc.call(proto.request(DOMAIN, (descriptor("zoné\n%", "k"),)))
    assert answer.grpc_status == 3 and answer.message == "unknown zone 'zon%C3%A9\\n%25'"


def test_grpc_bad_frames(grpc: GrpcClient) -> None:
    assert grpc.raw("/envoy.service.ratelimit.v3.RateLimitService/Nope", b"\x00\x00\x00\x00\x00").grpc_status == 12
    assert grpc.raw("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", b"\x01\x00\x00\x00\x00").grpc_status == 3
    assert grpc.raw("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", b"\x00\x00\x00\x00\x03\x0a\x05a").grpc_status == 3
    # the connection still serves
    assert grpc.call(proto.request(DOMAIN, (descriptor("wide", "k"),))).grpc_status == 0


def test_grpc_streams_multiplexed_on_one_connection(grpc: GrpcClient) -> None:
    """40 calls in flight on one connection (Envoy's way): each answered, the limit exact in sum."""
    key = fresh()
    answers = grpc.many([proto.request(DOMAIN, (descriptor("rate:2/3", key),))] * 40)
    codes = [a.response.overall_code for a in answers if a.response]
    assert len(codes) == 40 and codes.count(proto.CODE_OK) == 4


# --- HTTP/1.1 JSON ---------------------------------------------------------------------------

def test_http_acquire_rate_and_retry_after(http: HttpClient) -> None:
    key = fresh()
    answers = [http.post("/v1/acquire", {"key": key, "zone": "rate:2/3"}) for _ in range(5)]
    assert [a[1]["allow"] for a in answers] == [True] * 4 + [False]
    assert answers[-1] == (200, {"allow": False, "slot": answers[-1][1]["slot"], "retry_after": 1,
                                 "reason": "rate", "zone": "rate:2/3"})


def test_http_concurrency_and_tokens_in_one_call(http: HttpClient) -> None:
    key = fresh()
    zones = ["rate:2/3", "conc:2", "tokens:600"]
    a = http.post("/v1/acquire", {"key": key, "zones": zones, "cost": 250})
    b = http.post("/v1/acquire", {"key": key, "zones": zones, "cost": 250, "slot": "njs-req-2"})
    c = http.post("/v1/acquire", {"key": key, "zones": zones, "cost": 50})
    assert a[1]["allow"] and b[1]["allow"] and b[1]["slot"] == "njs-req-2"
    assert c[1]["allow"] is False and c[1]["reason"] == "concurrency"
    assert http.post("/v1/release", {"key": key, "zones": ["conc:2"], "slot": a[1]["slot"]}) == (200, {"released": True})
    d = http.post("/v1/acquire", {"key": key, "zones": zones, "cost": 150})
    assert d[1]["allow"] is False and d[1]["reason"] == "token-budget" and d[1]["retry_after"] == 5
    assert http.post("/v1/settle", {"key": key, "zone": "tokens:600", "refund": 200})[1]["left"] >= 300
    # d's slot was released when its tokens were refused; a's was released above: one is live
    e = http.post("/v1/acquire", {"key": key, "zones": ["conc:2"]})
    assert e[1]["allow"] is True


def test_http_release_carries_the_settlement(http: HttpClient) -> None:
    """Once answered, one call frees the slot and gives the unused reservation back."""
    key = fresh()
    zones = ["conc:2", "tokens:600"]
    a = http.post("/v1/acquire", {"key": key, "zones": zones, "cost": 600, "slot": "one"})
    assert a[1]["allow"] is True
    assert http.post("/v1/acquire", {"key": key, "zones": zones, "cost": 100})[1]["reason"] == "token-budget"
    done = http.post("/v1/release", {"key": key, "zones": ["conc:2"], "slot": "one", "settle": "tokens:600",
                                     "refund": 500})
    assert done[0] == 200 and done[1]["released"] is True and done[1]["left"] >= 500
    assert http.post("/v1/release", {"key": key, "zones": ["conc:2"], "slot": "one", "settle": "conc:2"})[0] == 400
    assert http.post("/v1/acquire", {"key": key, "zones": zones, "cost": 400})[1]["allow"] is True


@pytest.mark.parametrize(("body", "status", "words"), [
    (b"not json", 400, "JSON"),
    (b"[1]", 400, "object"),
    ({"zone": "rate:2/3"}, 400, "key"),
    ({"key": "k", "zone": "nope"}, 400, "unknown zone"),
    ({"key": "k k", "zone": "rate:2/3"}, 400, "bad key"),
    ({"key": "k", "zones": []}, 400, "zones"),
    ({"key": "k", "zone": "tokens:600", "cost": -1}, 400, "cost"),
    ({"key": "k", "zone": "tokens:600", "cost": "5"}, 400, "cost"),
    ({"key": "k", "zone": "rate:2/3", "slot": 5}, 400, "slot"),
    ({"key": "k", "zones": ["rate:2/3", "tokens:600"]}, 400, "needs the request's cost"),
    (b"{" + b" " * 20000 + b"}", 413, "bytes"),
])
def test_http_bad_calls(http: HttpClient, limiter: ManagedProcess, body: object, status: int, words: str) -> None:
    code, answer = http.post("/v1/acquire", body)
    assert code == status and words in str(answer["error"])


def test_http_other_paths_and_garbage(http: HttpClient, limiter: ManagedProcess) -> None:
    assert http.get("/v1/health") == (200, {"store": "ok"})
    assert http.get("/v1/acquire")[0] == 405
    assert http.post("/admin", {})[0] == 404
    with socket.create_connection(("127.0.0.1", limiter.port), timeout=5) as s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400")


def test_two_proxies_over_both_doors_share_the_limit(limiter: ManagedProcess) -> None:
    """An Envoy (gRPC) and an NGINX (HTTP) of one fleet: the sum admitted is the burst + 1."""
    key = fresh()
    grpc, http = GrpcClient("127.0.0.1", limiter.port), HttpClient("127.0.0.1", limiter.port)
    try:
        admitted = 0
        for _ in range(6):
            g = grpc.call(proto.request(DOMAIN, (descriptor("rate:2/3", key),)))
            admitted += bool(g.response and g.response.overall_code == proto.CODE_OK)
            admitted += bool(http.post("/v1/acquire", {"key": key, "zone": "rate:2/3"})[1]["allow"])
    finally:
        grpc.close()
        http.close()
    assert admitted == 4


def test_added_latency_on_loopback(limiter: ManagedProcess) -> None:
    """p50 of one call per request, both doors (CI bound loose; figures: tests/limiter/bench.py)."""
    grpc, http = GrpcClient("127.0.0.1", limiter.port), HttpClient("127.0.0.1", limiter.port)
    try:
        times: dict[str, list[float]] = {"grpc": [], "http": []}
        for _ in range(200):
            t = time.perf_counter()
            grpc.call(proto.request(DOMAIN, (descriptor("wide", "lat"),)))
            times["grpc"].append(time.perf_counter() - t)
            t = time.perf_counter()
            http.post("/v1/acquire", {"key": "lat", "zone": "wide"})
            times["http"].append(time.perf_counter() - t)
    finally:
        grpc.close()
        http.close()
    p50 = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    assert p50["grpc"] < 0.005 and p50["http"] < 0.005, p50


@pytest.mark.parametrize(("headers", "seconds"), [
    ([("x-envoy-expected-rq-timeout-ms", "250"), ("grpc-timeout", "1000m")], 0.25),   # Envoy's try first
    ([(b"grpc-timeout", b"1000m")], 1.0),
    ([("grpc-timeout", "2S")], 2.0),
    ([("grpc-timeout", "500u")], 0.0005),
    ([("grpc-timeout", "m")], None),
    ([("grpc-timeout", "10x")], None),
    ([("x-envoy-expected-rq-timeout-ms", "-5")], None),
    ([("x-envoy-expected-rq-timeout-ms", "0")], None),
    ([], None),
])
def test_the_caller_s_try_timeout(headers: list[tuple[str | bytes, str | bytes]], seconds: float | None) -> None:
    from scanner.limiter.server import try_timeout

    assert try_timeout(headers) == seconds
