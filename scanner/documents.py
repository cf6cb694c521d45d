"""Every document a user writes or a CI system reads, as pydantic models: the one place their
shape is stated. The JSON Schemas under ``schemas/`` are generated from these
(``vllm-perimeter schema NAME``; ``tests/test_documents.py`` keeps them current), every document
the tool writes is validated against its model in the tests, and documents the tool reads back
(inventories, probe results) are validated through them, with the file and field in the error.

The policy YAML is validated by :mod:`scanner.policy.load`, which keeps each error's line
number; its schema here is for editors and CI linters, and the tests check that both accept the
same bundled policies and principals files.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scanner.errors import ConfigError
from scanner.netscan.model import PortAttempt, PortFinding
from scanner.probe.interface import Attempt, Coverage, Finding
from scanner.rules import RuleProgram

Severity = Literal["critical", "high", "medium", "low", "info"]
Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class _Doc(BaseModel):
    # strict: a "yes" is not a boolean, a 29 not a string (JSON documents, read as parsed)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- policy (YAML) and principals --------------------------------------------------------------


class RateDoc(_Doc):
    rps: float = Field(gt=0)
    burst: int = Field(default=0, ge=0)


class LimitsDoc(_Doc):
    body_bytes: int | None = Field(default=None, ge=1)
    json_caps: dict[Literal["max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of",
                            "logprobs", "top_logprobs", "prompt_logprobs"], int] = {}
    rate: RateDoc | None = None
    concurrency: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    when_absent: Literal["inject", "reject", "pass"] | None = Field(
        default=None, description="when a request omits the field its route reads its output budget from "
        "(max_tokens, max_completion_tokens, max_output_tokens): write the cap in (default), refuse, or pass")
    tokens_per_minute: int | None = Field(
        default=None, ge=1, description="token budget per principal (per client address on auth: none) and "
        "minute, charged at admission: the request's admitted envelope (sequences x output budget per "
        "sequence, as sent or the cap written in, plus its body bytes); over it: 429 token-budget with "
        "Retry-After")
    tokens_burst: int | None = Field(
        default=None, ge=1, le=2147483647, description="the most of tokens_per_minute one principal may "
        "spend at once (the budget's bucket capacity, refilled at tokens_per_minute / 60 a second; at most "
        "tokens_per_minute): any 60 s window admits at most tokens_burst + tokens_per_minute; default "
        "ceil(tokens_per_minute / 4) (1.25 x the minute). A request costing more than the capacity is "
        "refused 400 envelope-tokens")
    max_sequences: int | None = Field(
        default=None, ge=1, le=2147483647, description="the most sequences one request may run (its "
        "prompts, conversations, inputs or pairs x n / best_of); over it: 400 envelope-sequences")
    max_request_tokens: int | None = Field(
        default=None, ge=1, le=2147483647, description="the most tokens one request may ask for "
        "(sequences x output budget per sequence + body bytes); over it: 400 envelope-tokens")


_FIELD = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class FieldsDoc(_Doc):
    """Top-level request-body fields: each named once; the rest by ``unknown``."""

    unknown: Literal["reject", "strip", "pass"] = Field(
        default="reject", description="fields not named here (default reject: new fields stay closed)")
    allow: list[Annotated[str, _FIELD]] = []
    deny: list[Annotated[str, _FIELD]] = Field(default=[], description="refused: 400 forbidden-field:NAME")
    strip: list[Annotated[str, _FIELD]] = Field(default=[], description="removed before vLLM sees the body")
    counts: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default={}, description="the most items a field may hold (a list's length, an object's keys; a "
        "string is one): 400 json-cap:NAME:count-over-N")
    pin: dict[str, int | float | str | bool | None] = Field(
        default={}, description="the value a field leaves with, the client's replaced (strings: letters, "
        "digits, _.:/-)")
    values: dict[str, list[int | float | str | bool | None]] = Field(
        default={}, description="the values a field may hold when present and not null (JSON equality: 1 "
        "is not \"1\"): 400 json-cap:NAME:not-listed")


class MediaDoc(_Doc):
    """Media URLs, data and embeddings in request bodies (scanner/policy/media.py)."""

    urls: Literal["deny", "allow", "pass"] = Field(
        default="deny",
        description="URLs other than data: (deny: refused; allow: http(s), to domains if listed)")
    domains: list[Annotated[str, Field(pattern=r"^(\*\.)?[a-z0-9-]+(\.[a-z0-9-]+)*(:[0-9]{1,5})?$")]] = Field(
        default=[], description="with urls: allow, the hosts (host, host:port, *.suffix) media may come from")
    data_max_bytes: int | None = Field(default=None, ge=1, description="longest data: URL or base64 item")
    max_items: int = Field(default=8, ge=0, description="media items per request")
    embeds: Literal["deny", "allow"] = Field(default="deny", description="image/audio/video embeddings")


class JwtDoc(_Doc):
    """Bearer tokens of an ``auth: jwt`` audience (docs/identity.md)."""

    issuers: list[str] = Field(min_length=1)
    audiences: list[str] = Field(min_length=1)
    jwks_file: str = Field(min_length=1, description="JWKS JSON (public keys with kid), relative to the "
                           "policy's directory; read at generate time (rotate: replace, generate, reload)")
    remote_jwks: str | None = Field(default=None, pattern=r"^https://",
                                    description="Envoy only: fetch the JWKS from this URL")
    algorithms: list[Literal["RS256", "PS256", "ES256", "EdDSA"]] = Field(
        default=["RS256", "PS256", "ES256"], min_length=1, description="never none, never HS*")
    clock_skew_s: int = Field(default=60, ge=0)
    required_claims: dict[str, str | list[str]] = {}
    principal_claim: str = "sub"
    role_claim: str | None = None
    roles: dict[str, str] = Field(default={}, description="role_claim value -> role")
    role: str | None = Field(default=None, description="a fixed role (without role_claim)")
    max_token_bytes: int = Field(default=8192, ge=256, le=16384)


class AudienceDoc(_Doc):
    kind: Literal["end-user", "service", "operator", "monitoring", "none"]
    networks: list[str] = []
    roles: list[str] = []
    auth: Literal["key", "none", "jwt", "cert"] | None = None
    jwt: JwtDoc | None = None
    limits: LimitsDoc | None = None
    fields: FieldsDoc | None = None
    media: MediaDoc | None = Field(default=None, description="default for end-user audiences: data: URLs "
                                   "only, at most 8 items, no embeddings; others: not checked")


class PrincipalDoc(_Doc):
    name: str = Field(min_length=1)
    role: str = Field(min_length=1)
    key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$",
                                   description="sha256 hex of the key, never the key")
    san: str | None = Field(default=None, description="auth cert: the client certificate's URI SAN "
                            "(spiffe://example.org/ns/app/sa/worker)")
    subject: str | None = Field(default=None, description="auth cert: the client certificate's subject DN "
                                "(RFC 2253: CN=worker,O=Example)")


class RouteRuleDoc(_Doc):
    path: str = Field(pattern=r"^/")
    audience: str
    methods: list[str] = []
    limits: LimitsDoc | None = None
    state_changing: bool = False
    note: str | None = None


class TlsServerDoc(_Doc):
    cert: str
    key: str
    client_ca: str | None = Field(default=None, description="mTLS: the CA bundle client certificates are "
                                  "verified against (auth: cert audiences require one)")
    verify_depth: int = Field(default=2, ge=1, le=8)


class TlsUpstreamDoc(_Doc):
    ca: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None


class ListenDoc(_Doc):
    address: str = "0.0.0.0"
    port: int = Field(default=8080, ge=1, le=65535)
    tls: TlsServerDoc | None = None


class HealthDoc(_Doc):
    max_fails: int = Field(default=1, ge=1, description="failed connections before a replica is skipped")
    eject_s: int = Field(default=10, ge=1, description="seconds a failed replica is skipped")


class PolicyUpstreamDoc(_Doc):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    servers: list[str] | None = Field(
        default=None, min_length=1,
        description="replicas as host:port ([addr]:port for IPv6), instead of host and port")
    balance: Literal["least_conn", "round_robin"] = "least_conn"
    health: HealthDoc | None = None
    tls: TlsUpstreamDoc | None = None
    api_key_file: str | None = Field(
        default=None, pattern=r"^/",
        description="file holding vLLM's --api-key (absolute path, mode 0600): the proxy presents it "
        "upstream on every allowed request; the key never appears in a generated config")


class BodyDoc(_Doc):
    cache_salt: Literal["pass", "reject", "strip", "per-principal", "per-audience"] = Field(
        default="reject",
        description="per-principal / per-audience: the perimeter writes cache_salt = HMAC-SHA256(secret, "
        "the principal or audience) over any client's, so prefix-cache hits stay within a tenant")
    chat_template: Literal["pass", "reject", "strip"] = "reject"
    cache_salt_secret_file: str | None = Field(
        default=None, pattern=r"^/",
        description="with per-principal / per-audience: the file (absolute path, mode 0600) holding the "
        "HMAC secret; read when the config is generated, never written into it")
    responses: Literal["shared", "owned"] = Field(
        default="shared",
        description="owned: every stored response id the perimeter hands out is sealed to its principal "
        "(id~HMAC); GET / cancel / previous_response_id with another principal's id: 403 not-owner")
    responses_secret_file: str | None = Field(
        default=None, pattern=r"^/",
        description="with responses: owned: the file (absolute path, mode 0600) holding the HMAC secret; "
        "read by the proxy at run time, never written into a generated config")


class PortRuleDoc(_Doc):
    port: int = Field(ge=1, le=65535)
    networks: list[str] = Field(min_length=1)
    note: str | None = None


class PortsDoc(_Doc):
    allow: list[PortRuleDoc]


class GrpcMethodDoc(_Doc):
    method: str = Field(pattern=r"^/[A-Za-z_][A-Za-z0-9_.]*/([A-Za-z_][A-Za-z0-9_]*|\*)$",
                        description="/package.Service/Method, or /package.Service/* for all of its methods")
    audience: str
    note: str | None = None


class GrpcUpstreamDoc(_Doc):
    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=1, le=65535)


class GrpcDoc(_Doc):
    """The gRPC listener: default deny per method of ``inventory`` (a bundled gRPC catalog or a file
    ``inventory grpc`` wrote)."""

    inventory: str
    listen: ListenDoc | None = None
    upstream: GrpcUpstreamDoc | None = None
    methods: list[GrpcMethodDoc]


class SharedTlsDoc(_Doc):
    ca: str = Field(description="absolute path of the CA bundle that signs Redis's certificate")


class SharedDoc(_Doc):
    """The fleet's shared limits: every rate, concurrency and token budget taken from one limiter
    (``vllm-perimeter limiter``) on one Redis."""

    redis: str = Field(description="redis://HOST[:PORT][/DB], redis+sentinel://HOST:PORT[,...]/MASTER[/DB] "
                       "or redis+cluster://HOST:PORT[,...] (rediss...: TLS); no password")
    limiter: str = Field(default="127.0.0.1:8081", description="HOST:PORT the proxies reach the limiter at")
    password_file: str | None = Field(default=None, description="absolute path of the Redis password")
    tls: SharedTlsDoc | None = None
    on_unavailable: Literal["deny", "local"] = Field(
        default="deny", description="store unreachable: 503 shared-store-unavailable, or each proxy's "
        "share of every limit (the policy's values divided by replicas)")
    replicas: int = Field(default=2, ge=1, le=1000, description="proxies in the fleet")


class PolicyDoc(_Doc):
    """A policy (``policies/vllm-default.yaml``)."""

    schema_version: Literal[1]
    name: str = Field(min_length=1)
    networks: dict[str, list[str]] = {}
    audiences: dict[str, AudienceDoc]
    principals: list[PrincipalDoc] = []
    principals_file: str | None = None
    routes: list[RouteRuleDoc]
    body: BodyDoc | None = None
    listen: ListenDoc | None = None
    upstream: PolicyUpstreamDoc | None = None
    trusted_proxies: list[str] = []
    ports: PortsDoc | None = None
    grpc: GrpcDoc | None = Field(default=None,
                                 description="vLLM's gRPC server behind Envoy's HTTP/2 listener")
    shared: SharedDoc | None = Field(default=None,
                                     description="a fleet of proxies sharing every limit through Redis")


class PrincipalsDoc(_Doc):
    """A principals file (``keys new --file``): key hashes only, mode 0600."""

    principals: list[PrincipalDoc] = []


# --- inventory ---------------------------------------------------------------------------------


class SourceDoc(_Doc):
    kind: Literal["vllm", "asgi", "openapi", "sweep", "live"]
    target: str = ""


class VllmFactsDoc(_Doc):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, protected_namespaces=(),
                              populate_by_name=True)
    version: str
    serve_args: list[str] = []
    env: dict[str, str] = {}
    tasks: list[str] = []
    model_config_: str = Field(default="none", alias="model_config")
    plugins: list[str] = []
    guarded_prefixes: list[str] = ["/v1", "/v2", "/inference", "/cohere"]
    root_path: str = ""
    api_key_configured: bool = False


_JSON_TYPE = Annotated[str, Field(description="a JSON Schema type, or 'any' (unconstrained)")]


class NestedFieldDoc(_Doc):
    """A position under a top-level field: ``[]`` each array item, ``.name`` a property,
    ``.*`` any value of a map (``messages[].content[].image_url.url``)."""

    path: str = Field(min_length=1)
    types: list[_JSON_TYPE] = Field(min_length=1)
    required: bool = Field(default=False, description="required in the enclosing object")
    default: Any = Field(default=None, description="present only when the schema states a default")
    enum: list[Any] = Field(default=[], description="the allowed constants, when every non-null "
                                                    "alternative is one")
    truncated: Literal["", "depth", "recursion"] = Field(
        default="", description="children not listed: depth bound reached, or a recursive $ref")


class RequestFieldDoc(_Doc):
    """A top-level field of a request body."""

    name: str = Field(min_length=1)
    types: list[_JSON_TYPE] = Field(min_length=1)
    required: bool = False
    default: Any = Field(default=None, description="present only when the schema states a default")
    enum: list[Any] = []
    truncated: Literal["", "depth", "recursion"] = ""
    nested: list[NestedFieldDoc] = []


class RequestBodyDoc(_Doc):
    """What the app validates a route's request body against, and how that was found."""

    source: Literal["fastapi", "handler", "none", "unknown"] = Field(description=(
        "fastapi: FastAPI validates the body (the route's body parameter); handler: the handler "
        "validates the raw body against TypeAdapters it holds; none: nothing reads the body; "
        "unknown: the handler parses the raw request with its own code"))
    media_type: str = ""
    models: list[str] = Field(default=[], description="qualified class names of the body models")
    types: list[_JSON_TYPE] = []
    extra: Literal["", "allow", "forbid", "ignore", "mixed"] = Field(
        default="", description="how the models treat unknown top-level fields")
    fields: list[RequestFieldDoc] = []
    note: str = ""


