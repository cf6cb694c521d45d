"""The probe result as a JSON document, and merging results from several vantages/hosts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scanner.errors import ConfigError
from scanner.output import read_json
from scanner.probe.interface import PROBE_SCHEMA_VERSION, Coverage, Finding, ProbeResult
from scanner.severity import severity_rank


def to_dict(r: ProbeResult) -> dict[str, Any]:
    return {
        "schema_version": PROBE_SCHEMA_VERSION,
        "tool": "vllm-perimeter probe",
        "target": r.target, "plan_digest": r.plan_digest, "policy": r.policy,
        "vantages": list(r.vantages),
        "credentials": [{"label": label, "fingerprint": fp} for label, fp in r.credentials],
        "elapsed_s": r.elapsed_s, "unreachable": r.unreachable, "reason": r.reason,
        "summary": {"attempts": len(r.attempts), "findings": r.counts(), "coverage": r.coverage_counts()},
        "findings": [f.to_dict() for f in r.findings],
        "coverage": [c.to_dict() for c in r.coverage],
        "attempts": [a.to_dict() for a in r.attempts],
    }


def to_json(r: ProbeResult) -> str:
    return json.dumps(to_dict(r), indent=2, sort_keys=False) + "\n"


def from_dict(d: dict[str, Any], name: str = "<result>") -> ProbeResult:
    """A probe result validated as scanner.documents.ProbeResultDoc."""
    from scanner.documents import validate

    if not isinstance(d, dict) or d.get("schema_version") != PROBE_SCHEMA_VERSION:
        found = d.get("schema_version") if isinstance(d, dict) else None
        raise ConfigError(f"{name}: not a probe result (schema_version {found!r})")
    doc = validate("probe-result", d, name)
    return ProbeResult(
        target=doc.target, plan_digest=doc.plan_digest, policy=doc.policy, vantages=tuple(doc.vantages),
        credentials=tuple((c.label, c.fingerprint) for c in doc.credentials),
        attempts=tuple(doc.attempts), findings=tuple(doc.findings),
        elapsed_s=doc.elapsed_s, unreachable=doc.unreachable, reason=doc.reason,
        coverage=tuple(doc.coverage),
    )


def load(path: str | Path) -> ProbeResult:
    p = Path(path)
    data = read_json(p, "probe result")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: not a probe result")
    return from_dict(data, str(p))


def merge(results: Sequence[ProbeResult]) -> ProbeResult:
    """One report from runs on different hosts/vantages against the same plan."""
    if not results:
        raise ConfigError("nothing to merge")
    digests = {r.plan_digest for r in results}
    if len(digests) > 1:
        raise ConfigError(f"cannot merge results of different plans: {', '.join(sorted(digests))}")
    findings: dict[str, Finding] = {}
    for r in results:
        for f in r.findings:
            findings.setdefault(f.id, f)
    first = results[0]
    return ProbeResult(
        target=", ".join(dict.fromkeys(r.target for r in results)),
        plan_digest=first.plan_digest, policy=first.policy,
        vantages=tuple(dict.fromkeys(v for r in results for v in r.vantages)),
        credentials=tuple(dict.fromkeys(c for r in results for c in r.credentials)),
        attempts=tuple(a for r in results for a in r.attempts),
        findings=tuple(sorted(findings.values(), key=lambda f: (severity_rank(f.severity), f.path, f.id))),
        elapsed_s=round(sum(r.elapsed_s for r in results), 3),
        unreachable=any(r.unreachable for r in results),
        reason="; ".join(r.reason for r in results if r.reason),
        coverage=_merged_coverage(results),
    )


# A subject failed anywhere failed; else proved from any host or vantage is proved.
_MERGE_ORDER = ("failed", "proved", "not-proven", "not-applicable")


def _merged_coverage(results: Sequence[ProbeResult]) -> tuple[Coverage, ...]:
    best: dict[tuple[str, str], Coverage] = {}
    for r in results:
        for c in r.coverage:
            key = (c.check, c.subject)
            old = best.get(key)
            if old is None or _MERGE_ORDER.index(c.status) < _MERGE_ORDER.index(old.status):
                best[key] = c
    return tuple(best.values())
