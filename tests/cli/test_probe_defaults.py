"""``probe`` with its default flags (no --rate, no --max-time) finishes against the generated
proxies, as a user runs it: the bundled policy's own limits, a key per role, a vantage per
network and one outside them all; its time limit comes from the plan's lower bound.

The deployment is what ``verify`` sets up (scanner.verify.loop: loopback networks, throwaway keys,
the stand-in), but written to files and probed through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import inputs
from scanner.policy import keys
from scanner.resources import data_file
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop

REPO = Path(__file__).resolve().parents[2]


def proxy_named(name: str) -> Proxy:
    """"envoy", or "nginx": the static build (skipped if missing)."""
    if name == "envoy":
        return EnvoyProxy()
    build = nginx.static_build()
    if build is None:
        pytest.skip("no static NGINX build")
    return NginxProxy(build, name)


@dataclass(frozen=True)
class Deployment:
    """A generated proxy running in front of the stand-in, and the probe's command line for it."""

    url: str
    argv: tuple[str, ...]          # after `vllm-perimeter probe URL`
    env: dict[str, str]            # the keys, by environment variable


@contextmanager
def deployed(tmp_path: Path, proxy_name: str, catalog: str) -> Iterator[Deployment]:
    """``catalog`` behind the bundled policy (its real limits), generated for ``proxy_name``."""
    proxy = proxy_named(proxy_name)
    policy_doc = yaml.safe_load(data_file("policies", "vllm-default.yaml").read_text(encoding="utf-8"))
    port, upstream_port = free_port(), free_port()
    principals = tmp_path / "principals.yaml"
    env: dict[str, str] = {}
    key_args: list[str] = []
    for role in loop.roles_of(inputs.load_policy(None)):
        key = keys.new_key()
        keys.append_principal(principals, f"probe-{role}", role, key)
        env[f"PROBE_KEY_{role.upper()}"] = key
        key_args += ["--key", f"{role}=env:PROBE_KEY_{role.upper()}"]
    policy_doc.update(principals_file=str(principals), listen={"address": "127.0.0.1", "port": port},
                      upstream={"host": "127.0.0.1", "port": upstream_port})
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(policy_doc), encoding="utf-8")
    nets, vantages = loop.loopback(inputs.load_policy(str(policy)))
    net_args = [a for n, cidrs in nets.items() for a in ("--network", f"{n}={','.join(cidrs)}")]
    vantage_args = [a for v in vantages for a in ("--vantage", f"{v.name}={v.address}")]
    plan = inputs.make_plan(catalog, str(policy), nets)
    directory = tmp_path / proxy.name
    proxy.write(plan, directory)
    with ExitStack() as stack:
        loop.start_checked(proxy, plan, directory, stack)
        stack.enter_context(StandinThread(load_ref(catalog), "127.0.0.1", upstream_port))
        yield Deployment(f"http://127.0.0.1:{port}",
                         ("--inventory", catalog, "--policy", str(policy), *net_args, *vantage_args, *key_args),
                         env)


def cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "scanner.cli.main", *argv]


def probe_defaults(tmp_path: Path, proxy_name: str, catalog: str) -> tuple[int, dict[str, object], float]:
    """Exit code, JSON report and seconds of a default-flags probe of ``catalog`` behind the proxy."""
    out = tmp_path / "probe.json"
    with deployed(tmp_path, proxy_name, catalog) as d:
        t0 = time.monotonic()
        proc = subprocess.run(cli("probe", d.url, *d.argv, "--format", "json", "-o", str(out)),
                              env={**os.environ, **d.env}, cwd=REPO, capture_output=True, text=True,
                              check=False, timeout=1500)
        seconds = time.monotonic() - t0
    assert out.exists(), proc.stderr[-2000:]
    return proc.returncode, json.loads(out.read_text(encoding="utf-8")), seconds


def deviations(report: dict[str, object]) -> list[tuple[object, ...]]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return [(f["rule"], f["method"], f["path"], f["vantage"], f["detail"]) for f in findings if f["rule"] != "VP011"]


# NGINX here, Envoy in test_probe_defaults_envoy.py: two modules, so two test workers run them at once
CASES = [
    pytest.param("nginx", "vllm-0.29.0-default", marks=[pytest.mark.nginx, pytest.mark.timeout(900)]),
    pytest.param("nginx", "vllm-0.29.0-everything",
                 marks=[pytest.mark.nginx, pytest.mark.slow, pytest.mark.timeout(1800)]),
]


@pytest.mark.parametrize(("proxy_name", "catalog"), CASES)
def test_default_flags_finish_clean(tmp_path: Path, proxy_name: str, catalog: str) -> None:
    finish_clean(tmp_path, proxy_name, catalog)


def finish_clean(tmp_path: Path, proxy_name: str, catalog: str) -> None:
    """probe with default flags through ``proxy_name`` on ``catalog``: exit 0, no deviation."""
    code, report, seconds = probe_defaults(tmp_path, proxy_name, catalog)
    assert not report.get("unreachable"), report.get("reason")
    assert deviations(report) == []
    assert code == 0
    print(f"{proxy_name} {catalog}: exit {code} in {seconds:.1f}s")
