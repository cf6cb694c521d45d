"""Envoy 1.40 itself calls the service: ``envoy.filters.http.ratelimit`` (gRPC, h2c) pointing at
``vllm-perimeter limiter`` on a random port, in a tiny hand-written config. Proves the protocol
(field numbers, framing, descriptors, hits_addend, stream-done release, failure mode).

Measured on Envoy 1.40: a route's ``RateLimitPerRoute.rate_limits`` (typed_per_filter_config)
sends a descriptor's ``hits_addend`` (``format: "%REQ(x-cost)%"``); the same entry under the
route action's ``rate_limits`` is sent without it (every descriptor then counts 1).
``apply_on_stream_done`` entries are sent when the stream ends, after the answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner.net import free_port
from scanner.runtime import envoy
from scanner.runtime.process import ManagedProcess
from tests.limiter.harness import get, limiter_process, redis_process, url

pytestmark = pytest.mark.envoy

CONFIG = """
static_resources:
  listeners:
  - name: front
    address: {socket_address: {address: 127.0.0.1, port_value: FRONT}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          use_remote_address: true
          local_reply_config:
            mappers:
            - filter: {response_flag_filter: {flags: [RLSE]}}
              headers_to_add:
              - header: {key: x-perimeter-reason, value: shared-store-unavailable}
                append_action: OVERWRITE_IF_EXISTS_OR_ADD
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /rate}
                route: {cluster: backend}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                      - actions:
                        - generic_key: {descriptor_key: zone, descriptor_value: "rate:2/3"}
                        - request_headers: {header_name: x-principal, descriptor_key: principal}
              - match: {prefix: /tokens}
                route: {cluster: backend}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions:
                      - generic_key: {descriptor_key: zone, descriptor_value: "tokens:600"}
                      - request_headers: {header_name: x-principal, descriptor_key: principal}
                      hits_addend: {format: "%REQ(x-cost)%"}
              - match: {prefix: /held}
                route: {cluster: backend}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                      - actions:
                        - generic_key: {descriptor_key: zone, descriptor_value: "conc:2"}
                        - request_headers: {header_name: x-principal, descriptor_key: principal}
                        - request_headers: {header_name: x-request-id, descriptor_key: slot}
                      - actions:
                        - generic_key: {descriptor_key: zone, descriptor_value: "conc:2"}
                        - request_headers: {header_name: x-principal, descriptor_key: principal}
                        - generic_key: {descriptor_key: op, descriptor_value: release}
                        - request_headers: {header_name: x-request-id, descriptor_key: slot}
                        apply_on_stream_done: true
              - match: {prefix: /plain}
                route: {cluster: backend}
              - match: {prefix: /wide}
                route: {cluster: backend}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions:
                      - generic_key: {descriptor_key: zone, descriptor_value: wide}
                      - request_headers: {header_name: x-principal, descriptor_key: principal}
              - match: {prefix: /leaky}
                route: {cluster: backend}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                      - actions:
                        - generic_key: {descriptor_key: zone, descriptor_value: "conc:2"}
                        - request_headers: {header_name: x-principal, descriptor_key: principal}
                        - request_headers: {header_name: x-request-id, descriptor_key: slot}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: vllm-perimeter
              failure_mode_deny: true
              status_on_error: {code: ServiceUnavailable}
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: limiter}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: back
    address: {socket_address: {address: 127.0.0.1, port_value: BACK}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: back
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                direct_response: {status: 200, body: {inline_string: ok}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: BACK}}}}]}]
  - name: limiter
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: limiter
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: LIMITER}}}}]}]
"""


class Stack:
    """One redis-server, one limiter, two Envoy replicas in front of one backend."""

    def __init__(self, tmp: Path) -> None:
        self.redis = redis_process(tmp)
        self.limiter = limiter_process(tmp, "")
        self.fronts = (free_port(), free_port())
        self.envoys: list[ManagedProcess] = []

    @property
    def front(self) -> int:
        return self.fronts[0]

    def start(self, tmp: Path) -> Stack:
        self.redis.start()
        self.limiter = limiter_process(tmp, url(self.redis)).start()
        back = free_port()
        for i, front in enumerate(self.fronts):
            text = (CONFIG.replace("FRONT", str(front)).replace("BACK", str(back))
                    .replace("LIMITER", str(self.limiter.port)))
            if i:   # the second replica: the same config without the backend's listener
                text = text[:text.index("  - name: back\n")] + text[text.index("  clusters:"):]
            (tmp / f"envoy{i}.yaml").write_text(text)
            argv = [envoy.binary(), "-c", str(tmp / f"envoy{i}.yaml"), "--concurrency", "1",
                    "--disable-hot-restart", "--log-level", "warning", "--base-id", str(front)]
            self.envoys.append(ManagedProcess(f"envoy{i}", argv, "127.0.0.1", front,
                                              log=tmp / f"envoy{i}.log").start())
        return self

    def get(self, path: str, principal: str, replica: int = 0, **headers: str) -> tuple[int, dict[str, str]]:
        return get(self.fronts[replica], path, {"x-principal": principal, **headers})

    def stop(self) -> None:
        for proc in (*self.envoys, self.limiter, self.redis):
            proc.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp("envoy-rls"))
    s = Stack(tmp)
    try:
        yield s.start(tmp)
    finally:
        s.stop()


def test_envoy_rate_burst_then_429_with_reason(stack: Stack) -> None:
    answers = [stack.get("/rate", "alice") for _ in range(5)]
    assert [a[0] for a in answers] == [200] * 4 + [429]
    assert answers[-1][1].get("retry-after") == "1" and answers[-1][1].get("x-perimeter-reason") == "rate"
    assert stack.get("/rate", "bob")[0] == 200            # another principal: its own bucket


def test_two_envoy_replicas_share_one_limit(stack: Stack) -> None:
    """Alternating between the replicas: burst + 1 in sum, not per replica; each replica refuses."""
    answers = [stack.get("/rate", "zoe", replica=i % 2)[0] for i in range(8)]
    assert answers.count(200) == 4 and answers[:4] == [200] * 4
    assert 429 in answers[4::2] and 429 in answers[5::2]
    tokens = [stack.get("/tokens", "yan", replica=i % 2, **{"x-cost": "200"})[0] for i in range(4)]
    assert tokens == [200, 200, 200, 429]                   # 600 a minute for the fleet


def test_envoy_token_cost_from_hits_addend(stack: Stack) -> None:
    assert stack.get("/tokens", "carol", **{"x-cost": "500"})[0] == 200
    status, headers = stack.get("/tokens", "carol", **{"x-cost": "200"})
    assert status == 429 and headers.get("x-perimeter-reason") == "token-budget"
    assert headers.get("retry-after") == "10"
    assert stack.get("/tokens", "carol", **{"x-cost": "50"})[0] == 200
    # Measured on Envoy 1.40: an entry whose hits_addend format yields no number (header missing,
    # "abc", "-3") is not sent at all and the request passes uncharged, as local_ratelimit skips
    # it: the generated Lua must set the cost on every request of a token route or refuse (500).
    # (A descriptor that does arrive without hits_addend is refused by the service: test_server.)
    assert stack.get("/tokens", "carol")[0] == 200
    assert stack.get("/tokens", "carol", **{"x-cost": "abc"})[0] == 200


def test_envoy_releases_slots_when_the_stream_ends(stack: Stack) -> None:
    held = []
    for _ in range(4):
        held.append(stack.get("/held", "dave")[0])
        time.sleep(0.05)                                   # the stream-done call is fire-and-forget
    assert held == [200] * 4                               # limit 2, each slot released at the end
    # no release configured: slots stay held. The client's own x-request-id (one for all three, which
    # would be one slot, admitted again and again) is replaced at the edge (use_remote_address): the
    # generators must keep it so, or a client picks its slot
    leaky = [stack.get("/leaky", "erin", **{"x-request-id": "same"})[0] for _ in range(3)]
    assert leaky == [200, 200, 429]


def test_envoy_denies_503_when_redis_is_down(stack: Stack) -> None:
    stack.redis.stop()
    status, headers = stack.get("/rate", "frank")
    assert status == 503 and headers.get("x-perimeter-reason") == "shared-store-unavailable"
    stack.limiter.stop()                                   # the service itself gone: the same answer
    status, headers = stack.get("/tokens", "frank", **{"x-cost": "1"})
    assert status == 503 and headers.get("x-perimeter-reason") == "shared-store-unavailable"
