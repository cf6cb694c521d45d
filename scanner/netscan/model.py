"""Netscan records: one attempt per port, findings, and the result of a sweep.

The finding vocabulary is the project's (``scanner/severity.py``): severities and their
ranking, a stable ``id``, a ``rule``, ``title``/``detail``/``remediation`` and evidence.
A netscan finding is about a TCP port rather than a method and path, so it is its own
frozen record (``port`` instead of ``method``/``path``; attempts as evidence).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import Field, PlainSerializer

from scanner import jsondoc
from scanner.errors import EXIT_FINDINGS, EXIT_OK
from scanner.jsondoc import CONFIG, Int, Num, Str, Version1
from scanner.severity import SEVERITIES, Severity, severity_rank

__all__ = ["SEVERITIES", "PortAttempt", "PortFinding", "ScanResult", "ScanVantage", "Severity",
           "severity_rank"]

FAIL_ON_CHOICES: tuple[str, ...] = (*SEVERITIES, "none")
PortState = Literal["open", "closed", "filtered"]
Method = Literal["syn", "connect"]
NETSCAN_SCHEMA_VERSION: Final = 1
# Reasons that mean "no path to the host" rather than "the port did not answer".
UNREACHABLE_REASONS: tuple[str, ...] = ("host-unreachable", "net-unreachable", "no-route")
# a duration in a document: to the microsecond of its unit
Rounded = Annotated[Num, PlainSerializer(lambda v: round(v, 3))]


@dataclass(frozen=True)
class PortAttempt:
    """One port probe: what state the answer shows, how it was sent, and how long it took."""

    __pydantic_config__: ClassVar = CONFIG
    port: Int
    state: PortState
    method: Method
    reason: Str = ""          # syn-ack, rst, timeout, refused, icmp-..., host-unreachable, ...
    latency_ms: Rounded = 0.0
    service: Str = ""         # with --identify: what answered the HTTP/2 preface (h2c, http/1.1)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True)
class PortFinding:
    __pydantic_config__: ClassVar = CONFIG
    id: Str                   # stable: rule + host + port + vantage
    rule: Str                 # NS001
    severity: Severity
    title: Str
    port: Int
    vantage: Str
    detail: Str
    remediation: Str
    evidence: tuple[PortAttempt, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True)
class ScanVantage:
    """Where the probes come from: local address, interface, and the policy networks it is in."""

    __pydantic_config__: ClassVar = CONFIG
    address: Str
    interface: Str = ""
    networks: tuple[Str, ...] = ()

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

    def document(self) -> ScanResultDocument:
        return ScanResultDocument(
            schema_version=NETSCAN_SCHEMA_VERSION, host=self.host, address=self.address, vantage=self.vantage,
            method=self.method, method_note=self.method_note, policy=self.policy, started_at=self.started_at,
            elapsed_s=self.elapsed_s, attempts=self.attempts, findings=self.findings,
            summary={s: sum(1 for a in self.attempts if a.state == s)
                     for s in ("open", "closed", "filtered")})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self.document())
        return out


@dataclass(frozen=True)
class ScanResultDocument:
    """Which TCP ports answer from a vantage (``netscan --format json``): a :class:`ScanResult`
    as its document shows it (with the schema version and the states counted)."""

    __pydantic_config__: ClassVar = CONFIG
    schema_version: Version1
    host: Str
    address: Str
    vantage: ScanVantage
    method: Method
    method_note: Str
    policy: Str | None
    started_at: Annotated[Str, Field(description="ISO 8601, UTC")]
    elapsed_s: Rounded
    summary: Mapping[Str, Int]
    attempts: tuple[PortAttempt, ...]
    findings: tuple[PortFinding, ...]
