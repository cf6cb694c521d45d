"""Netscan records: one attempt per port, findings, and the result of a sweep.

The finding vocabulary is the project's (``scanner/severity.py``): severities and their
ranking, a stable ``id``, a ``rule``, ``title``/``detail``/``remediation`` and evidence.
A netscan finding is about a TCP port rather than a method and path, so it is its own
frozen record (``port`` instead of ``method``/``path``; attempts as evidence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from scanner.errors import EXIT_FINDINGS, EXIT_OK
from scanner.severity import SEVERITIES, Severity, severity_rank

__all__ = ["SEVERITIES", "PortAttempt", "PortFinding", "ScanResult", "ScanVantage", "Severity",
           "severity_rank"]

FAIL_ON_CHOICES: tuple[str, ...] = (*SEVERITIES, "none")
PortState = Literal["open", "closed", "filtered"]
Method = Literal["syn", "connect"]
NETSCAN_SCHEMA_VERSION = 1
# Reasons that mean "no path to the host" rather than "the port did not answer".
UNREACHABLE_REASONS: tuple[str, ...] = ("host-unreachable", "net-unreachable", "no-route")


@dataclass(frozen=True)
class PortAttempt:
    """One port probe: what state the answer shows, how it was sent, and how long it took."""

    port: int
    state: PortState
    method: Method
    reason: str = ""          # syn-ack, rst, timeout, refused, icmp-..., host-unreachable, ...
    latency_ms: float = 0.0
    service: str = ""         # with --identify: what answered the HTTP/2 preface (h2c, http/1.1)

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.port, "state": self.state, "method": self.method,
                "reason": self.reason, "latency_ms": round(self.latency_ms, 3), "service": self.service}


@dataclass(frozen=True)
class PortFinding:
    id: str                   # stable: rule + host + port + vantage
    rule: str                 # NS001
    severity: Severity
    title: str
    port: int
    vantage: str
    detail: str
    remediation: str
    evidence: tuple[PortAttempt, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "rule": self.rule, "severity": self.severity, "title": self.title,
                "port": self.port, "vantage": self.vantage, "detail": self.detail,
                "remediation": self.remediation, "evidence": [a.to_dict() for a in self.evidence]}


@dataclass(frozen=True)
class ScanVantage:
    """Where the probes come from: local address, interface, and the policy networks it is in."""

    address: str
    interface: str = ""
    networks: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.address}" + (f"%{self.interface}" if self.interface else "")


@dataclass(frozen=True)
class ScanResult:
    host: str
    address: str              # the resolved address probed
    vantage: ScanVantage
    method: Method
    method_note: str          # why this method (e.g. the connect() fallback and its reason)
    attempts: tuple[PortAttempt, ...]
    findings: tuple[PortFinding, ...]
    policy: str
    elapsed_s: float
    started_at: str           # ISO 8601 UTC

    def open_ports(self) -> tuple[int, ...]:
        return tuple(a.port for a in self.attempts if a.state == "open")

    def exit_code(self, fail_on: str = "high") -> int:
        """1 when a finding is at least as severe as ``fail_on`` ("none": never), else 0."""
        if fail_on not in SEVERITIES or not self.findings:
            return EXIT_OK
        worst = min(severity_rank(f.severity) for f in self.findings)
        return EXIT_FINDINGS if worst <= severity_rank(fail_on) else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": NETSCAN_SCHEMA_VERSION,
            "host": self.host, "address": self.address,
            "vantage": {"address": self.vantage.address, "interface": self.vantage.interface,
                        "networks": list(self.vantage.networks)},
            "method": self.method, "method_note": self.method_note, "policy": self.policy,
            "started_at": self.started_at, "elapsed_s": round(self.elapsed_s, 3),
            "summary": {s: sum(1 for a in self.attempts if a.state == s)
                        for s in ("open", "closed", "filtered")},
            "attempts": [a.to_dict() for a in self.attempts],
            "findings": [f.to_dict() for f in self.findings],
        }
