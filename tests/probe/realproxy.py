"""The real proxies for probe tests: one by name, and one probe of a freshly generated config
(optionally weakened by a mutation operator) in front of the stand-in and its witness."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner import mutate, verify
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.policy.model import Policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy
from scanner.standin.serve import StandinThread


def proxy_named(name: str) -> Proxy:
    """"envoy", "nginx" (the static build, else Debian's) or "nginx-debian"; skipped if missing."""
    if name == "envoy":
        return EnvoyProxy()
    build = nginx.debian_build() if name == "nginx-debian" else (nginx.static_build() or nginx.debian_build())
    if build is None:
        pytest.skip(f"no {name}")
    return NginxProxy(build, name)


def probe_through(tmp_path: Path, proxy: Proxy, policy: Policy, catalog: str, options: ProbeOptions,
                  mutant: str = "", keys_per_role: int = 1) -> ProbeResult:
    inventory = load_ref(catalog)
    port = free_port()
    s = verify.setup(inventory, policy, tmp_path, port, keys_per_role=keys_per_role)
    directory = tmp_path / "proxy"
    written = proxy.write(s.plan, directory)
    if mutant:
        mutate.OPERATORS[f"{proxy.kind}.{mutant}"].apply(written, s.plan)
    with StandinThread(inventory, "127.0.0.1", port) as standin:
        return verify.proxy_run(s, proxy, directory, options, standin.url).result
