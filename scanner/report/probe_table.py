"""Probe result as a terminal table (rich)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from scanner.probe.interface import ProbeResult


def render(result: ProbeResult, width: int = 140) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    table = Table(title=f"{len(result.findings)} findings for {result.target}")
    for col in ("severity", "rule", "finding", "vantage", "evidence"):
        table.add_column(col, overflow="fold")
    for f in result.findings:
        e = f.evidence[0] if f.evidence else None
        ev = f"{e.request_line} -> {e.status or 'no answer'} ({e.layer}, {e.credential})" if e else ""
        table.add_row(f.severity, f.rule, f.title, f.vantage, ev)
    console.print(table)
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items())
    console.print(f"{len(result.attempts)} attempts in {result.elapsed_s:.1f}s; {counts}")
    creds = ", ".join(f"{label} ({fp or 'no key'})" for label, fp in result.credentials)
    console.print(f"credentials: {creds}; vantages: {', '.join(result.vantages)}")
    if result.unreachable:
        console.print(f"TARGET UNREACHABLE / PARTIAL: {result.reason}")
    return buf.getvalue()
