"""Probe findings as SARIF 2.1.0 (one rule per finding rule, one result per finding)."""

from __future__ import annotations

import json
from typing import Any

from scanner import __version__
from scanner.probe.findings import RULES
from scanner.probe.interface import Finding, ProbeResult

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "note"}
_SCORE = {"critical": "9.5", "high": "8.0", "medium": "5.5", "low": "3.0", "info": "0.0"}


def _rule(rule_id: str) -> dict[str, Any]:
    r = RULES[rule_id]
    return {
        "id": r.id, "name": r.title.title().replace(" ", "").replace("'", ""),
        "shortDescription": {"text": r.title},
        "help": {"text": r.remediation},
        "defaultConfiguration": {"level": _LEVEL[r.severity]},
        "properties": {"security-severity": _SCORE[r.severity], "tags": ["security"]},
    }


def _result(f: Finding, target: str, index: dict[str, int]) -> dict[str, Any]:
    ev = "; ".join(f"{e.request_line} -> {e.status or 'no answer'} ({e.layer}, {e.credential}, "
                   f"{e.vantage})" for e in f.evidence)
    return {
        "ruleId": f.rule, "ruleIndex": index[f.rule], "level": _LEVEL[f.severity],
        "message": {"text": f"{f.title}. {f.detail} Evidence: {ev}"},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path.lstrip("/") or "/"}},
                       "logicalLocations": [{"name": f"{f.method} {f.path}", "kind": "resource",
                                             "fullyQualifiedName": f"{target}{f.path}"}]}],
        "partialFingerprints": {"findingId": f.id},
        "properties": {"severity": f.severity, "vantage": f.vantage, "method": f.method,
                       "evidence": [e.to_dict() for e in f.evidence]},
    }


def _not_applicable(result: ProbeResult) -> list[dict[str, Any]]:
    """What a check did not apply to, and why (not proven subjects are VP011 results)."""
    return [{"level": "note", "descriptor": {"id": f"coverage/{c.check}"},
             "message": {"text": f"{c.check}: not applicable to {c.subject}: {c.why}"}}
            for c in result.coverage if c.status == "not-applicable"]


def render(result: ProbeResult) -> str:
    rule_ids = sorted({f.rule for f in result.findings} | set(RULES))
    index = {r: i for i, r in enumerate(rule_ids)}
    doc = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "vllm-perimeter", "version": __version__,
                                "informationUri": "https://github.com/vllm-perimeter/vllm-perimeter",
                                "rules": [_rule(r) for r in rule_ids]}},
            "invocations": [{"executionSuccessful": not result.unreachable,
                             **({"exitCodeDescription": result.reason} if result.reason else {}),
                             "toolExecutionNotifications": _not_applicable(result)}],
            "properties": {"target": result.target, "planDigest": result.plan_digest,
                           "attempts": len(result.attempts), "coverage": result.coverage_counts()},
            "results": [_result(f, result.target, index) for f in result.findings],
        }],
    }
    return json.dumps(doc, indent=2) + "\n"
