"""inventory openapi: spec -> routes, via a mock transport and via real uvicorn on loopback."""

from __future__ import annotations

import datetime
import ipaddress
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from scanner.errors import InventoryError, TargetUnreachableError, UsageError
from scanner.inventory import openapi
from scanner.inventory.openapi import OpenApiFetch
from scanner.net import free_port
from tests.inventory.conftest import CliResult

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "FastAPI", "version": "0.1.0"},
    "paths": {
        "/v1/models": {"get": {"operationId": "show_available_models_v1_models_get"}},
        "/v1/chat/completions": {"post": {"operationId": "create_chat_completion"}},
        "/tokenize": {"post": {"operationId": "tokenize"}},
        "/ping": {"get": {"operationId": "ping_get"}, "post": {"operationId": "ping_post"},
                  "parameters": [], "summary": "not a method"},
        "/v2/rerank": {"post": {}},
        "/empty": {"summary": "no operations"},
    },
}


def mock(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


def serve_json(body: Any, status: int = 200, ctype: str = "application/json"
               ) -> httpx.MockTransport:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return mock(lambda req: httpx.Response(status, content=raw, headers={"content-type": ctype}))


def test_routes_methods_and_guard_from_spec() -> None:
    inv = openapi.fetch(OpenApiFetch("http://vllm.test:8000"), transport=serve_json(SPEC))
    got = {(r.path, r.methods, r.guarded) for r in inv.routes}
    assert got == {
        ("/v1/models", ("GET",), True),
        ("/v1/chat/completions", ("POST",), True),
        ("/tokenize", ("POST",), False),
        ("/ping", ("GET", "POST"), False),
        ("/v2/rerank", ("POST",), True),
    }  # "/empty" has no operation: not a route
    assert inv.source.kind == "openapi"
    assert inv.source.target == "http://vllm.test:8000/openapi.json"
    assert inv.vllm is None
    assert all(r.kind == "http" and r.origin == "openapi.paths" for r in inv.routes)
    ping = next(r for r in inv.routes if r.path == "/ping")
    assert ping.endpoint == "ping_get,ping_post"


def test_base_url_gets_openapi_json_and_explicit_url_is_kept() -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(str(req.url))
        return httpx.Response(200, json=SPEC)

    openapi.fetch(OpenApiFetch("http://h:1/"), transport=mock(handler))
    openapi.fetch(OpenApiFetch("http://h:1/api/openapi.json"), transport=mock(handler))
    assert seen == ["http://h:1/openapi.json", "http://h:1/api/openapi.json"]


def test_swagger_2_is_accepted() -> None:
    inv = openapi.fetch(OpenApiFetch("http://h"),
                        transport=serve_json({"swagger": "2.0", "paths": {"/a": {"put": {}}}}))
    assert [(r.path, r.methods) for r in inv.routes] == [("/a", ("PUT",))]


def test_html_answer_is_a_clear_error() -> None:
    t = serve_json(b"<!doctype html><html>login</html>", ctype="text/html")
    with pytest.raises(InventoryError, match=r"answer is not JSON \(starts with '<!doctype html>"):
        openapi.fetch(OpenApiFetch("http://h"), transport=t)


@pytest.mark.parametrize("body", [{"paths": {}}, [1, 2], "openapi"])
def test_json_that_is_not_openapi(body: Any) -> None:
    with pytest.raises(InventoryError, match="not an OpenAPI document"):
        openapi.fetch(OpenApiFetch("http://h"), transport=serve_json(body))


def test_paths_not_an_object() -> None:
    with pytest.raises(InventoryError, match="'paths' is not an object"):
        openapi.fetch(OpenApiFetch("http://h"), transport=serve_json({"openapi": "3", "paths": []}))


def test_404_hints_at_disabled_docs() -> None:
    with pytest.raises(InventoryError, match=r"HTTP 404.*--disable-fastapi-docs") as exc:
        openapi.fetch(OpenApiFetch("http://h"), transport=serve_json({"detail": "x"}, 404))
    assert exc.value.exit_code == 2


def test_5xx_is_unreachable() -> None:
    with pytest.raises(TargetUnreachableError, match="HTTP 503") as exc:
        openapi.fetch(OpenApiFetch("http://h"), transport=serve_json({}, 503))
    assert exc.value.exit_code == 3


def test_connect_error_and_timeout_are_unreachable() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=req)

    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=req)

    with pytest.raises(TargetUnreachableError, match=r"unreachable: .*Connection refused"):
        openapi.fetch(OpenApiFetch("http://h"), transport=mock(refuse))
    with pytest.raises(TargetUnreachableError, match=r"no answer within 2\.5s"):
        openapi.fetch(OpenApiFetch("http://h", timeout=2.5), transport=mock(slow))


