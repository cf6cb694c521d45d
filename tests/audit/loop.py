"""A deployment on loopback for audit tests: stand-in (bundled catalog) behind generated NGINX.

Policy = the bundled default + a user key + loopback networks; the baseline directory is written
with ``audit baseline`` from the catalog, the policy, the generated NGINX config and a probe result.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner, Result

from scanner.cli.main import cli
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy import keys
from scanner.policy.load import load
from scanner.probe import config
from scanner.probe import result as probe_result
from scanner.probe.interface import ProbeOptions, Target
from scanner.probe.runner import probe
from scanner.resources import data_file
from scanner.runtime import nginx
from scanner.standin.serve import StandinThread

BASE_CATALOG = "vllm-0.29.0-default"
GROWN_CATALOG = "vllm-0.29.0-everything"
NETWORKS = ("public=127.0.0.1/32", "monitoring=127.0.0.2/32", "admin=127.0.0.3/32")
ROLES = (("alice", "user"), ("billing-svc", "service"), ("ops", "operator"))
KEY_SPECS = tuple(f"{role}=env:AUDIT_TEST_KEY_{role.upper()}" for _n, role in ROLES)
OPTIONS = ProbeOptions(rate=0, concurrency=8, max_time=60, timeout=15)


@dataclass(frozen=True)
class Loop:
    work: Path
    baseline: Path
    plan: Plan
    proxy_url: str
    upstream_port: int
    nginx_main: Path
    keys: dict[str, str]          # env var -> key value (only in the test process)

    @property
    def upstream_url(self) -> str:
        return f"http://127.0.0.1:{self.upstream_port}"

    def env(self) -> dict[str, str]:
        return dict(self.keys)

    def key_args(self) -> list[str]:
        return [a for spec in KEY_SPECS for a in ("--key", spec)]


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False, standalone_mode=False)


def _policy(work: Path, proxy_port: int, upstream_port: int) -> tuple[Path, dict[str, str]]:
    secrets = {}
    for name, role in ROLES:
        key = keys.new_key()
        keys.append_principal(work / "principals.yaml", name, role, key)
        secrets[f"AUDIT_TEST_KEY_{role.upper()}"] = key
    text = data_file("policies", "vllm-default.yaml").read_text(encoding="utf-8")
    text += (f"\nprincipals_file: principals.yaml\n"
             f"listen: {{address: 127.0.0.1, port: {proxy_port}}}\n"
             f"upstream: {{host: 127.0.0.1, port: {upstream_port}}}\n")
    (work / "policy.yaml").write_text(text, encoding="utf-8")
    return work / "policy.yaml", secrets


@contextmanager
def deployment(work: Path) -> Iterator[tuple[Loop, ExitStack]]:
    """Stand-in (default catalog) + NGINX; the baseline written; yields the loop and the stack
    that owns the stand-in (tests swap it for another catalog's)."""
    upstream_port, proxy_port = free_port(), free_port()
    policy_path, key = _policy(work, proxy_port, upstream_port)
    nets = {n.split("=")[0]: (n.split("=")[1],) for n in NETWORKS}
    plan = build(load_ref(BASE_CATALOG), load(policy_path), nets)
    with ExitStack() as outer:
        proxy = outer.enter_context(nginx.process(plan, nginx.any_build(), work / "deploy"))
        standin = ExitStack()
        outer.callback(standin.close)
        standin.enter_context(StandinThread(load_ref(BASE_CATALOG), "127.0.0.1", upstream_port))
        creds = config.credentials(KEY_SPECS, environ=key)
        first = probe(plan, Target(f"http://127.0.0.1:{proxy.port}"), creds, (), OPTIONS)
        (work / "probe.json").write_text(probe_result.to_json(first), encoding="utf-8")
        conf = work / "deploy" / "conf"
        res = invoke("audit", "baseline", str(work / "baseline"), "--inventory", BASE_CATALOG,
                     "--policy", str(policy_path), *[a for n in NETWORKS for a in ("--network", n)],
                     "--nginx-config-dir", str(conf), "--probe-result", str(work / "probe.json"))
        assert res.return_value == 0, res.output
        loop = Loop(work, work / "baseline", plan, f"http://127.0.0.1:{proxy.port}", upstream_port,
                    conf / "nginx.conf", key)
        yield loop, standin


def edited_config(loop: Loop, dest: Path) -> Path:
    """A copy of the deployed config with one extra location (someone 'fixed' prod by hand)."""
    shutil.copytree(loop.nginx_main.parent, dest)
    http = dest / "perimeter-http.conf"
    text = http.read_text(encoding="utf-8")
    at = text.index("    location ")
    http.write_text(text[:at] + "    # hotfix\n    location = /debug { proxy_pass http://127.0.0.1:9; }\n"
                    + text[at:], encoding="utf-8")
    return dest / "nginx.conf"
