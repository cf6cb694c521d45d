"""The probe result as a JSON document, and merging results from several vantages/hosts.

:class:`ProbeResultDocument` is the document's model (``schemas/probe-result.schema.json`` is
generated from it): :func:`to_dict` builds it from a :class:`ProbeResult` and writes it,
:func:`from_dict` reads one back through it. Its records are the prober's own
(scanner.probe.interface: Finding, Coverage, Attempt), read back as written."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, ClassVar, Literal

from scanner import jsondoc
from scanner.errors import ConfigError
from scanner.jsondoc import CONFIG, Flag, Int, Num, Str, Version1
from scanner.output import read_json
from scanner.probe.interface import PROBE_SCHEMA_VERSION, Attempt, Coverage, Finding, ProbeResult
from scanner.severity import Severity, severity_rank


@dataclass(frozen=True)
class Credential:
    """A credential the run used: its label and the fingerprint of its key (never the key)."""

    __pydantic_config__: ClassVar = CONFIG
    label: Str
    fingerprint: Str


@dataclass(frozen=True)
class Summary:
    """The run in numbers: attempts, findings per severity, subjects per check and status."""

    __pydantic_config__: ClassVar = CONFIG
    attempts: Int
    findings: Mapping[Severity, Int]   # every severity, 0 included (ProbeResult.counts)
    coverage: Mapping[Str, Mapping[Str, Int]] = dataclass_field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ProbeResultDocument:
    """A probe run (``probe --format json``): findings, coverage per check, every attempt.
    Its records are the prober's own (scanner.probe.interface), read back as written."""

    __pydantic_config__: ClassVar = CONFIG
    schema_version: Version1
    tool: Literal["vllm-perimeter probe"] = "vllm-perimeter probe"
    target: Str
    plan_digest: Str
    policy: Str
    vantages: tuple[Str, ...]
    credentials: tuple[Credential, ...]
    elapsed_s: Num
    unreachable: Flag
    reason: Str = ""
    summary: Summary | None = None
    findings: tuple[Finding, ...]
    coverage: tuple[Coverage, ...] = ()
    attempts: tuple[Attempt, ...]

    def result(self) -> ProbeResult:
        return ProbeResult(
            target=self.target, plan_digest=self.plan_digest, policy=self.policy, vantages=self.vantages,
            credentials=tuple((c.label, c.fingerprint) for c in self.credentials), attempts=self.attempts,
            findings=self.findings, elapsed_s=self.elapsed_s, unreachable=self.unreachable,
            reason=self.reason, coverage=self.coverage)


def document(r: ProbeResult) -> ProbeResultDocument:
    return ProbeResultDocument(
        schema_version=PROBE_SCHEMA_VERSION, target=r.target, plan_digest=r.plan_digest, policy=r.policy,
        vantages=r.vantages, credentials=tuple(Credential(label, fp) for label, fp in r.credentials),
        elapsed_s=r.elapsed_s, unreachable=r.unreachable, reason=r.reason,
        summary=Summary(attempts=len(r.attempts), findings=r.counts(), coverage=r.coverage_counts()),
        findings=r.findings, coverage=r.coverage, attempts=r.attempts)


def to_dict(r: ProbeResult) -> dict[str, Any]:
    out: dict[str, Any] = jsondoc.dump(document(r))
    return out


def to_json(r: ProbeResult) -> str:
    return json.dumps(to_dict(r), indent=2, sort_keys=False) + "\n"


def from_dict(d: dict[str, Any], name: str = "<result>") -> ProbeResult:
    """A probe result read through :class:`ProbeResultDocument`."""
    if not isinstance(d, dict) or d.get("schema_version") != PROBE_SCHEMA_VERSION:
        found = d.get("schema_version") if isinstance(d, dict) else None
        raise ConfigError(f"{name}: not a probe result (schema_version {found!r})")
    return jsondoc.read(ProbeResultDocument, d, name, "probe-result").result()


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