def test_oversized_answer_is_refused() -> None:
    with pytest.raises(InventoryError, match="larger than 100 bytes"):
        openapi.fetch(OpenApiFetch("http://h", max_bytes=100), transport=serve_json(SPEC))


@pytest.mark.parametrize("url", ["ftp://h/openapi.json", "vllm:8000", "http://"])
def test_non_http_url_is_usage_error(url: str) -> None:
    with pytest.raises(UsageError, match="is not an http"):
        openapi.fetch(OpenApiFetch(url), transport=serve_json(SPEC))


def test_credentials_in_url_never_shown() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach {req.url}", request=req)

    url = "http://admin:pw-hunter2@h/openapi.json?api_key=tok-hunter3"
    with pytest.raises(TargetUnreachableError) as exc:
        openapi.fetch(OpenApiFetch(url), transport=mock(refuse))
    assert "hunter" not in str(exc.value)
    inv = openapi.fetch(OpenApiFetch(url), transport=serve_json(SPEC))
    assert "hunter" not in inv.to_json()
    assert inv.source.target == "http://h/openapi.json?api_key=<redacted>"


# --- a real server on a random loopback port -------------------------------------------


async def spec_endpoint(request: Request) -> JSONResponse:
    return JSONResponse(SPEC)


async def html_endpoint(request: Request) -> PlainTextResponse:
    return PlainTextResponse("<html>not a spec</html>", media_type="text/html")


APP = Starlette(routes=[Route("/openapi.json", spec_endpoint), Route("/page", html_endpoint)])


class Server:
    def __init__(self, **ssl: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(
            APP, host="127.0.0.1", port=self.port, log_level="error", lifespan="off", **ssl))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def http_server() -> Iterator[Server]:
    with Server() as s:
        yield s


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    d = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    with Server(ssl_certfile=str(d / "cert.pem"), ssl_keyfile=str(d / "key.pem")) as s:
        yield s, d / "cert.pem"


def test_real_server_over_loopback(http_server: Server,
                                   run_cli: Callable[..., CliResult]) -> None:
    res = run_cli("inventory", "openapi", f"http://127.0.0.1:{http_server.port}", "--format", "json")
    assert res.rc == 0, res.err
    data = res.json()
    assert data["source"] == {"kind": "openapi",
                              "target": f"http://127.0.0.1:{http_server.port}/openapi.json"}
    assert {r["path"] for r in data["routes"]} == {
        "/v1/models", "/v1/chat/completions", "/tokenize", "/ping", "/v2/rerank"}
    table = run_cli("inventory", "openapi", f"http://127.0.0.1:{http_server.port}")
    assert "3 of 5 routes are outside vLLM's --api-key guard" not in table.out
    assert "2 of 5 routes are outside vLLM's --api-key guard" in table.out


def test_real_server_non_json_page(http_server: Server, run_cli: Callable[..., CliResult]) -> None:
    line = run_cli("inventory", "openapi", f"http://127.0.0.1:{http_server.port}/page") \
        .assert_one_line_error(2)
    assert "answer is not JSON" in line


def test_unreachable_port_is_exit_3(run_cli: Callable[..., CliResult]) -> None:
    port = free_port()  # nothing listens there
    line = run_cli("inventory", "openapi", f"http://127.0.0.1:{port}", "--timeout", "2") \
        .assert_one_line_error(3)
    assert f"http://127.0.0.1:{port}/openapi.json: unreachable" in line


def test_tls_verify_fails_then_ca_file_and_insecure_work(
        tls_server: tuple[Server, Path], run_cli: Callable[..., CliResult]) -> None:
    server, cert = tls_server
    url = f"https://127.0.0.1:{server.port}"
    line = run_cli("inventory", "openapi", url).assert_one_line_error(3)
    assert "TLS certificate verification failed" in line
    ok = run_cli("inventory", "openapi", url, "--ca-file", str(cert), "--format", "json")
    assert ok.rc == 0, ok.err
    assert len(ok.json()["routes"]) == 5
    assert run_cli("inventory", "openapi", url, "--insecure").rc == 0


def test_bad_ca_file_is_usage_error(tmp_path: Path, run_cli: Callable[..., CliResult]) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate", encoding="utf-8")
    line = run_cli("inventory", "openapi", "https://127.0.0.1:1", "--ca-file", str(bad)) \
        .assert_one_line_error(2)
    assert "cannot load CA bundle" in line
