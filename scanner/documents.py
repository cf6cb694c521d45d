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
from scanner.policy.model import BodyPolicy, Policy, PrincipalsFile
from scanner.probe.interface import Attempt, Coverage, Finding
from scanner.rules import RuleProgram

Severity = Literal["critical", "high", "medium", "low", "info"]
Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class _Doc(BaseModel):
    # strict: a "yes" is not a boolean, a 29 not a string (JSON documents, read as parsed)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- policy (YAML) and principals: scanner.policy.model.Policy and PrincipalsFile ---------------


# --- plan --------------------------------------------------------------------------------------


class PlanRateDoc(_Doc):
    rps: float
    burst: int


class PlanLimitsDoc(_Doc):
    body_bytes: int | None
    json_caps: dict[str, int]
    cap_paths: dict[str, int] | None = Field(default=None, description="every position a json cap applies "
                                             "at (a dotted path: nested in the request model), where the "
                                             "model has one nested (Decision.cap_paths)")
    rate: PlanRateDoc | None
    concurrency: int | None
    timeout_s: float | None
    tokens_per_minute: int | None = None
    tokens_burst: int | None = Field(
        default=None, description="the token budget's capacity the plan decided (tokens_burst, default "
        "ceil(tokens_per_minute / 4); at least the policy's own max_request_tokens when that is within "
        "tokens_per_minute): at most tokens_burst + tokens_per_minute x t / 60 in any t seconds")
    max_sequences: int | None = None
    max_request_tokens: int | None = None
    max_request_tokens_by: Literal["tokens_burst"] | None = Field(
        default=None, description="tokens_burst: the token budget's capacity set max_request_tokens (a "
        "request whose envelope is over the bucket's capacity can never be admitted: refused 400 "
        "envelope-tokens)")


class EnvelopeDoc(_Doc):
    """The fields multiplying a route's work (scanner/plan/envelope.py)."""

    items: list[list[str]] = Field(description="[field, prompts | each]: items summed")
    pairs: list[list[str]] = Field(description="[side 1, side 2] of pair scoring")
    per_item: list[str]
    ask_usage: bool = Field(default=False, description="the model takes stream_options: a settled stream "
                                                       "asks for its usage (scanner/plan/settle.py)")


class BudgetDoc(_Doc):
    fields: list[str]
    field: str
    cap: int
    when_absent: Literal["inject", "reject", "pass"]


class DecisionFieldsDoc(_Doc):
    allow: list[str]
    reject: list[str]
    strip: list[str]
    unknown: Literal["reject", "strip", "pass"]
    counts: dict[str, int] = Field(default={}, description="most items per field (list, object keys)")
    pins: dict[str, int | float | str | bool | None] = Field(default={},
                                                              description="values every body leaves with")
    values: dict[str, list[int | float | str | bool | None]] = Field(
        default={}, description="the values a field may hold when present and not null")
    salt: Literal["principal", "audience"] | None = Field(
        default=None, description="every JSON body leaves with the perimeter's cache_salt of the "
        "principal (or audience), the client's replaced")


class DecisionMediaDoc(_Doc):
    urls: Literal["deny", "allow", "pass"]
    domains: list[str]
    data_max_bytes: int | None
    max_items: int | None
    embeds: Literal["deny", "allow"]
    at: list[str] = Field(description="where the route's request model can carry media (inventory paths)")


class DecisionOwnerDoc(_Doc):
    param: str = Field(description="the path parameter naming a stored response: its seal checked, removed")
    fields: list[str] = Field(description="top-level body fields naming a stored response: the same")
    seal: bool = Field(description="response ids in the route's answers are sealed to the principal")


class DecisionDoc(_Doc):
    method: str
    path: str
    kind: Literal["http", "websocket", "mount"]
    action: Literal["allow", "deny"]
    reason: str
    audience: str
    audience_kind: Literal["end-user", "service", "operator", "monitoring", "none"]
    auth: Literal["key", "none", "jwt", "cert"]
    roles: list[str]
    networks: list[str]
    jwt: dict[str, Any] | None = Field(default=None, description="auth jwt: the token rules and the "
                                       "JWKS keys' kid, type and algorithms")
    limits: PlanLimitsDoc
    envelope: EnvelopeDoc | None = Field(default=None, description="the fields multiplying its work, "
                                         "where it caps or charges them")
    budget: BudgetDoc | None
    fields: DecisionFieldsDoc
    media: DecisionMediaDoc | None = Field(default=None, description="the media rules enforced on this route")
    owner: DecisionOwnerDoc | None = Field(default=None, description="ownership of stored responses "
                                           "(body: responses: owned)")
    state_changing: bool
    state_changing_by: str
    upstream_guarded: bool
    rule_line: int


class PlanDoc(_Doc):
    """One decision per method and path (``plan --format json``)."""

    schema_version: Literal[1]
    policy: dict[str, str]
    inventory_hash: str
    vllm_version: str
    listen: dict[str, Any]
    upstream: dict[str, Any]
    body: BodyPolicy
    trusted_proxies: list[str]
    networks: dict[str, list[str]]
    principals: list[dict[str, str]]
    cert_principals: list[dict[str, str]] = Field(default=[], description="auth cert: principals by a "
                                                  "client certificate's URI SAN or subject")
    decisions: list[DecisionDoc]
    uncovered: list[str]
    unused_rules: list[str]
    unnamed_fields: list[str] = []
    responses_shared: list[str] = Field(default=[], description="end users' routes taking a stored "
                                        "response's id while stored responses are shared (body: "
                                        "responses: shared)")
    grpc: dict[str, Any] | None = Field(default=None, description="the gRPC listener's decisions")
    shared: dict[str, Any] | None = Field(default=None,
                                          description="the fleet's shared limits (zones, local shares)")
    digest: str


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
    "plan": PlanDoc,
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
