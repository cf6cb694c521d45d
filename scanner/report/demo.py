"""Render the demo's two runs: the perimeter (zero findings) and vLLM alone (what it leaves open)."""

from __future__ import annotations

import io

from rich.table import Table

from scanner.output import text_console
from scanner.probe.interface import COVERAGE_STATUSES, ProbeResult
from scanner.severity import SEVERITIES
from scanner.verify.demo import DemoResult


def _counts(res: ProbeResult) -> str:
    counts = res.counts()
    return ", ".join(f"{counts[s]} {s}" for s in SEVERITIES)


def _coverage(res: ProbeResult) -> str:
    counts = {s: sum(1 for c in res.coverage if c.status == s) for s in COVERAGE_STATUSES}
    return "coverage: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + " (subjects over all checks)"


def render(result: DemoResult, width: int = 110) -> str:
    buf = io.StringIO()
    out = text_console(buf, width)
    p = result.proxied
    out.print(f"[1] through the generated NGINX ({result.nginx_build}): {len(p.attempts)} requests "
              f"in {p.elapsed_s:.1f}s from {len(p.vantages)} vantages")
    out.print(f"    findings: {_counts(p)}")
    out.print(f"    {_coverage(p)}")
    for f in p.findings:
        out.print(f"    - {f.severity} {f.rule} {f.method} {f.path} [{f.vantage}]: {f.title}")
    b = result.bare
    out.print(f"\n[2] vLLM's --api-key alone, no proxy: {len(b.attempts)} requests in {b.elapsed_s:.1f}s")
    out.print(f"    findings: {_counts(b)}")
    table = Table(title="routes reachable without any key (vLLM's guard covers only "
                        "/v1, /v2, /inference, /cohere)")
    for col in ("method", "path", "plan says", "severity"):
        table.add_column(col)
    seen: set[tuple[str, str]] = set()
    for f in sorted(b.findings, key=lambda f: (SEVERITIES.index(f.severity), f.path)):
        if f.rule not in ("VP001", "VP004") or (f.method, f.path) in seen:
            continue
        seen.add((f.method, f.path))
        decision = result.plan.decision(f.method, f.path)
        table.add_row(f.method, f.path, decision.reason.split(": ", 1)[-1] if decision else "not in plan",
                      f.severity)
    out.print(table)
    out.print("    (state-changing routes were proven reachable with requests vLLM rejects before its "
              f"handler runs; requests that would have changed state: {result.state_changes_bare})")
    proved = all(c.status in ("proved", "not-applicable") for c in p.coverage)
    verdict = "PASS" if not p.findings and not p.unreachable and proved else "FAIL"
    out.print(f"\nperimeter verdict: {verdict}")
    return buf.getvalue()
