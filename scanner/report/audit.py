"""Audit report writers: table (terminal), JSON, Markdown, HTML."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence

from rich.table import Table

from scanner.audit.model import AuditReport
from scanner.inventory.diff import InventoryDiff
from scanner.output import text_console
from scanner.report import html

FORMATS: tuple[str, ...] = ("table", "json", "markdown", "html")
MAX_ROWS = 50


def to_json(report: AuditReport) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def _headline(report: AuditReport) -> list[str]:
    s = report.summary()
    counts = ", ".join(f"{k} {v}" for k, v in s["findings"].items())
    lines = [
        f"audit {report.target} against {report.baseline} (vLLM {report.release}, "
        f"config {report.config_hash_short}{', signed by ' + report.signed_by if report.signed_by else ''})",
        f"drift: {'YES' if report.drift else 'none'}; routes +{s['routes_added']} -{s['routes_removed']}; "
        f"config changes {s['config_changes'] if s['config_changes'] is not None else 'n/a'}; "
        f"findings new {s['findings_new']} resolved {s['findings_resolved']}; "
        f"outcome changes {s['outcome_changes']}; "
        f"new open ports {s['ports_new'] if s['ports_new'] is not None else 'n/a'}",
        f"findings now: {counts}",
        f"route surface at {report.surface_url}: {report.surface_note}",
        f"nginx config: {report.config_note}",
    ]
    if not report.plan_matches:
        lines.append("the baseline's plan.json no longer matches its inventory + policy")
    if report.unreachable:
        lines.append(f"TARGET UNREACHABLE / PARTIAL: {report.reason}")
    return lines


def _table(title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows[:MAX_ROWS]:
        table.add_row(*row)
    if len(rows) > MAX_ROWS:
        table.add_row(f"... {len(rows) - MAX_ROWS} more", *([""] * (len(columns) - 1)))
    return table


def to_table(report: AuditReport, width: int = 140) -> str:
    buf = io.StringIO()
    console = text_console(buf, width)
    for line in _headline(report):
        console.print(line, highlight=False, markup=False)
    if report.routes:
        console.print(_table("route drift", ("change", "path", "methods", "seen by"),
                             [(r.change, r.path, " ".join(r.methods), r.source) for r in report.routes]))
    if report.config:
        console.print(_table("config drift", ("change", "context", "directive", "baseline", "deployed"),
                             [(c.change, c.context, c.directive, c.old, c.new) for c in report.config]))
    d = report.probe_drift
    changes = [("new", f.severity, f.rule, f.title) for f in d.new_findings]
    changes += [("resolved", f.severity, f.rule, f.title) for f in d.resolved_findings]
    if changes:
        console.print(_table("findings changed", ("change", "severity", "rule", "finding"), changes))
    if d.outcome_changes:
        console.print(_table("outcomes changed", ("request", "credential", "vantage", "baseline", "now"),
                             [(c.request_line, c.credential, c.vantage, c.old, c.new)
                              for c in d.outcome_changes]))
    if report.ports is not None:
        p = report.ports
        console.print(f"ports of {p.host}: open {_ports(p.open_ports)}; new {_ports(p.new_ports)}; "
                      f"closed since {_ports(p.closed_since)}", highlight=False, markup=False)
        for f in p.findings:
            console.print(f"[{f.severity.upper()}] {f.rule} {f.title}", highlight=False, markup=False)
    return buf.getvalue()


def _ports(ports: tuple[int, ...]) -> str:
    return ", ".join(map(str, ports)) or "none"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(heading: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    if not rows:
        return []
    out = ["", f"## {heading}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return out + ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]


def to_markdown(report: AuditReport) -> str:
    lines = [f"# vllm-perimeter audit: {_md(report.target)}", ""]
    lines += [f"- {_md(line)}" for line in _headline(report)]
    lines += _md_table("Route drift", ("change", "path", "methods", "seen by"),
                       [(r.change, f"`{r.path}`", " ".join(r.methods), r.source) for r in report.routes])
    lines += _md_table("Config drift", ("change", "context", "directive", "baseline", "deployed"),
                       [(c.change, f"`{c.context}`", f"`{c.directive}`", f"`{c.old}`", f"`{c.new}`")
                        for c in report.config or ()])
    d = report.probe_drift
    lines += _md_table("Findings changed", ("change", "severity", "rule", "finding"),
                       [("new", f.severity, f.rule, f.title) for f in d.new_findings]
                       + [("resolved", f.severity, f.rule, f.title) for f in d.resolved_findings])
    lines += _md_table("Outcomes changed", ("request", "credential", "vantage", "baseline", "now"),
                       [(f"`{c.request_line}`", c.credential, c.vantage, c.old, c.new)
                        for c in d.outcome_changes])
    if report.ports is not None:
        lines += ["", f"Ports of {report.ports.host}: new {_ports(report.ports.new_ports)}"]
    return "\n".join(lines) + "\n"


WRITERS: dict[str, Callable[[AuditReport], str]] = {
    "table": to_table, "json": to_json, "markdown": to_markdown, "html": html.render_audit,
}


def render(report: AuditReport, fmt: str, diff: InventoryDiff | None = None) -> str:
    if fmt == "html":
        return html.render_audit(report, diff)
    return WRITERS[fmt](report)
