"""Running generated NGINX configs in tests: both builds, plans from test policies, raw HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pytest

from scanner.inventory.model import Inventory
from scanner.net import free_port, on_free_port
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy import keys
from scanner.policy.load import loads
from scanner.runtime import nginx as runtime_nginx
from scanner.runtime.process import ManagedProcess
from scanner.runtime.proxy import relisten

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden" / "nginx"
Build = runtime_nginx.NginxBuild


def require(build: Build | None, what: str) -> Build:
    if build is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing; .ci/run installs it")
        pytest.skip(f"{what} is not installed")
    return build


BUILDS = {"static-1.31": runtime_nginx.static_build, "debian-1.22": runtime_nginx.debian_build}


def get_build(name: str) -> Build:
    return require(BUILDS[name](), f"NGINX build {name}")


# --- plans -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Principal:
    name: str
    role: str
    key: str


def make_principals(directory: Path, *spec: tuple[str, str]) -> tuple[Path, dict[str, Principal]]:
    out = {}
    path = directory / "principals.yaml"
    for name, role in spec:
        key = keys.new_key()
        keys.append_principal(path, name, role, key)
        out[name] = Principal(name, role, key)
    return path, out


def make_plan(inventory: Inventory, policy_text: str, base_dir: Path, *,
              extra_yaml: str = "", overrides: dict[str, tuple[str, ...]] | None = None) -> Plan:
    policy = loads(policy_text + "\n" + extra_yaml, source="test-policy.yaml", base_dir=base_dir)
    return build(inventory, policy, overrides)


def default_policy_text() -> str:
    return (REPO / "policies" / "vllm-default.yaml").read_text(encoding="utf-8")


# Loopback vantages: end users from .1 and .2, the admin network is .3, monitoring .1;
# 127.0.0.66 is outside every network.
LOOPBACK_NETWORKS = {
    "public": ("127.0.0.1/32", "127.0.0.2/32"),
    "admin": ("127.0.0.3/32",),
    "monitoring": ("127.0.0.1/32",),
}


# --- a running NGINX ---------------------------------------------------------------------

@dataclass
class RunningNginx:
    """A generated config under a real NGINX (scanner.runtime.nginx), with test accessors."""

    build: Build
    plan: Plan
    directory: Path
    options_extra: dict[str, str] = field(default_factory=dict)
    proc: ManagedProcess | None = None

    @property
    def host(self) -> str:
        return self.plan.listen.address

    @property
    def port(self) -> int:
        return self.plan.listen.port

    @property
    def url(self) -> str:
        scheme = "https" if self.plan.listen.tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.directory / "run" / "access.log"

    @property
    def error_log(self) -> Path:
        return self.directory / "run" / "error.log"

    def write(self) -> Path:
        return runtime_nginx.write(self.plan, self.build, self.directory, self.options_extra)

    def test_config(self) -> subprocess.CompletedProcess[str]:
        main = self.write()
        return subprocess.run([self.build.binary, "-t", "-q", "-p", str(self.directory / "run") + "/",
                               "-c", str(main)], capture_output=True, text=True, timeout=60, check=False)

    def start(self) -> RunningNginx:
        """Write and start; on another port (the plan moved) when its port was taken meanwhile."""
        def at(port: int) -> ManagedProcess:
            if port != self.plan.listen.port:
                self.plan = relisten(self.plan, port)
            return runtime_nginx.process(self.plan, self.build, self.directory, self.options_extra).start()

        self.proc = on_free_port(at, self.plan.listen.port, self.host)
        return self

    def stop(self) -> str:
        proc, self.proc = self.proc, None
        if proc is None:
            return ""
        proc.stop()
        return proc.log_tail(20)

    def __enter__(self) -> RunningNginx:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def listen_yaml(port: int, upstream_host: str, upstream_port: int, tls: str = "",
                upstream_tls: str = "") -> str:
    text = f"listen:\n  address: 127.0.0.1\n  port: {port}\n"
    if tls:
        text += tls
    text += f"upstream:\n  host: {upstream_host}\n  port: {upstream_port}\n"
    if upstream_tls:
        text += upstream_tls
    return text


def new_port() -> int:
    return free_port("127.0.0.1")


# --- raw HTTP (targets sent verbatim, no client-side normalisation) ------------------------

@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def raw_request(port: int, target: str, method: str = "GET", headers: dict[str, str] | None = None,
                body: bytes = b"", source: str = "127.0.0.1", host: str = "127.0.0.1",
                chunked: bool = False, timeout: float = 10.0) -> RawResponse:
    hdrs = {"Host": f"{host}:{port}", "Connection": "close", **(headers or {})}
    if chunked:
        hdrs["Transfer-Encoding"] = "chunked"
        payload = b"".join(f"{len(body[i:i + 4096]):x}\r\n".encode() + body[i:i + 4096] + b"\r\n"
                           for i in range(0, len(body), 4096)) + b"0\r\n\r\n"
    else:
        if body or method in ("POST", "PUT", "PATCH"):
            hdrs["Content-Length"] = str(len(body))
        payload = body
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect((host, port))
        s.sendall(head.encode("latin-1") + payload)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    parsed: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        parsed[k.strip().lower()] = v.strip()
    return RawResponse(status, parsed, rest)
