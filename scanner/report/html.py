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
from scanner.probe.interface import COVERAGE_STATUSES, Attempt, ProbeResult

if TYPE_CHECKING:
    from scanner.audit.model import AuditReport

TEMPLATE = "report.html.j2"
# Cell classes, worst first: a cell holding several attempts shows the worst.
CELL_CLASSES: tuple[str, ...] = ("open", "blocked", "error", "limited", "allowed", "denied", "skipped")
LEGEND: tuple[tuple[str, str], ...] = (
    ("open", "reached but should be denied"),
    ("blocked", "blocked but should be allowed"),
    ("error", "error (no answer)"),
    ("limited", "throttled or size-limited (429/413)"),
    ("allowed", "reached, as expected"),
    ("denied", "denied, as expected"),
    ("skipped", "not sent (state-changing)"),
)


@dataclass(frozen=True)
class Cell:
    css: str
    text: str
    title: str


@dataclass(frozen=True)
class Matrix:
    columns: tuple[tuple[str, str], ...]          # (credential, vantage)
    rows: tuple[tuple[str, tuple[Cell, ...]], ...]  # ("POST /path", cells)

    def count(self, css: str) -> int:
        return sum(1 for _r, cells in self.rows for c in cells if c.css == css)


def cell_class(a: Attempt) -> str:
    if a.outcome == "skipped":
        return "skipped"
    if a.outcome == "error":
        return "error"
    if a.outcome == "reached":
        return "allowed" if a.expected == "allow" else "open"
    if a.outcome == "limited":
        return "limited"
    return "blocked" if a.expected == "allow" else "denied"


def _cell(attempts: Sequence[Attempt]) -> Cell:
    if not attempts:
        return Cell("none", "", "not probed")
    worst = min(attempts, key=lambda a: CELL_CLASSES.index(cell_class(a)))
    css = cell_class(worst)
    shown = str(worst.status) if worst.status is not None else ("skip" if css == "skipped" else "err")
    title = (f"{worst.request_line} as {worst.credential} from {worst.vantage}: expected {worst.expected}, "
             f"got {worst.status if worst.status is not None else worst.error or 'no answer'} "
             f"({worst.outcome}, layer {worst.layer}{', ' + worst.decision if worst.decision else ''})")
    return Cell(css, shown, title)


def matrix(result: ProbeResult) -> Matrix:
    cells: dict[tuple[str, str], dict[tuple[str, str], list[Attempt]]] = {}
    for a in result.attempts:
        if a.check == "matrix":
            cells.setdefault((a.path, a.method), {}).setdefault((a.credential, a.vantage), []).append(a)
    columns = tuple((label, v) for label, _fp in result.credentials for v in result.vantages)
    rows = tuple((f"{method} {path}", tuple(_cell(by_col.get(col, [])) for col in columns))
                 for (path, method), by_col in sorted(cells.items()))
    return Matrix(columns, rows)


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
