"""The mutation run as tables: per proxy, caught/total, the score per family, and every
operator's outcome."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.table import Table

from scanner.mutate import FAMILIES
from scanner.output import text_console
from scanner.verify.loop import ProxyRun
from scanner.verify.mutation import MutantRun


def score(mutants: Sequence[MutantRun], proxy: str, family: str = "") -> tuple[int, int]:
    """(caught, total) for ``proxy`` (and ``family``); operators that do not apply to the plan,
    and a run cut short by Ctrl-C or SIGTERM, are not counted."""
    mine = [m for m in mutants if m.proxy == proxy and m.status not in ("not-applicable", "interrupted")
            and (not family or m.family == family)]
    return sum(m.status == "caught" for m in mine), len(mine)


def family_scores(mutants: Sequence[MutantRun], proxy: str) -> dict[str, tuple[int, int]]:
    """(caught, total) per family with at least one applicable operator, in FAMILIES order."""
    out = {f: score(mutants, proxy, f) for f in FAMILIES}
    return {f: s for f, s in out.items() if s[1]}


def render(runs: Sequence[ProxyRun], mutants: Sequence[MutantRun], width: int = 140) -> str:
    buf = io.StringIO()
    out = text_console(buf, width)
    for run in runs:
        caught, total = score(mutants, run.proxy)
        clean = not run.result.deviations and not run.result.unreachable
        n = len(run.result.deviations)
        title = (f"{run.proxy}: mutation score {caught}/{total}" if clean else
                 f"{run.proxy}: the unmutated config has {n} deviations from the plan: no mutation run")
        table = Table(title=title)
        for col in ("family", "operator", "status", "caught by", "what changed", "s"):
            table.add_column(col, overflow="fold")
        for m in mutants:
            if m.proxy == run.proxy:
                by = " ".join(m.rules) + (f" ({', '.join(m.checks)})" if m.checks else "")
                table.add_row(m.family, m.operator, m.status, by, m.what, f"{m.seconds:.1f}")
        out.print(table)
        families = family_scores(mutants, run.proxy)
        if families:
            out.print("per family: " + ", ".join(f"{f} {c}/{t}" for f, (c, t) in families.items()))
        survivors = [m.operator for m in mutants
                     if m.proxy == run.proxy and m.status in ("survived", "invalid")]
        if survivors:
            out.print(f"NOT CAUGHT: {', '.join(survivors)}")
    return buf.getvalue()
