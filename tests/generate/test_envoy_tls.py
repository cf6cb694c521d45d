"""TLS on both legs: clients -> Envoy (server TLS), Envoy -> vLLM (mutual TLS).

vLLM 0.29.0 (engine-less, "everything" surface) serves TLS with its own flags and demands a
client certificate (``--ssl-cert-reqs 2``); Envoy checks vLLM's certificate against the CA and
the server name, and presents its client certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scanner.inventory.model import Inventory
from scanner.net import free_port
from scanner.standin.real import RealVllmServer
from tests.conftest import EVERYTHING_ARGS, EVERYTHING_ENV, EVERYTHING_TASKS
from tests.generate.certs import CertAuthority, Pair
from tests.generate.test_envoy_harness import (
    MARKER,
    RunningEnvoy,
    envoy_binary,
    inventory_of,
    make_plan,
    make_principals,
    raw,
)

pytestmark = [pytest.mark.envoy, pytest.mark.vllm]

INVENTORY: Inventory = inventory_of(("/version", ("GET",)), ("/v1/chat/completions", ("POST",)),
                                    ("/invocations", ("POST",)))

POLICY = """
schema_version: 1
name: tls-test
networks: {{users: [127.0.0.1/32]}}
principals_file: principals.yaml
listen:
  address: 127.0.0.1
  port: {port}
  tls: {{cert: "{server.cert}", key: "{server.key}"}}
upstream:
  host: 127.0.0.1
  port: {upstream}
  tls: {{{upstream_tls}}}
audiences:
  inference: {{kind: end-user, networks: [users], roles: [user], limits: {{body_bytes: 8192}}}}
  monitoring: {{kind: monitoring, networks: [users], auth: none}}
  none: {{kind: none}}
routes:
  - {{path: /v1/chat/completions, methods: [POST], audience: inference}}
  - {{path: /version, methods: [GET], audience: monitoring}}
  - {{path: /invocations, audience: none}}
"""


@dataclass
class Pki:
    ca: CertAuthority
    vllm: Pair
    perimeter: Pair
    client: Pair

    def upstream_tls(self, client: bool = True, server_name: str = "vllm.test") -> str:
        text = f'ca: "{self.ca.pair.cert}", server_name: {server_name}'
        if client:
            text += f', client_cert: "{self.client.cert}", client_key: "{self.client.key}"'
        return text

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca.pair.cert))


@dataclass
class Tls:
    pki: Pki
    vllm: RealVllmServer
    directory: Path
    keys: dict[str, str]

    def envoy(self, name: str, **upstream: object) -> RunningEnvoy:
        d = self.directory / name
        policy = POLICY.format(port=free_port(), server=self.pki.perimeter, upstream=self.vllm.port,
                               upstream_tls=self.pki.upstream_tls(**upstream))  # type: ignore[arg-type]
        return RunningEnvoy(make_plan(INVENTORY, policy, self.directory), d)


@pytest.fixture(scope="module")
def tls(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    from scanner.inventory.vllm_app import VllmExtraction

    envoy_binary()
    d = tmp_path_factory.mktemp("envoy-tls")
    ca = CertAuthority(d)
    pki = Pki(ca, ca.issue("vllm", dns=("vllm.test",), ips=("127.0.0.1",)),
              ca.issue("perimeter", dns=("perimeter.test",), ips=("127.0.0.1",)),
              ca.issue("envoy-client", client=True))
    _, keys = make_principals(d, ("alice", "user"))
    args = (*EVERYTHING_ARGS, "--ssl-certfile", str(pki.vllm.cert), "--ssl-keyfile", str(pki.vllm.key),
            "--ssl-ca-certs", str(ca.pair.cert), "--ssl-cert-reqs", "2")
    spec = VllmExtraction(python=vllm_python, serve_args=args, tasks=EVERYTHING_TASKS,
                          env=EVERYTHING_ENV, isolated_env=True)
    with RealVllmServer(spec) as server:
        yield Tls(pki, server, d, keys)


def test_vllm_demands_a_client_certificate(tls: Tls) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"https://127.0.0.1:{tls.vllm.port}/version", verify=tls.pki.context(), timeout=10)


def test_tls_both_legs(tls: Tls) -> None:
    with tls.envoy("good") as envoy:
        ctx = tls.pki.context()
        version = raw(envoy.port, "GET", "/version", tls=ctx)
        assert version.status == 200 and not version.denied and "version" in version.json()
        chat = raw(envoy.port, "POST", "/v1/chat/completions", tls=ctx, body=b'{"model": "m"}',
                   headers={"Authorization": f"Bearer {tls.keys['alice']}",
                            "Content-Type": "application/json"})
        assert not chat.denied and chat.status in (400, 422, 500), chat
        denied = raw(envoy.port, "POST", "/invocations", tls=ctx, body=b"{}")
        assert denied.denied and denied.status == 404
        # the listener speaks TLS only
        with pytest.raises((AssertionError, OSError)):
            raw(envoy.port, "GET", "/version", timeout=3)


@pytest.mark.parametrize("upstream", [{"client": False}, {"server_name": "other.test"}],
                         ids=["no-client-cert", "wrong-server-name"])
def test_upstream_tls_failures_fail_closed(tls: Tls, upstream: dict[str, object]) -> None:
    with tls.envoy("bad-" + "-".join(map(str, upstream.values())), **upstream) as envoy:
        reply = raw(envoy.port, "GET", "/version", tls=tls.pki.context())
        # Envoy's own reply, marked as an error of the upstream leg (never vLLM's answer)
        assert reply.status == 503, reply
        assert reply.headers.get(MARKER) == "error", reply
        assert reply.headers.get("x-perimeter-reason") == "upstream-unavailable", reply
