"""Probe result as JUnit XML: one test case per (check, method, path, vantage); findings fail."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from scanner.probe.interface import Attempt, Finding, ProbeResult


def render(result: ProbeResult) -> str:
    by_cell: dict[tuple[str, str, str, str], list[Attempt]] = defaultdict(list)
    for a in result.attempts:
        by_cell[(a.check, a.method, a.path, a.vantage)].append(a)
    failing: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for f in result.findings:
        failing[(f.method, f.path, f.vantage)].append(f)
    suites = ET.Element("testsuites", name="vllm-perimeter probe", tests=str(len(by_cell)))
    checks = sorted({k[0] for k in by_cell})
    total_fail = 0
    for check in checks:
        cells = sorted(k for k in by_cell if k[0] == check)
        suite = ET.SubElement(suites, "testsuite", name=f"probe.{check}", tests=str(len(cells)))
        fails = skips = 0
        for key in cells:
            _c, method, path, vantage = key
            attempts = by_cell[key]
            case = ET.SubElement(suite, "testcase", classname=f"probe.{check}.{vantage}",
                                 name=f"{method} {path}",
                                 time=f"{sum(a.latency_ms for a in attempts) / 1000:.3f}")
            found = _findings_for(failing, method, path, vantage, check)
            if found:
                fails += 1
                worst = found[0]
                el = ET.SubElement(case, "failure", type=worst.rule,
                                   message=f"[{worst.severity}] {worst.title}")
                el.text = "\n".join(f"{f.rule} {f.severity}: {f.detail}" for f in found)
            elif all(a.outcome == "skipped" for a in attempts):
                skips += 1
                ET.SubElement(case, "skipped", message=attempts[0].error)
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join(f"{a.request_line} [{a.credential}] -> {a.status or a.error} "
                                 f"({a.layer}, {a.outcome})" for a in attempts[:20])
        suite.set("failures", str(fails))
        suite.set("skipped", str(skips))
        total_fail += fails
    suites.set("failures", str(total_fail))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _findings_for(failing: dict[tuple[str, str, str], list[Finding]], method: str, path: str,
                  vantage: str, check: str) -> list[Finding]:
    out = [f for m in (method, "*") for f in failing.get((m, path, vantage), [])]
    out += [f for (m, p, v), fs in failing.items() if p == path and v == vantage and method in m.split(",")
            and m not in (method, "*") for f in fs]
    wanted = {"matrix": ("VP001", "VP002", "VP003", "VP006", "VP008", "VP009"), "bypass": ("VP004", "VP008"),
              "spoof": ("VP003",), "sweep": ("VP007",), "limits": ("VP005",), "rate": ("VP005",)}
    return [f for f in out if f.rule in wanted.get(check, ())]
