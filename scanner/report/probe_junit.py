"""Probe result as JUnit XML: a suite per check, a test case per subject of its coverage
(a plan decision or limit). Proved passes; failed and not proven fail (with the findings and
why); not applicable is skipped (with why). Results without coverage (older JSON) get one
case per (check, method, path, vantage), failing on findings."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from scanner.probe.interface import Attempt, Finding, ProbeResult


def render(result: ProbeResult) -> str:
    suites = ET.Element("testsuites", name="vllm-perimeter probe")
    if result.coverage:
        _by_coverage(result, suites)
    else:
        _by_attempts(result, suites)
    suites.set("tests", str(sum(int(s.get("tests", "0")) for s in suites)))
    suites.set("failures", str(sum(int(s.get("failures", "0")) for s in suites)))
    suites.set("skipped", str(sum(int(s.get("skipped", "0")) for s in suites)))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _by_coverage(result: ProbeResult, suites: ET.Element) -> None:
    findings: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for f in result.findings:
        findings[(f.check, f.method, f.path)].append(f)
    for check in dict.fromkeys(c.check for c in result.coverage):
        items = [c for c in result.coverage if c.check == check]
        suite = ET.SubElement(suites, "testsuite", name=f"probe.{check}", tests=str(len(items)))
        fails = skips = 0
        for c in items:
            case = ET.SubElement(suite, "testcase", classname=f"probe.{check}", name=c.subject)
            if c.status in ("failed", "not-proven"):
                fails += 1
                related = findings.get((check, c.method, c.path), [])
                el = ET.SubElement(case, "failure", type="VP011" if c.status == "not-proven" else c.status,
                                   message=f"{c.status}: {c.why}")
                el.text = "\n".join(f"{f.rule} {f.severity}: {f.title}: {f.detail}" for f in related) or c.why
            elif c.status == "not-applicable":
                skips += 1
                ET.SubElement(case, "skipped", message=c.why)
            else:
                ET.SubElement(case, "system-out").text = c.why
        suite.set("failures", str(fails))
        suite.set("skipped", str(skips))


def _by_attempts(result: ProbeResult, suites: ET.Element) -> None:
    by_cell: dict[tuple[str, str, str, str], list[Attempt]] = defaultdict(list)
    for a in result.attempts:
        by_cell[(a.check, a.method, a.path, a.vantage)].append(a)
    failing: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for f in result.findings:
        failing[(f.method, f.path, f.vantage)].append(f)
    for check in sorted({k[0] for k in by_cell}):
        cells = sorted(k for k in by_cell if k[0] == check)
        suite = ET.SubElement(suites, "testsuite", name=f"probe.{check}", tests=str(len(cells)))
        fails = skips = 0
        for key in cells:
            _c, method, path, vantage = key
            attempts = by_cell[key]
            case = ET.SubElement(suite, "testcase", classname=f"probe.{check}.{vantage}",
                                 name=f"{method} {path}")
            here = failing.get((method, path, vantage), []) + failing.get(("*", path, vantage), [])
            found = [f for f in here if not f.check or f.check == check]
            if found:
                fails += 1
                el = ET.SubElement(case, "failure", type=found[0].rule,
                                   message=f"[{found[0].severity}] {found[0].title}")
                el.text = "\n".join(f"{f.rule} {f.severity}: {f.detail}" for f in found)
            elif all(a.outcome == "skipped" for a in attempts):
                skips += 1
                ET.SubElement(case, "skipped", message=attempts[0].error)
        suite.set("failures", str(fails))
        suite.set("skipped", str(skips))
