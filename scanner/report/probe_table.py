"""Probe result as a terminal table (rich)."""

from __future__ import annotations

import io

from rich.table import Table

from scanner.output import text_console
from scanner.probe.interface import COVERAGE_STATUSES, ProbeResult


def render(result: ProbeResult, width: int = 140) -> str:
    buf = io.StringIO()
    console = text_console(buf, width)
    table = Table(title=f"{len(result.findings)} findings for {result.target}")
    for col in ("severity", "rule", "finding", "vantage", "evidence"):
        table.add_column(col, overflow="fold")
    for f in result.findings:
        e = f.evidence[0] if f.evidence else None
        ev = f"{e.request_line} -> {e.status or 'no answer'} ({e.layer}, {e.credential})" if e else ""
        table.add_row(f.severity, f.rule, f.title, f.vantage, ev)
    console.print(table)
    if result.coverage:
        cov = Table(title="coverage: what each check established, per plan decision or limit")
        for col in ("check", *COVERAGE_STATUSES, "first not proven or not applicable (why)"):
            cov.add_column(col, overflow="fold")
        for check, row in result.coverage_counts().items():
            mine = [c for c in result.coverage if c.check == check]
            gap = next((c for c in mine if c.status == "not-proven"), None) \
                or next((c for c in mine if c.status == "not-applicable"), None)
            cov.add_row(check, *(str(row[s]) for s in COVERAGE_STATUSES),
                        f"{gap.subject}: {gap.why}" if gap else "")
        console.print(cov)
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items())
    console.print(f"{len(result.attempts)} attempts in {result.elapsed_s:.1f}s; {counts}")
    creds = ", ".join(f"{label} ({fp or 'no key'})" for label, fp in result.credentials)
    console.print(f"credentials: {creds}; vantages: {', '.join(result.vantages)}")
    if result.unreachable:
        console.print(f"TARGET UNREACHABLE / PARTIAL: {result.reason}")
    return buf.getvalue()
