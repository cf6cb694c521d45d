"""``vllm-perimeter audit``: drift of a live deployment against a baseline (thin: parse, wire, render).

``audit BASELINE_DIR TARGET_URL ...`` runs the audit; ``audit baseline DIR ...`` writes a baseline.
``command`` is the click object to register.
"""

from __future__ import annotations

from pathlib import Path

import click

from scanner.audit import baseline as baselines
from scanner.audit import metrics
from scanner.audit.run import AuditRequest, run
from scanner.cli.options import (
    DefaultGroup,
    bound_options,
    checks_option,
    credential_options,
    load_diff,
    network_option,
    report_options,
)
from scanner.cli.probe import read_witness_secret
from scanner.errors import UsageError
from scanner.netscan import ports as port_sets
from scanner.output import write_text
from scanner.plan import inputs
from scanner.probe import config
from scanner.probe.interface import ProbeOptions, Target
from scanner.report import audit as writers
from scanner.severity import Severity


@click.group("audit", cls=DefaultGroup)
def command() -> None:
    """Audit a live deployment for drift against a baseline (the nightly job).

    \b
    vllm-perimeter audit BASELINE_DIR TARGET_URL [--key ROLE=env:VAR] [--nginx-config FILE] ...
    vllm-perimeter audit baseline DIR --inventory INV --policy POLICY [--nginx-config-dir DIR] ...
    """


@command.command("run")
@click.argument("baseline_dir")
@click.argument("target_url")
@credential_options
@network_option
@click.option("--public-key", default=None, metavar="PEM",
              help="Expected signer when BASELINE_DIR is an evidence pack.")
@click.option("--upstream-url", default=None, metavar="URL",
              help="Sweep the route surface here (vLLM itself, behind the proxy); default TARGET_URL.")
@click.option("--nginx-config", "nginx_config", default=None, metavar="FILE",
              help="The deployed NGINX config (main file) to compare with the baseline's.")
@click.option("--netscan-host", default=None, metavar="HOST", help="Also sweep this host's TCP ports.")
@click.option("--netscan-ports", default=None, metavar="LIST", help="Ports for --netscan-host.")
@click.option("--ca-bundle", default=None, metavar="FILE", help="CA bundle for an HTTPS target.")
@click.option("--witness", default=None, metavar="URL",
              help="vLLM's own address, where the witness inside it serves its records (with "
                   "--witness-secret): the re-probe then also checks what reached vLLM.")
@click.option("--witness-secret", default=None, metavar="FILE",
              help="The secret of the witness inside vLLM (see `vllm-perimeter witness`).")
@bound_options(max_time=300.0)
@checks_option
@report_options(writers.FORMATS, require_proof=None,
                fail_help="Exit 1 on drift, or on a deviation at least this severe (default: any).")
@click.option("--metrics", "metrics_file", default=None, metavar="FILE",
              help="Write Prometheus text-format metrics to FILE (node_exporter textfile).")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
def run_cmd(baseline_dir: str, target_url: str, keys: tuple[str, ...], vantage_specs: tuple[str, ...],
            networks: tuple[str, ...], public_key: str | None, upstream_url: str | None,
            nginx_config: str | None, netscan_host: str | None, netscan_ports: str | None,
            ca_bundle: str | None, witness: str | None, witness_secret: str | None,
            concurrency: int, rate: float, timeout: float, max_time: float,
            checks: tuple[str, ...], fail_on: Severity, fmt: str, output: str | None,
            metrics_file: str | None, diff_refs: tuple[str, str] | None, quiet: bool) -> int:
    """Re-probe TARGET_URL with the baseline's plan and report drift: routes, config, findings, ports."""
    for url in (target_url, upstream_url, witness):
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"{url!r}: a URL must start with http:// or https://")
    base = baselines.load_or_exit(baseline_dir, public_key, inputs.parse_networks(networks))
    req = AuditRequest(
        target=Target(target_url.rstrip("/"), ca_bundle=ca_bundle),
        credentials=config.credentials(keys), vantages=config.vantages(vantage_specs),
        options=ProbeOptions(concurrency=concurrency, rate=rate, timeout=timeout, max_time=max_time,
                             checks=checks, witness=witness.rstrip("/") if witness else None,
                             witness_secret=read_witness_secret(witness_secret, witness)),
        upstream_url=upstream_url, nginx_config=Path(nginx_config) if nginx_config else None,
        netscan_host=netscan_host,
        netscan_ports=port_sets.parse_ports(netscan_ports) if netscan_ports else ())
    report = run(base, req, say=(lambda _m: None) if quiet else (lambda m: click.echo(m, err=True)))
    write_text(output, writers.render(report, fmt, load_diff(diff_refs)))
    if metrics_file:
        write_text(metrics_file, metrics.render(report))
    if report.unreachable:
        click.echo(f"error: target unreachable or partial results: {report.reason}", err=True)
    return report.exit_code(fail_on)



@command.command("baseline")
@click.argument("out_dir")
@click.option("--inventory", required=True, metavar="FILE|CATALOG", help="Inventory JSON or catalog name.")
@click.option("--policy", required=True, metavar="FILE", help="Policy YAML (its principals file is copied).")
@network_option
@click.option("--nginx-config-dir", default=None, metavar="DIR",
              help="The generated NGINX config directory (from `generate nginx`).")
@click.option("--probe-result", default=None, metavar="FILE", help="The last probe result (JSON).")
@click.option("--netscan-result", default=None, metavar="FILE", help="The last netscan result (JSON).")
def baseline_cmd(out_dir: str, inventory: str, policy: str, networks: tuple[str, ...],
                 nginx_config_dir: str | None, probe_result: str | None, netscan_result: str | None) -> int:
    """Write a baseline directory for `audit`."""
    if not Path(policy).is_file():
        raise UsageError(f"--policy {policy}: no such file")
    given = baselines.BaselineInputs(
        inventory=inventory, policy=Path(policy), networks=inputs.parse_networks(networks),
        nginx_config_dir=Path(nginx_config_dir) if nginx_config_dir else None,
        probe=Path(probe_result) if probe_result else None,
        netscan=Path(netscan_result) if netscan_result else None)
    for name in baselines.create(out_dir, given):
        click.echo(name)
    click.echo(f"wrote baseline {out_dir}")
    return 0
