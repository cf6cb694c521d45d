"""Render a sweep as a table (rich) or JSON."""

from __future__ import annotations

import io

from rich.table import Table

from scanner import canonical
from scanner.netscan.model import ScanResult
from scanner.netscan.ports import known
from scanner.output import text_console


def render(result: ScanResult, fmt: str) -> str:
    return canonical.dumps(result.to_dict()) if fmt == "json" else to_table(result)


def to_table(result: ScanResult, width: int = 140) -> str:
    buf = io.StringIO()
    console = text_console(buf, width)
    v = result.vantage
    console.print(f"netscan {result.host} ({result.address}) from {v.label} "
                  f"[networks: {', '.join(v.networks) or '-'}], policy {result.policy}", markup=False)
    console.print(f"method: {result.method} - {result.method_note}", markup=False)
    table = Table()
    for col in ("port", "state", "service", "reason", "latency ms", "finding"):
        table.add_column(col, overflow="fold")
    flagged = {f.port: f for f in result.findings}
    for a in result.attempts:
        k = known(a.port)
        f = flagged.get(a.port)
        service = " ".join(x for x in (k.name if k else "", f"[{a.service}]" if a.service else "") if x)
        table.add_row(str(a.port), a.state, service, a.reason, f"{a.latency_ms:.1f}",
                      f"{f.severity.upper()} {f.rule}" if f else "")
    console.print(table)
    counts = {s: sum(1 for a in result.attempts if a.state == s) for s in ("open", "closed", "filtered")}
    console.print(f"{len(result.attempts)} ports in {result.elapsed_s:.2f}s: "
                  + ", ".join(f"{n} {s}" for s, n in counts.items())
                  + f"; {len(result.findings)} finding(s)")
    for f in result.findings:
        console.print(f"[{f.severity.upper()}] {f.rule} {f.title}\n  {f.detail}\n  fix: {f.remediation}",
                      markup=False)
    return buf.getvalue()
