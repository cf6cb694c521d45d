"""The mutation run as a table: per proxy, caught/total and every operator's outcome."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.table import Table

from scanner.output import text_console
from scanner.verify import MutantRun, ProxyRun


def score(mutants: Sequence[MutantRun], proxy: str) -> tuple[int, int]:
    """(caught, total) for ``proxy``; operators that do not apply to the plan are not counted."""
    mine = [m for m in mutants if m.proxy == proxy and m.status != "not-applicable"]
    return sum(m.status == "caught" for m in mine), len(mine)


def render(runs: Sequence[ProxyRun], mutants: Sequence[MutantRun], width: int = 140) -> str:
    buf = io.StringIO()
    out = text_console(buf, width)
    for run in runs:
        caught, total = score(mutants, run.proxy)
        clean = not run.result.findings and not run.result.unreachable
        n = len(run.result.findings)
        title = (f"{run.proxy}: mutation score {caught}/{total}" if clean else
                 f"{run.proxy}: the unmutated config has {n} findings: no mutation run")
        table = Table(title=title)
        for col in ("operator", "status", "caught by", "what changed", "s"):
            table.add_column(col, overflow="fold")
        for m in mutants:
            if m.proxy == run.proxy:
                table.add_row(m.operator, m.status, " ".join(m.rules), m.what, f"{m.seconds:.1f}")
        out.print(table)
        survivors = [m.operator for m in mutants
                     if m.proxy == run.proxy and m.status in ("survived", "invalid")]
        if survivors:
            out.print(f"NOT CAUGHT: {', '.join(survivors)}")
    return buf.getvalue()
