"""Every document a user writes or a CI system reads, as pydantic models: the one place their
shape is stated. The JSON Schemas under ``schemas/`` are generated from these
(``vllm-perimeter schema NAME``; ``tests/test_documents.py`` keeps them current), every document
the tool writes is validated against its model in the tests, and documents the tool reads back
(inventories, probe results) are validated through them, with the file and field in the error.

The policy and principals files are the policy's own models (:mod:`scanner.policy.model`,
read by :mod:`scanner.policy.load`, which keeps each error's line number); their schemas, for
editors and CI linters, are generated from those models as users write them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scanner import jsondoc
from scanner.errors import ConfigError
from scanner.inventory.model import Inventory
from scanner.netscan.model import PortAttempt, PortFinding
from scanner.plan.document import PlanView
from scanner.policy.model import Policy, PrincipalsFile
from scanner.probe.interface import Attempt, Coverage, Finding
from scanner.rules import RuleProgram

Severity = Literal["critical", "high", "medium", "low", "info"]
Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class _Doc(BaseModel):
    # strict: a "yes" is not a boolean, a 29 not a string (JSON documents, read as parsed)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- policy (YAML) and principals: scanner.policy.model.Policy and PrincipalsFile ---------------


# --- probe result ------------------------------------------------------------------------------


class CredentialDoc(_Doc):
    label: str
    fingerprint: str


class ProbeSummaryDoc(_Doc):
    attempts: int
    findings: dict[Severity, int]
    coverage: dict[str, dict[str, int]] = {}


class ProbeResultDoc(_Doc):
    """A probe run (``probe --format json``): findings, coverage per check, every attempt.
    Its records are the prober's own (scanner.probe.interface), read back as written."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)
    schema_version: Literal[1]
    tool: Literal["vllm-perimeter probe"] = "vllm-perimeter probe"
    target: str
    plan_digest: str
    policy: str
    vantages: list[str]
    credentials: list[CredentialDoc]
    elapsed_s: float
    unreachable: bool
    reason: str = ""
    summary: ProbeSummaryDoc | None = None
    findings: list[Finding]
    coverage: list[Coverage] = []
    attempts: list[Attempt]


# --- netscan, audit, evidence -------------------------------------------------------------------


class NetscanResultDoc(_Doc):
    """Which TCP ports answer from a vantage (``netscan --format json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)
    schema_version: Literal[1]
    host: str
    address: str
    vantage: dict[str, Any]
    method: Literal["syn", "connect"]
    method_note: str
    policy: str | None
    started_at: str = Field(description="ISO 8601, UTC")
    elapsed_s: float
    summary: dict[str, int]
    attempts: list[PortAttempt]
    findings: list[PortFinding]


class AuditResultDoc(_Doc):
    """Drift of a live deployment against a baseline (``audit --format json``)."""

    schema_version: Literal[1]
    tool: Literal["vllm-perimeter audit"]
    baseline: str
    signed_by: str
    release: str
    config_hash: str
    plan_matches: bool
    target: str
    surface_url: str
    surface_note: str
    surface_error: str
    started_at: float
    summary: dict[str, Any]
    routes: list[dict[str, Any]]
    config: list[dict[str, Any]] | None
    config_note: str
    probe_drift: dict[str, Any]
    ports: dict[str, Any] | None
    probe: ProbeResultDoc


class ManifestFileDoc(_Doc):
    path: str
    role: Literal["inventory", "policy", "principals", "plan", "config", "probe", "netscan"]
    bytes: int
    sha256: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class EvidenceManifestDoc(_Doc):
    """The manifest of a signed evidence pack (``evidence build``)."""

    kind: Literal["vllm-perimeter-evidence"]
    schema_version: Literal[1]
    tool: dict[str, str]
    vllm_version: str | None
    created: str
    public_key_fingerprint: str
    files: list[ManifestFileDoc]


# a pydantic model or dataclass per document
DOCUMENTS: dict[str, type[Any]] = {
    "policy": Policy,
    "principals": PrincipalsFile,
    "inventory": Inventory,
    "plan": PlanView,
    "probe-result": ProbeResultDoc,
    "netscan-result": NetscanResultDoc,
    "audit-result": AuditResultDoc,
    "evidence-manifest": EvidenceManifestDoc,
    "rule-program": RuleProgram,
}


def json_schema(name: str) -> dict[str, Any]:
    schema = jsondoc.adapter(DOCUMENTS[name]).json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://vllm-perimeter.invalid/schemas/{name}.schema.json"
    return schema


def validate(name: str, data: Any, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """``data`` validated as document ``name``; ``error`` naming ``source`` and the field."""
    return jsondoc.read(DOCUMENTS[name], data, source, name, error)
