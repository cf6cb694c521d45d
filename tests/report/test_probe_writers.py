"""Probe writers: valid JSON (round trip, merge), SARIF 2.1.0, JUnit XML, Markdown; no key values."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from scanner.probe import result as result_doc
from scanner.probe.interface import ProbeResult, Vantage
from scanner.report.probe_writers import FORMATS, render
from tests.probe import helpers as h


@pytest.fixture(scope="module")
def open_result() -> ProbeResult:
    return h.run(h.open_upstream(h.plan()), "user", "operator")


def test_json_round_trip_and_merge(open_result: ProbeResult) -> None:
    text = render(open_result, "json")
    doc = json.loads(text)
    assert doc["schema_version"] == 1 and doc["summary"]["findings"]["critical"] > 0
    back = result_doc.from_dict(doc)
    assert back.findings == open_result.findings and back.attempts == open_result.attempts
    other = h.run(h.open_upstream(h.plan()), "user", vantages=(Vantage("b", "127.0.0.3"),))
    merged = result_doc.merge([back, other])
    assert set(merged.vantages) == {"default", "b"}
    assert len(merged.attempts) == len(back.attempts) + len(other.attempts)
    assert {f.vantage for f in merged.findings if f.rule != "VP011"} == {"default", "b"}
    assert merged.exit_code() == 1


def test_sarif_required_fields(open_result: ProbeResult) -> None:
    doc = json.loads(render(open_result, "sarif"))
    assert doc["version"] == "2.1.0" and "$schema" in doc
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "vllm-perimeter"
    rule_ids = [r["id"] for r in driver["rules"]]
    assert len(rule_ids) == len(set(rule_ids))
    assert len(run["results"]) == len(open_result.findings)
    for res in run["results"]:
        assert res["ruleId"] in rule_ids and driver["rules"][res["ruleIndex"]]["id"] == res["ruleId"]
        assert res["message"]["text"]
        assert res["level"] in ("error", "warning", "note", "none")
        assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]


def test_junit_parses(open_result: ProbeResult) -> None:
    root = ET.fromstring(render(open_result, "junit"))
    assert root.tag == "testsuites"
    cases = root.findall(".//testcase")
    assert cases and int(root.get("failures", "0")) > 0
    assert any(c.find("failure") is not None for c in cases)
    assert sum(int(s.get("tests", "0")) for s in root.findall("testsuite")) == len(cases)


def test_markdown_and_table(open_result: ProbeResult) -> None:
    md = render(open_result, "markdown")
    assert md.startswith("# vllm-perimeter probe") and "| critical | VP001 |" in md
    assert "VP001" in render(open_result, "table")


def test_no_key_value_in_any_output(open_result: ProbeResult) -> None:
    clean = h.run(h.perimeter(h.plan()), "user", "operator")
    for res in (open_result, clean):
        for fmt in FORMATS:
            text = render(res, fmt)
            for key in (h.USER_KEY, h.OPER_KEY, "vp_wrong"):
                assert key not in text, (fmt, key)
        assert any(fp for _l, fp in res.credentials)  # fingerprints are shown instead


def test_coverage_in_every_writer(open_result: ProbeResult) -> None:
    # a single default vantage cannot reach /pause's admin network: not proven, and said so
    res = h.run(h.perimeter(h.plan()), "user", "operator")
    gaps = [c for c in res.coverage if c.status == "not-proven"]
    skipped = [c for c in res.coverage if c.status == "not-applicable"]
    assert gaps and skipped
    doc = json.loads(render(res, "json"))
    assert doc["summary"]["coverage"]["matrix"]["proved"] > 0
    assert {c["subject"] for c in doc["coverage"]} >= {gaps[0].subject, skipped[0].subject}
    assert result_doc.from_dict(doc).coverage == res.coverage
    table = render(res, "table")
    assert "coverage" in table and all(check in table for check in res.coverage_counts())
    md = render(res, "markdown")
    assert "## Coverage" in md and gaps[0].subject in md and gaps[0].why[:30] in md
    junit = ET.fromstring(render(res, "junit"))
    cases = {c.get("name"): c for c in junit.iter("testcase")}
    assert cases[gaps[0].subject].find("failure") is not None
    assert cases[skipped[0].subject].find("skipped") is not None
    assert int(junit.get("skipped", "0")) == len(skipped)
    assert int(junit.get("failures", "0")) == len(gaps) + sum(c.status == "failed" for c in res.coverage)
    sarif = json.loads(render(res, "sarif"))
    run = sarif["runs"][0]
    assert any(r["ruleId"] == "VP011" for r in run["results"])
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert len(notes) == len(skipped) and skipped[0].why in notes[0]["message"]["text"]
    html = render(res, "html")
    assert "<h2>Coverage</h2>" in html and gaps[0].subject in html
