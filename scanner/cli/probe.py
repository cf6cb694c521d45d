"""``vllm-perimeter probe``: prove the plan against a live target (thin: parse, wire, render, exit).

``probe BASE_URL ...`` runs the probe; ``probe merge A.json B.json`` merges results from
several hosts/vantages. ``command`` is the click object to register.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator

import click

from scanner import stop
from scanner.cli.options import (
    DefaultGroup,
    bound_options,
    checks_option,
    credential_options,
    load_diff,
    plan_inputs,
    report_options,
)
from scanner.errors import UsageError
from scanner.output import write_text
from scanner.plan import inputs
from scanner.policy.salt import read_secret
from scanner.probe import certs_cases, config, result
from scanner.probe.canary import Canary
from scanner.probe.interface import AttemptDone, Event, ProbeOptions, ProbeResult, Started, Target
from scanner.probe.runner import run_probe, summarize
from scanner.report import html
from scanner.report.probe_writers import FORMATS, render
from scanner.severity import Severity


@click.group("probe", cls=DefaultGroup)
def command() -> None:
    """Probe a live target (the proxy, or vLLM directly) against the plan.

    \b
    vllm-perimeter probe BASE_URL --inventory INV [--policy POLICY] [options]
    vllm-perimeter probe merge A.json B.json [--format ...]
    """


@command.command("run")
@click.argument("base_url")
@plan_inputs
@credential_options
@click.option("--ca-bundle", default=None, metavar="FILE", help="CA bundle for an HTTPS target.")
@click.option("--client-cert", default=None, metavar="FILE", help="Client certificate (mTLS).")
@click.option("--client-key", default=None, metavar="FILE", help="Client certificate's key (mTLS).")
@bound_options(max_time=None)
@click.option("--pipeline", type=click.IntRange(1, 64), default=1, show_default=True,
              help="HTTP/1.1 requests in flight per connection (pipelining; 1: off).")
@click.option("--client", type=click.Choice(["stream", "httpx"]), default="stream", show_default=True,
              help="HTTP client: verbatim keep-alive streams, or httpx (request variants always "
                   "go over streams: httpx normalises paths).")
@checks_option
@click.option("--witness", default=None, metavar="URL",
              help="Base URL of the upstream witness (the stand-in's own address, or with "
                   "--witness-secret vLLM's own; not the proxy's): what reached the upstream is then "
                   "checked too (headers, path, key, bodies, concurrency).")
@click.option("--witness-secret", default=None, metavar="FILE",
              help="The secret of the witness inside vLLM (`vllm-perimeter witness export`, vLLM started "
                   "with --middleware vllm_perimeter_witness.Witness): every request is tagged with it and "
                   "--witness (then vLLM's own address, never the proxy's) is read with it, sealed.")
@click.option("--salt-secret-file", default=None, metavar="FILE",
              help="The policy's cache_salt_secret_file (cache_salt: per-principal / per-audience): "
                   "with a witness, the salt each request must carry upstream is then checked exactly "
                   "(without it the salt is reported not proven).")
@click.option("--responses-secret-file", default=None, metavar="FILE",
              help="The policy's responses_secret_file (responses: owned): the ownership check then "
                   "seals a probe id for one principal and proves another is refused it, and verifies "
                   "every seal it is handed (without it only raw and forged ids are sent).")
@click.option("--token", "token_specs", multiple=True, metavar="ROLE=file:PATH|env:VAR",
              help="A bearer token of an auth: jwt audience, by reference (never echoed), repeatable: "
                   "the access checks send it beside the keys.")
@click.option("--jwt-signing-key", default=None, metavar="FILE",
              help="A test issuer's private key (PEM) whose public key is in the audience's JWKS: the "
                   "identity check signs its token cases with it (without it only the refusals that "
                   "need no signature are proven; the admitted token is not: VP011).")
@click.option("--cert", "cert_specs", multiple=True, metavar="ROLE=CERT,KEY",
              help="A client certificate of an auth: cert audience and its key (PEM files; repeatable): "
                   "presented in the TLS handshake of the cases that use it (never printed).")
@click.option("--cert-ca", default=None, metavar="CERT,KEY",
              help="The listener's client CA and its private key (a test CA, PEM): the mtls check then "
                   "issues its own certificates (an expired one, an unknown name, each principal's).")
@click.option("--allow-state-changes", is_flag=True,
              help="Send real requests to state-changing routes (staging only).")
@click.option("--ssrf-canary", default=None, metavar="http://ADDRESS:PORT",
              help="Staging with a real multimodal model: listen there (an address of this host "
                   "vLLM can reach) and send media URLs naming it; vLLM fetching one the plan refuses "
                   "is a finding (check ssrf-canary).")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress display (shown only when stderr is a terminal).")
@report_options(FORMATS)
def run_cmd(base_url: str, inventory: str, policy: str | None, networks: tuple[str, ...],
            keys: tuple[str, ...], vantage_specs: tuple[str, ...], ca_bundle: str | None,
            client_cert: str | None, client_key: str | None, concurrency: int, rate: float,
            pipeline: int, client: str, timeout: float, max_time: float | None, checks: tuple[str, ...],
            witness: str | None, witness_secret: str | None, salt_secret_file: str | None,
            responses_secret_file: str | None,
            token_specs: tuple[str, ...],
            jwt_signing_key: str | None, cert_specs: tuple[str, ...], cert_ca: str | None,
            allow_state_changes: bool,
            ssrf_canary: str | None, quiet: bool, fmt: str, output: str | None, fail_on: Severity,
            require_proof: bool, diff_refs: tuple[str, str] | None) -> int:
    """Every route x method x credential x vantage, bypass variants, limits, known-route sweep."""
    target = _target(base_url, ca_bundle, client_cert, client_key)
    plan = inputs.make_plan(inventory, policy, inputs.parse_networks(networks))
    with Canary(ssrf_canary) if ssrf_canary else contextlib.nullcontext() as canary:
        options = ProbeOptions(concurrency=concurrency, rate=rate, pipeline=pipeline, timeout=timeout,
                               client="httpx" if client == "httpx" else "stream", max_time=max_time,
                               allow_state_changes=allow_state_changes, checks=checks,
                               witness=_base_url("--witness", witness) if witness else None,
                               witness_secret=read_witness_secret(witness_secret, witness),
                               salt_secret=read_secret(salt_secret_file).decode() if salt_secret_file else "",
                               owner_secret=_owner_secret(responses_secret_file),
                               canary=canary, jwt_signing_key=_signing_key(jwt_signing_key),
                               cert_ca=_cert_ca(cert_ca))
        creds = (config.credentials(keys) + config.tokens(token_specs, plan)
                 + certs_cases.certs(cert_specs, plan))
        events = run_probe(plan, target, creds, config.vantages(vantage_specs), options)
        res = stop.run(_consume(events, show_progress=not quiet and sys.stderr.isatty()))
    return _finish(res, fmt, output, fail_on, diff_refs, require_proof)


def _cert_ca(spec: str | None) -> str:
    """``--cert-ca CERT,KEY``: checked now (one line, exit 2), read by the mtls check."""
    if not spec:
        return ""
    certs_cases.listener_ca(spec)
    return spec


def read_witness_secret(path: str | None, witness: str | None) -> str:
    """``--witness-secret FILE`` (0600, at least 32 characters), "" none; never echoed."""
    if not path:
        return ""
    if not witness:
        raise UsageError("--witness-secret needs --witness URL (vLLM's own address, where the witness "
                         "inside it serves its records)")
    return read_secret(path, "witness secret file").decode()


def _owner_secret(path: str | None) -> str:
    """The policy's responses secret (--responses-secret-file), "" none; never echoed."""
    return read_secret(path, "responses_secret_file").decode() if path else ""


