"""TLS on both legs: NGINX terminates TLS, and talks mTLS to a real vLLM that accepts only
clients with a certificate from the test CA (so only the proxy can reach it)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scanner.plan.model import DECISION_HEADER
from tests.generate.certs import CertAuthority, Pair
from tests.generate.nginx_harness import BUILDS
from tests.generate.test_nginx_live import bearer, start_perimeter

pytestmark = [pytest.mark.nginx, pytest.mark.vllm]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("pki")
    ca = CertAuthority(directory)
    return {
        "ca": ca,
        "vllm": ca.issue("vllm-upstream", dns=("vllm.internal",), ips=("127.0.0.1",)),
        "proxy_client": ca.issue("perimeter-client", client=True),
        "listener": ca.issue("perimeter", dns=("localhost",), ips=("127.0.0.1",)),
    }


@pytest.fixture(scope="module")
def tls_vllm(vllm_python: str, pki: dict[str, Any]) -> Iterator[Any]:
    from scanner.inventory.vllm_app import VllmExtraction
    from scanner.standin.real import RealVllmServer
    from tests.conftest import EVERYTHING_ARGS, EVERYTHING_ENV, EVERYTHING_TASKS

    server_pair: Pair = pki["vllm"]
    args = (*EVERYTHING_ARGS, "--ssl-certfile", str(server_pair.cert), "--ssl-keyfile", str(server_pair.key),
            "--ssl-ca-certs", str(pki["ca"].pair.cert), "--ssl-cert-reqs", "2")
    spec = VllmExtraction(python=vllm_python, serve_args=args, tasks=EVERYTHING_TASKS,
                          env=EVERYTHING_ENV, isolated_env=True)
    with RealVllmServer(spec) as server:
        yield server


def _client_context(ca: CertAuthority, client: Pair | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.pair.cert))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return ctx


@pytest.mark.parametrize("build_name", sorted(BUILDS))
def test_tls_both_legs(build_name: str, tls_vllm: Any, pki: dict[str, Any], tmp_path: Path) -> None:
    ca: CertAuthority = pki["ca"]
    listener: Pair = pki["listener"]
    client: Pair = pki["proxy_client"]
    nginx, people = start_perimeter(
        build_name, tmp_path, "127.0.0.1", tls_vllm.port, keepalive=False,
        listen_tls=f"  tls: {{cert: {listener.cert}, key: {listener.key}}}\n",
        upstream_tls=(f"  tls: {{ca: {ca.pair.cert}, client_cert: {client.cert}, "
                      f"client_key: {client.key}, server_name: vllm.internal}}\n"))
    try:
        assert nginx.url.startswith("https://")
        with httpx.Client(verify=_client_context(ca), timeout=20) as c:
            r = c.get(nginx.url + "/v1/models", headers=bearer(people["alice"]))
            # vLLM answered (engine-less: a 5xx, whose body the perimeter replaces)
            assert DECISION_HEADER not in r.headers or r.headers.get("X-Perimeter-Reason") == "upstream-error", (
                r.status_code, r.headers, r.text[:200])
            denied = c.get(nginx.url + "/invocations", headers=bearer(people["alice"]))
            assert denied.headers[DECISION_HEADER] == "deny"
        # vLLM itself refuses a client without the CA's client certificate ...
        with httpx.Client(verify=_client_context(ca), timeout=20) as c, pytest.raises(httpx.TransportError):
            c.get(tls_vllm.url + "/v1/models")
        # ... and answers one with it (the proxy's own leg)
        with httpx.Client(verify=_client_context(ca, client), timeout=20) as c:
            assert c.get(tls_vllm.url + "/health").status_code in (200, 500, 503)
    finally:
        nginx.stop()
