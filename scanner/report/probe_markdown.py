"""Probe result as Markdown: summary, findings table, then details with evidence."""

from __future__ import annotations

from scanner.probe.interface import ProbeResult


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
    return "\n".join(lines) + "\n"
