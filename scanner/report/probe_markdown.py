"""Probe result as Markdown: summary, findings table, then details with evidence."""

from __future__ import annotations

from scanner.probe.interface import COVERAGE_STATUSES, ProbeResult


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(result: ProbeResult) -> str:
    counts = result.counts()
    lines = [
        f"# vllm-perimeter probe: {result.target}", "",
        f"- policy `{result.policy}`, plan `{result.plan_digest}`",
        f"- vantages: {', '.join(result.vantages)}; credentials: "
        + ", ".join(f"{label} ({fp or 'no key'})" for label, fp in result.credentials),
        f"- {len(result.attempts)} attempts in {result.elapsed_s:.1f} s; findings: "
        + ", ".join(f"{k} {v}" for k, v in counts.items()),
    ]
    if result.unreachable:
        lines.append(f"- **target unreachable / partial results**: {result.reason}")
    lines += ["", "## Findings", ""]
    if not result.findings:
        lines.append("No findings.")
    else:
        lines += ["| severity | rule | finding | vantage |", "|---|---|---|---|"]
        lines += [f"| {f.severity} | {f.rule} | {_cell(f.title)} | {f.vantage} |" for f in result.findings]
        lines += ["", "## Details", ""]
        for f in result.findings:
            lines += [f"### {f.rule} {f.severity}: {_cell(f.title)}", "", f.detail, "",
                      f"Remediation: {f.remediation}", ""]
            lines += [f"- `{e.request_line}` as {e.credential} from {e.vantage}: "
                      f"{e.status or 'no answer'} ({e.layer}, {e.outcome}){' - ' + e.note if e.note else ''}"
                      for e in f.evidence]
            lines.append("")
    lines += coverage(result)
    return "\n".join(lines) + "\n"


def coverage(result: ProbeResult) -> list[str]:
    """The coverage table per check, then every subject not proven or not applicable, with why."""
    if not result.coverage:
        return []
    lines = ["", "## Coverage", "", "| check | " + " | ".join(COVERAGE_STATUSES) + " |",
             "|---" * (len(COVERAGE_STATUSES) + 1) + "|"]
    for check, row in result.coverage_counts().items():
        lines.append(f"| {check} | " + " | ".join(str(row[s]) for s in COVERAGE_STATUSES) + " |")
    gaps = [c for c in result.coverage if c.status in ("not-proven", "not-applicable", "failed")]
    if gaps:
        lines += ["", "| check | subject | status | why |", "|---|---|---|---|"]
        lines += [f"| {c.check} | {_cell(c.subject)} | {c.status} | {_cell(c.why)} |" for c in gaps]
    return lines
