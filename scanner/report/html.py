"""Self-contained HTML reports (inline CSS, no scripts, no external assets) for probe and audit.

The route x credential x vantage matrix is a colour grid: rows are method + path, columns
credential x vantage, and each cell's colour is what happened against what the plan expects.
Everything is escaped by jinja2's autoescape; no key ever reaches a writer (attempts carry a
credential label and fingerprint only).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import jinja2

from scanner import __version__, resources
from scanner.inventory.diff import InventoryDiff
from scanner.inventory.model import HTTP_METHODS
from scanner.probe.interface import COVERAGE_STATUSES, Attempt, ProbeResult

if TYPE_CHECKING:
    from scanner.audit.model import AuditReport

TEMPLATE = "report.html.j2"
# What happened to a request, worst first: a cell holding several attempts shows the worst,
# with the counts of each in its tooltip.
CELL_CLASSES: tuple[str, ...] = ("open", "blocked", "inconclusive", "refused", "guarded", "limited",
                                 "allowed", "denied", "skipped")
LEGEND: tuple[tuple[str, str, str], ...] = (
    ("open", "served by vLLM (2xx/3xx) though the plan denies it", "#d32f2f"),
    ("blocked", "refused though the plan allows it", "#fb8c00"),
    ("inconclusive", "inconclusive (no answer, a proxy 5xx, a refusal for another reason)", "#7b1fa2"),
    ("refused", "let through, refused by vLLM itself (404/405/422)", "#ffab91"),
    ("guarded", "let through, refused by vLLM's own --api-key (401)", "#fff59d"),
    ("limited", "limited by the perimeter (429), as a burst expects", "#80deea"),
    ("allowed", "served, as the plan allows", "#66bb6a"),
    ("denied", "denied by the perimeter for the expected reason", "#cfd8dc"),
    ("skipped", "not sent (state-changing)", "#ffffff"),
)


@dataclass(frozen=True)
class Cell:
    css: str
    text: str
    title: str


@dataclass(frozen=True)
class MatrixGrid:
    methods: tuple[str, ...]                       # columns
    rows: tuple[tuple[str, tuple[Cell, ...]], ...]  # (path, one cell per method)

    def count(self, css: str) -> int:
        return sum(1 for _r, cells in self.rows for c in cells if c.css == css)


def cell_class(a: Attempt) -> str:
    """What one attempt shows: by its verdict, and for a request let through, by who answered."""
    if a.verdict == "skipped" or a.outcome == "skipped":
        return "skipped"
    if a.verdict == "inconclusive":
        return "inconclusive"
    if a.expected == "allow":
        if a.verdict == "proved":
            return "limited" if a.outcome == "limited" else "allowed"
        return "blocked"
    if a.verdict == "proved":
        return "denied"
    if a.outcome == "guarded":
        return "guarded"
    if a.outcome == "absent" or (a.layer == "upstream" and a.status in (400, 404, 405, 422)):
        return "refused"
    return "open"


def _cell(attempts: Sequence[Attempt]) -> Cell:
    if not attempts:
        return Cell("none", "", "not probed")
    classes = [cell_class(a) for a in attempts]
    worst_css = min(classes, key=CELL_CLASSES.index)
    worst = attempts[classes.index(worst_css)]
    bad = sum(1 for c in classes if c == worst_css)
    shown = (str(worst.status) if worst.status is not None else ("skip" if worst_css == "skipped" else "err"))
    if worst_css not in ("allowed", "denied") and bad > 1:
        shown += f"×{bad}"
    counts = ", ".join(f"{n} {c}" for c in CELL_CLASSES if (n := classes.count(c)))
    title = (f"{len(attempts)} attempts: {counts}. Worst: {worst.request_line} as {worst.credential} from "
             f"{worst.vantage}: expected {worst.expected}, got "
             f"{worst.status if worst.status is not None else worst.error or 'no answer'} "
             f"({worst.outcome}, layer {worst.layer}{', ' + worst.reason if worst.reason else ''})"
             f"{'; ' + worst.why if worst.why else ''}")
    return Cell(worst_css, shown, title)


def matrix(result: ProbeResult) -> MatrixGrid:
    """One row per path, one column per method, every credential and vantage in each cell."""
    cells: dict[str, dict[str, list[Attempt]]] = {}
    for a in result.attempts:
        if a.check == "matrix":
            cells.setdefault(a.path, {}).setdefault(a.method, []).append(a)
    methods = tuple(m for m in HTTP_METHODS if any(m in by for by in cells.values()))
    extra = tuple(sorted({m for by in cells.values() for m in by} - set(methods)))
    columns = methods + extra
    rows = tuple((path, tuple(_cell(by.get(m, [])) for m in columns)) for path, by in sorted(cells.items()))
    return MatrixGrid(columns, rows)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resources.data_dir("templates"))),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env


def _probe_context(result: ProbeResult) -> dict[str, Any]:
    return {"probe": result, "matrix": matrix(result), "legend": LEGEND, "counts": result.counts(),
            "credentials": result.credentials, "coverage_statuses": COVERAGE_STATUSES}


def _render(context: dict[str, Any]) -> str:
    base = {"version": __version__, "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "diff": None, "audit": None}
    diff = context.get("diff")
    rows = list(changes_table(diff)) if isinstance(diff, InventoryDiff) else []
    return _environment().get_template(TEMPLATE).render({**base, **context, "diff_rows": rows})


def render_probe(result: ProbeResult, diff: InventoryDiff | None = None) -> str:
    return _render({"title": f"vllm-perimeter probe: {result.target}", **_probe_context(result),
                    "diff": diff})


def render(result: ProbeResult) -> str:
    """The probe writer (``--format html``)."""
    return render_probe(result)


def render_audit(report: AuditReport, diff: InventoryDiff | None = None) -> str:
    return _render({"title": f"vllm-perimeter audit: {report.target}", **_probe_context(report.probe),
                    "audit": report, "summary": report.summary(), "diff": diff})


def changes_table(diff: InventoryDiff) -> Iterable[dict[str, str]]:
    for c in diff.changes:
        side = c.new or c.old
        yield {"change": c.change, "path": c.path, "methods": " ".join(side.methods) if side else "",
               "guard": "OPEN" if c.outside_guard else "guarded", "fields": ", ".join(c.fields)}
