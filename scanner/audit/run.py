"""Run an audit: compare configs, re-run the probe, sweep the route surface, scan ports."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from scanner.audit import drift, nginxconf
from scanner.audit.baseline import Baseline
from scanner.audit.model import AuditReport, PortDrift
from scanner.errors import PerimeterError, UsageError
from scanner.inventory import openapi
from scanner.netscan import policy as port_rules
from scanner.netscan import ports as port_sets
from scanner.netscan.scan import ScanRequest
from scanner.netscan.scan import run as netscan_run
from scanner.probe.interface import Attempt, Credential, ProbeOptions, ProbeResult, Target, Vantage
from scanner.probe.runner import catalog_paths, probe

Say = Callable[[str], None]


@dataclass(frozen=True)
class AuditRequest:
    target: Target
    credentials: tuple[Credential, ...]
    vantages: tuple[Vantage, ...]
    options: ProbeOptions
    upstream_url: str | None = None     # sweep the route surface here (default: the target)
    nginx_config: Path | None = None    # the deployed NGINX config to compare
    netscan_host: str | None = None
    netscan_ports: tuple[int, ...] = ()  # empty: the defaults plus the policy's ports
    surface_timeout: float = 5.0


def run(baseline: Baseline, req: AuditRequest, say: Say = lambda _m: None) -> AuditReport:
    started = time.time()
    config, config_note = _config(baseline, req.nginx_config)
    say(f"probe {req.target.base_url} with plan {baseline.plan.digest[:19]}")
    current = probe(baseline.plan, req.target, req.credentials, req.vantages, req.options)
    surface_url = req.upstream_url or req.target.base_url
    say(f"route surface at {surface_url}")
    surface = _surface(baseline, req, current, surface_url)
    ports = _ports(baseline, req, say) if req.netscan_host else None
    return AuditReport(
        baseline=str(baseline.root), signed_by=baseline.signed_by, release=baseline.release,
        config_hash=baseline.plan.digest, plan_matches=baseline.plan_matches,
        target=req.target.base_url, surface_url=surface_url, surface_note=surface.note,
        surface_error=surface.error,
        started_at=started, routes=drift.route_drift(baseline.inventory, surface),
        config=config, config_note=config_note, probe=current,
        probe_drift=drift.probe_drift(baseline.probe, current), ports=ports)


Changes = tuple[nginxconf.DirectiveChange, ...]


def _config(baseline: Baseline, deployed: Path | None) -> tuple[Changes | None, str]:
    if deployed is None:
        return None, "not compared (no --nginx-config)"
    if baseline.nginx_main is None:
        raise UsageError("--nginx-config given but the baseline has no generated NGINX config (nginx/)")
    changes = nginxconf.diff_files(baseline.nginx_main, deployed)
    return changes, f"{deployed} against {baseline.nginx_main}"


def _surface(baseline: Baseline, req: AuditRequest, current: ProbeResult, url: str) -> drift.LiveSurface:
    spec, note = _spec_paths(url, req.surface_timeout, req.target.ca_bundle)
    attempts: Sequence[Attempt] = current.attempts
    error = ""
    if req.upstream_url is not None:
        upstream = Target(req.upstream_url.rstrip("/"), ca_bundle=req.target.ca_bundle)
        # vLLM's own surface: what answers, not what the proxy let through (no witness)
        options = dataclasses.replace(req.options, checks=("sweep",), witness=None, witness_secret="")
        swept = probe(baseline.plan, upstream, req.credentials[:1], (Vantage(),), options)
        attempts, error = swept.attempts, swept.reason if swept.unreachable else ""
    declared = dict(catalog_paths(req.options.catalog_dir))
    found: dict[str, tuple[str, ...]] = {}
    for a in attempts:
        if a.check == "sweep" and a.outcome == "reached":
            found.setdefault(a.path, declared.get(a.path, (a.method,)))
    return drift.LiveSurface(spec, found, note, error)


def _spec_paths(url: str, timeout: float, ca: str | None) -> tuple[dict[str, tuple[str, ...]] | None, str]:
    try:
        inv = openapi.fetch(openapi.OpenApiFetch(url, timeout=timeout, ca_file=ca))
    except UsageError:
        raise
    except PerimeterError as exc:
        return None, f"no OpenAPI spec ({exc}); known-route sweep only"
    paths: dict[str, tuple[str, ...]] = {}
    for r in inv.routes:
        paths[r.path] = tuple(sorted({*paths.get(r.path, ()), *r.methods}))
    return paths, f"OpenAPI spec: {len(paths)} paths; plus the known-route sweep"


def _ports(baseline: Baseline, req: AuditRequest, say: Say) -> PortDrift:
    assert req.netscan_host is not None
    allowed = {r.port for r in port_rules.port_policy(baseline.policy).allow}
    ports = req.netscan_ports or tuple(sorted({*port_sets.default_ports(), *allowed}))
    say(f"netscan {req.netscan_host}: {len(ports)} ports")
    result = netscan_run(ScanRequest(host=req.netscan_host, ports=ports, timeout=1.0), baseline.policy)
    now = result.open_ports()
    before = baseline.open_ports
    return PortDrift(host=req.netscan_host, open_ports=now, new_ports=drift.new_ports(before, now),
                     closed_since=tuple(p for p in before or () if p not in now), findings=result.findings)