class RouteDoc(_Doc):
    path: str = Field(pattern=r"^/")
    methods: list[Annotated[str, Field(pattern=r"^([A-Za-z]+|\*)$")]] = Field(min_length=1)
    kind: Literal["http", "websocket", "mount"] = "http"
    endpoint: str = ""
    guarded: bool = False
    origin: str = "app.routes"
    request: RequestBodyDoc | None = Field(
        default=None, description="the request body (absent when the source does not say)")


class InventoryDoc(_Doc):
    """The routes an app serves, and where that knowledge came from (``inventory ...``)."""

    schema_version: Literal[1]
    source: SourceDoc
    vllm: VllmFactsDoc | None = None
    middleware: list[str] = []
    routes: list[RouteDoc]
    content_hash: str | None = None


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
    body: BodyDoc
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


DOCUMENTS: dict[str, type[BaseModel]] = {
    "policy": PolicyDoc,
    "principals": PrincipalsDoc,
    "inventory": InventoryDoc,
    "plan": PlanDoc,
    "probe-result": ProbeResultDoc,
    "netscan-result": NetscanResultDoc,
    "audit-result": AuditResultDoc,
    "evidence-manifest": EvidenceManifestDoc,
    "rule-program": RuleProgram,
}


def json_schema(name: str) -> dict[str, Any]:
    model = DOCUMENTS[name]
    schema = model.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://vllm-perimeter.invalid/schemas/{name}.schema.json"
    return schema


def where(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the field path users read: ``routes[0].path``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "document"


def validate(name: str, data: Any, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """``data`` validated as document ``name``; ``error`` naming ``source`` and the field."""
    try:
        return DOCUMENTS[name].model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise error(f"{source}: invalid {name}: {where(first['loc'])}: {first['msg']}{more}") from None
