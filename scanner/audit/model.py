"""The audit report: drift of a live deployment against its baseline, plus the new probe result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from scanner import jsondoc
from scanner.audit.drift import ProbeDrift, RouteDrift
from scanner.audit.nginxconf import DirectiveChange
from scanner.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNREACHABLE
from scanner.jsondoc import CONFIG, Flag, Num, Str, Version1
from scanner.netscan.model import PortFinding
from scanner.probe import result as probe_result
from scanner.probe.interface import ProbeResult
from scanner.severity import FAIL_ON_DEFAULT, Severity, fails

AUDIT_SCHEMA_VERSION: Final = 1


@dataclass(frozen=True)
class PortDrift:
    host: str
    open_ports: tuple[int, ...]
    new_ports: tuple[int, ...]
    closed_since: tuple[int, ...]
    findings: tuple[PortFinding, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "open_ports": list(self.open_ports), "new_ports": list(self.new_ports),
                "closed_since": list(self.closed_since), "findings": [f.to_dict() for f in self.findings]}


@dataclass(frozen=True)
class AuditReport:
    baseline: str
    signed_by: str                  # evidence pack signer, "" for a plain directory
    release: str                    # vLLM version of the baseline inventory
    config_hash: str                # the baseline plan's digest, "sha256:..."
    plan_matches: bool              # the baseline's plan.json still matches inventory + policy
    target: str
    surface_url: str                # where the route surface was swept
    surface_note: str
    started_at: float               # unix time
    routes: tuple[RouteDrift, ...]
    config: tuple[DirectiveChange, ...] | None   # None: no --nginx-config given or no baseline config
    config_note: str
    probe: ProbeResult
    probe_drift: ProbeDrift
    ports: PortDrift | None
    surface_error: str = ""         # the route sweep could not run: the audit is incomplete (exit 3)

    @property
    def unreachable(self) -> bool:
        return self.probe.unreachable or bool(self.surface_error)

    @property
    def reason(self) -> str:
        return "; ".join(r for r in (self.probe.reason, self.surface_error and
                                     f"route sweep at {self.surface_url}: {self.surface_error}") if r)

    @property
    def config_hash_short(self) -> str:
        return self.config_hash.removeprefix("sha256:")[:8]

    @property
    def drift(self) -> bool:
        return bool(self.routes or self.config or not self.probe_drift.empty or not self.plan_matches
                    or (self.ports is not None and self.ports.new_ports))

    def severity_counts(self) -> dict[Severity, int]:
        counts = self.probe.counts()
        for f in self.ports.findings if self.ports else ():
            counts[f.severity] = counts.get(f.severity, 0) + 1
        return counts

    def exit_code(self, fail_on: Severity = FAIL_ON_DEFAULT) -> int:
        """3 unreachable; 1 drift, or a deviation (a probe or port finding, not "not proven")
        at or above ``fail_on``; else 0."""
        if self.unreachable:
            return EXIT_UNREACHABLE
        found = [(f.rule, f.severity) for f in self.probe.findings]
        found += [("port", f.severity) for f in (self.ports.findings if self.ports else ())]
        return EXIT_FINDINGS if self.drift or fails(found, fail_on) else EXIT_OK

    def summary(self) -> dict[str, Any]:
        return {
            "drift": self.drift,
            "routes_added": sum(1 for r in self.routes if r.change == "added"),
            "routes_removed": sum(1 for r in self.routes if r.change == "removed"),
            "config_changes": len(self.config) if self.config is not None else None,
            "findings_new": len(self.probe_drift.new_findings),
            "findings_resolved": len(self.probe_drift.resolved_findings),
            "outcome_changes": len(self.probe_drift.outcome_changes),
            "ports_new": len(self.ports.new_ports) if self.ports else None,
            "findings": self.severity_counts(),
        }

    def document(self) -> AuditReportDocument:
        return AuditReportDocument(
            schema_version=AUDIT_SCHEMA_VERSION, tool="vllm-perimeter audit",
            baseline=self.baseline, signed_by=self.signed_by, release=self.release,
            config_hash=self.config_hash, plan_matches=self.plan_matches,
            target=self.target, surface_url=self.surface_url, surface_note=self.surface_note,
            surface_error=self.surface_error,
            started_at=self.started_at, summary=self.summary(),
            routes=tuple(r.to_dict() for r in self.routes),
            config=tuple(c.to_dict() for c in self.config) if self.config is not None else None,
            config_note=self.config_note,
            probe_drift=self.probe_drift.to_dict(),
            ports=self.ports.to_dict() if self.ports else None,
            probe=probe_result.document(self.probe))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self.document())
        return out


@dataclass(frozen=True)
class AuditReportDocument:
    """Drift of a live deployment against a baseline (``audit --format json``): an
    :class:`AuditReport` as its document shows it (the drift records as their own to_dict
    writes them, the probe result as its document)."""

    __pydantic_config__: ClassVar = CONFIG
    schema_version: Version1
    tool: Literal["vllm-perimeter audit"]
    baseline: Str
    signed_by: Str
    release: Str
    config_hash: Str
    plan_matches: Flag
    target: Str
    surface_url: Str
    surface_note: Str
    surface_error: Str
    started_at: Num
    summary: Mapping[Str, Any]
    routes: tuple[Mapping[Str, Any], ...]
    config: tuple[Mapping[Str, Any], ...] | None
    config_note: Str
    probe_drift: Mapping[Str, Any]
    ports: Mapping[Str, Any] | None
    probe: probe_result.ProbeResultDocument
