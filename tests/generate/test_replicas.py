"""Several vLLM replicas behind the real proxies: both are used, one killed mid-run is skipped
without a failed request, and with none left the proxy's own 502/503 carries the marker."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from scanner.generate.envoy import EnvoyGenerator
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx import NginxGenerator
from scanner.net import free_port
from scanner.plan.build import build
from scanner.plan.inputs import load_inventory, load_policy
from scanner.plan.model import DECISION_HEADER, REASON_HEADER, Plan
from scanner.policy import keys
from scanner.policy.model import Health, Listen, Principal, Upstream
from scanner.verify import loop
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


class Replica:
    """A vLLM-shaped upstream that says who it is and counts what reached it; ``kill`` closes
    its listening socket (new connections are refused, as from a crashed pod)."""

    def __init__(self, name: str, port: int = 0) -> None:
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                replica.seen += 1
                body = json.dumps({"object": "list", "data": [], "replica": replica.name}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                return

        self.name, self.seen = name, 0
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        self.alive = True

    def kill(self) -> None:
        if self.alive:
            self.alive = False
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=5)


@pytest.fixture
def replicas() -> Iterator[tuple[Replica, Replica]]:
    pair = (Replica("a"), Replica("b"))
    yield pair
    for r in pair:
        r.kill()


def _plan(a: Replica, b: Replica, key: str, balance: str = "least_conn") -> Plan:
    policy = load_policy(None)
    upstream = Upstream("127.0.0.1", a.port, replicas=(("127.0.0.1", b.port),), balance=balance,
                        health=Health(max_fails=1, eject_s=30))
    local = replace(policy, principals=(Principal("svc", "service", keys.key_sha256(key)),),
                    listen=Listen("127.0.0.1", free_port()), upstream=upstream)
    return build(load_inventory(CATALOG), local)


def _send(client: httpx.Client, key: str) -> list[httpx.Response]:
    """Two requests, paced under the bundled policy's inference rate (10/s)."""
    time.sleep(0.25)
    auth = {"Authorization": f"Bearer {key}"}
    return [client.get("/v1/models", headers=auth),
            client.post("/v1/chat/completions", headers=auth, json=CHAT)]


@contextmanager
def _through(tmp_path: Path, name: str, plan: Plan) -> Iterator[tuple[httpx.Client, ExitStack]]:
    """The proxy ``name`` running ``plan``, and a client to it."""
    proxy = proxy_named(name)
    directory = tmp_path / "proxy"
    proxy.write(plan, directory)
    with ExitStack() as stack, httpx.Client(base_url=f"http://127.0.0.1:{plan.listen.port}",
                                           timeout=10) as client:
        loop.start_checked(proxy, plan, directory, stack)
        yield client, stack


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_replicas_share_load_and_a_dead_one_is_skipped(tmp_path: Path, name: str,
                                                       replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    key = keys.new_key()
    with _through(tmp_path, name, _plan(a, b, key)) as (client, _):
        first = [r for _ in range(10) for r in _send(client, key)]
        assert [r.status_code for r in first] == [200] * 20
        assert a.seen and b.seen, f"both replicas serve: a={a.seen} b={b.seen}"

        b.kill()
        seen_a = a.seen
        after = [r for _ in range(10) for r in _send(client, key)]
        # not one request lost: refused connections go to the live replica (nothing was sent)
        assert [r.status_code for r in after] == [200] * 20, [r.headers.get(REASON_HEADER) for r in after]
        assert {r.json()["replica"] for r in after} == {"a"}
        assert a.seen == seen_a + 20

        a.kill()
        gone = _send(client, key)
        for r in gone:
            assert r.status_code in (502, 503), r.status_code
            assert r.headers.get(DECISION_HEADER) == "error", dict(r.headers)
            assert r.headers.get(REASON_HEADER) == "upstream-unavailable", dict(r.headers)


@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_a_replica_back_from_the_dead_is_used_again(tmp_path: Path, name: str,
                                                    replicas: tuple[Replica, Replica]) -> None:
    """Passive health ejects for ``eject_s`` only: a replica restarted on its port is used again."""
    a, b = replicas
    key = keys.new_key()
    plan = _plan(a, b, key, balance="round_robin")
    plan = replace(plan, upstream=replace(plan.upstream, health=Health(max_fails=1, eject_s=1)))
    with _through(tmp_path, name, plan) as (client, stack):
        port = b.port
        b.kill()
        assert all(r.status_code == 200 for _ in range(4) for r in _send(client, key))
        reborn = Replica("b2", port)                  # back on the dead replica's port
        stack.callback(reborn.kill)
        deadline = time.monotonic() + 15
        while not reborn.seen and time.monotonic() < deadline:
            assert all(r.status_code == 200 for r in _send(client, key))
            time.sleep(0.2)
        assert reborn.seen, "a replica back on its port is used again after eject_s"


def test_generated_configs_name_every_replica() -> None:
    """The balancing choice and passive health reach both configs (one vLLM: unchanged)."""
    key = keys.new_key()
    a_port, b_port = free_port(), free_port()
    policy = replace(load_policy(None), principals=(Principal("svc", "service", keys.key_sha256(key)),),
                     upstream=Upstream("10.0.0.5", a_port, replicas=(("vllm-1.llm.svc", b_port),),
                                       health=Health(max_fails=2, eject_s=7)))
    plan = build(load_inventory(CATALOG), policy)
    options = GenerateOptions(runtime_dir="/var/lib/vllm-perimeter", extra={"config_dir": "/etc/p"})
    http = next(f.content for f in NginxGenerator().render(plan, options).files
                if f.name == "perimeter-http.conf")
    upstream = http[http.index("upstream vllm_upstream {"):].split("}", 1)[0]
    assert "least_conn;" in upstream
    assert f"server 10.0.0.5:{a_port} max_fails=2 fail_timeout=7s;" in upstream
    assert f"server vllm-1.llm.svc:{b_port} max_fails=2 fail_timeout=7s;" in upstream
    envoy = next(f.content for f in EnvoyGenerator().render(plan, options).files if f.name == "envoy.yaml")
    clusters = envoy.count("load_assignment:")
    assert clusters >= 1 and envoy.count("lb_policy: LEAST_REQUEST") == clusters
    assert envoy.count("outlier_detection:") == clusters
    assert "consecutive_local_origin_failure: 2" in envoy and "base_ejection_time: 7s" in envoy
    assert "type: STRICT_DNS" in envoy and "type: STATIC" not in envoy
    assert envoy.count(f"port_value: {b_port}") == envoy.count(f"port_value: {a_port}") >= 1

    single = build(load_inventory(CATALOG), replace(policy, upstream=Upstream("10.0.0.5", a_port)))
    http1 = next(f.content for f in NginxGenerator().render(single, options).files
                 if f.name == "perimeter-http.conf")
    assert f"server 10.0.0.5:{a_port} max_fails=0;" in http1 and "least_conn" not in http1
    envoy1 = next(f.content for f in EnvoyGenerator().render(single, options).files if f.name == "envoy.yaml")
    assert "outlier_detection" not in envoy1 and "lb_policy" not in envoy1