@command.command("merge")
@click.argument("files", nargs=-1, required=True, metavar="RESULT.json...")
@report_options(FORMATS)
def merge_cmd(files: tuple[str, ...], fmt: str, output: str | None, fail_on: Severity,
              require_proof: bool, diff_refs: tuple[str, str] | None) -> int:
    """Merge JSON results from runs on different hosts into one report."""
    return _finish(result.merge([result.load(f) for f in files]), fmt, output, fail_on, diff_refs,
                   require_proof)


def _finish(res: ProbeResult, fmt: str, output: str | None, fail_on: Severity,
            diff_refs: tuple[str, str] | None = None, require_proof: bool = False) -> int:
    if diff_refs and fmt != "html":
        raise UsageError("--diff goes with --format html")
    write_text(output, html.render_probe(res, load_diff(diff_refs)) if diff_refs else render(res, fmt))
    if res.unreachable:
        click.echo(f"error: target unreachable or partial results: {res.reason}", err=True)
    return res.exit_code(fail_on, require_proof)



def _signing_key(path: str | None) -> str:
    """The --jwt-signing-key file, checked readable here (its key is read by the identity check)."""
    if not path:
        return ""
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise UsageError(f"--jwt-signing-key {path}: not a readable file")
    return os.path.abspath(path)


def _base_url(what: str, url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{what} must start with http:// or https:// (got {url!r})")
    return url.rstrip("/")


def _target(base_url: str, ca: str | None, cert: str | None, key: str | None) -> Target:
    _base_url("BASE_URL", base_url)
    if key and not cert:
        raise UsageError("--client-key needs --client-cert")
    return Target(base_url.rstrip("/"), ca_bundle=ca, client_cert=cert, client_key=key)


async def _consume(events: AsyncIterator[Event], show_progress: bool) -> ProbeResult:
    seen: list[Event] = []
    if not show_progress:
        seen = [e async for e in events]
        return summarize(seen)
    with _Display() as display:
        async for e in events:
            seen.append(e)
            display.handle(e)
    return summarize(seen)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class _Display:
    """The progress display on a terminal (stderr): a handler of the run's events. One line:
    cases decided of those to send, requests sent, rate-limited lanes left, cases failed so far,
    elapsed, the least time still needed (ETA), and the time limit with the bound it came from."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("probe"), BarColumn(bar_width=24), MofNCompleteColumn(), TextColumn("cases"),
            TextColumn("{task.fields[sent]} sent  lanes left {task.fields[lanes]}  "
                       "{task.fields[failed]} failed"),
            TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}  {task.fields[limit]}"),
            console=Console(stderr=True))
        self.task = self.progress.add_task("probe", total=None, sent=0, lanes="-", failed=0, eta="-",
                                           limit="")
        self.lanes = 0
        self.failed = 0

    def __enter__(self) -> _Display:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def handle(self, e: Event) -> None:
        if isinstance(e, Started):
            self.lanes = e.lanes
            by = f"--rate {e.rate:g}" if e.bound_by == "rate" else ("plan's rates" if e.bound_by else "")
            self.progress.update(self.task, total=e.total, lanes=f"{e.lanes}/{e.lanes}",
                                 eta=_clock(e.bound_s),
                                 limit=f"(limit {_clock(e.max_time_s)}, at least {_clock(e.bound_s)}"
                                       f"{': ' + by if by else ''})")
        elif isinstance(e, AttemptDone):
            self.failed += e.attempt.verdict == "failed"
            self.progress.update(self.task, completed=e.done, sent=e.sent, failed=self.failed,
                                 lanes=f"{e.lanes_left}/{self.lanes}", eta=_clock(e.eta_s))
