"""``vllm-perimeter verify``: the closed loop for CI on your own inventory and policy, and
``--mutate``, the prober's own sensitivity (thin: parse, wire, render, exit)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from scanner import stop
from scanner.cli.options import MaxTime, load_diff, report_options
from scanner.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNREACHABLE, UsageError
from scanner.inventory.diff import InventoryDiff
from scanner.output import write_text
from scanner.plan import inputs
from scanner.probe.interface import ProbeOptions
from scanner.report import html
from scanner.report import mutation as render_mutation
from scanner.report.probe_writers import FORMATS, render
from scanner.runtime.proxy import PROXIES, get
from scanner.severity import Severity
from scanner.verify import fleet, loop, mutation

TEXT_FORMATS = ("table", "markdown")
AUTO_FLOOR_S = 300.0   # --max-time auto never gives a run less than this


@click.command("verify")
@click.option("--inventory", "inventory", required=True, metavar="FILE|CATALOG",
              help="Inventory JSON from `inventory ...`, or a bundled catalog name.")
@click.option("--policy", "policy", default=None, metavar="FILE",
              help="Policy YAML (default: the bundled vllm-default policy).")
@click.option("--proxy", "proxies", multiple=True, type=click.Choice(PROXIES),
              help="Proxy to generate, run and probe (repeatable; default: nginx).")
@click.option("--keys-per-role", type=click.IntRange(1, 8), default=2, show_default=True,
              help="Throwaway keys per role: each is its own limiter bucket, so more keys run "
                   "the rate-limited cases in parallel.")
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option("--timeout", type=click.FloatRange(0.1), default=15.0, show_default=True,
              help="Seconds per request.")
@click.option("--max-time", type=MaxTime(), default="auto", show_default=True, metavar="SECONDS|auto",
              help="Seconds per probe run, then partial results and exit 3; auto: 2 x the run's lower "
                   f"bound (each rate-limited lane and token budget at the plan's pace) + 60 s, at "
                   f"least {AUTO_FLOOR_S:g} s.")
@click.option("--mutate", is_flag=True,
              help="Also run every mutation operator against the proxy: each weakened config must be "
                   "caught; exit 1 when one survives.")
@click.option("--operator", "only", multiple=True, metavar="ID",
              help="With --mutate: run only these operators: an id (nginx.rate-dry-run), a name on "
                   "every proxy (rate-dry-run) or a family (switch).")
@click.option("--replicas", type=int, default=None, metavar="N",
              help="A fleet: N replicas of each proxy (2-8), the limiter and a redis-server (the "
                   "policy's shared: section, or on_unavailable: deny); the rate, concurrency and "
                   "token-budget cases are spread over every replica (the limits must hold for the "
                   "sum), slots must come back after their requests, then Redis is stopped and the "
                   "failure policy tried. With --mutate: the fleet's operators (one replica unshared, "
                   "a per-replica key, an orphaned slot, a failover burst, a token bucket of two minutes).")
@report_options(FORMATS, require_proof=True)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def command(inventory: str, policy: str | None, proxies: tuple[str, ...], keys_per_role: int,
            concurrency: int, timeout: float, max_time: float | None, mutate: bool, only: tuple[str, ...],
            replicas: int | None, fmt: str, output: str | None, fail_on: Severity, require_proof: bool,
            diff_refs: tuple[str, str] | None,
            quiet: bool) -> int:
    """Generate, validate, run and probe the proxy for your inventory and policy, on loopback.

    \b
    For each --proxy: throwaway keys per role replace the policy's principals; each policy
    network becomes a loopback address of its own (and one vantage is outside them all);
    the stand-in serves the inventory behind its upstream witness; the generated config is
    checked with `nginx -t` / `envoy --mode validate`, started, and probed with every check,
    state-changing requests included (the stand-in has no state). Everything is cleaned up.

    \b
    Exit: 0 the plan holds, 1 a deviation or a subject not proven (--no-require-proof: deviations
    only; or a mutant survived), 2 usage error,
    3 a proxy rejected its config, a run was cut short, or an internal error.

    \b
    Examples:
      vllm-perimeter verify --inventory inv.json --policy policy.yaml --proxy nginx --proxy envoy
      vllm-perimeter verify --inventory vllm-0.29.0-default --mutate --format json -o verify.json
    """
    names = proxies or ("nginx",)
    runtimes = [get(n) for n in names]
    inv = inputs.load_inventory(inventory)
    pol = inputs.load_policy(policy)
    if len(names) > 1 and output is None and fmt not in TEXT_FORMATS:
        raise UsageError(f"--format {fmt} with several proxies needs -o FILE (one report per proxy)")
    options = ProbeOptions(concurrency=concurrency, rate=0, timeout=timeout, max_time=max_time,
                           auto_floor_s=AUTO_FLOOR_S)
    say = (lambda _m: None) if quiet else (lambda m: click.echo(m, err=True))
    outages: list[fleet.FleetOutage] = []
    slots: list[fleet.FleetSlots] = []
    if replicas is not None:
        fleets, mutants = fleet.loop_all(inv, pol, runtimes, options, keys_per_role, replicas, mutate,
                                         only, say)
        runs = [loop.ProxyRun(f.proxy, f.result, f.seconds) for f in fleets]
        outages = [f.outage for f in fleets if f.outage is not None]
        slots = [f.slots for f in fleets if f.slots is not None]
    elif mutate:
        baselines, mutants = mutation.mutants(inv, pol, runtimes, options, keys_per_role, only, say)
        runs = baselines
    else:
        runs, mutants = loop.run(inv, pol, runtimes, options, keys_per_role, say), []
    if diff_refs and fmt != "html":
        raise UsageError("--diff goes with --format html")
    _write_reports(runs, fmt, output, load_diff(diff_refs))
    if mutate:
        click.echo(render_mutation.render(runs, mutants), nl=False)
    for b in slots:     # sequential requests through each replica (a deviation when one was refused)
        click.echo(f"fleet: {b.what}: {'slots come back' if b.holds else 'slots DO NOT come back'}", err=True)
    for o in outages:   # what happened when Redis was stopped (a deviation when the policy did not hold)
        click.echo(f"fleet: {o.what}: the failure policy {'holds' if o.holds else 'DOES NOT HOLD'}", err=True)
    codes = [r.result.exit_code(fail_on, require_proof) for r in runs]
    if any(not o.holds for o in outages):
        codes.append(EXIT_FINDINGS)
    if mutate and any(m.status in ("survived", "invalid") for m in mutants):
        codes.append(EXIT_FINDINGS)
    if mutate and any(r.result.findings or r.result.unreachable for r in runs):
        codes.append(EXIT_UNREACHABLE if any(r.result.unreachable for r in runs) else EXIT_FINDINGS)
    for r in runs:
        if r.result.unreachable:
            click.echo(f"error: {r.proxy}: partial results: {r.result.reason}", err=True)
    if stop.requested():   # the reports hold what was proven; exit as the signal says (130, 143)
        raise KeyboardInterrupt
    return max(codes, default=EXIT_OK)


def _write_reports(runs: list[loop.ProxyRun], fmt: str, output: str | None,
                   diff: InventoryDiff | None) -> None:
    def text_of(r: loop.ProxyRun) -> str:
        return html.render_probe(r.result, diff) if diff else render(r.result, fmt)

    if len(runs) == 1 or (fmt in TEXT_FORMATS and output is None):
        several = len(runs) > 1
        write_text(output, "".join((f"== {r.proxy} ==\n" if several else "") + text_of(r) for r in runs))
        return
    assert output is not None
    base = Path(output)
    for r in runs:
        write_text(str(base.with_name(f"{base.stem}.{r.proxy}{base.suffix}")), text_of(r))
        if sys.stderr.isatty():
            click.echo(f"wrote {base.with_name(f'{base.stem}.{r.proxy}{base.suffix}')}", err=True)
