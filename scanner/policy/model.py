"""Policy models: validated, frozen, versioned data (see ``policies/vllm-default.yaml``)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from scanner.policy.jwt import JwtAuth
from scanner.policy.media import MediaRules

AudienceKind = Literal["end-user", "service", "operator", "monitoring", "none"]
AUDIENCE_KINDS: tuple[str, ...] = ("end-user", "service", "operator", "monitoring", "none")
CacheSalt = Literal["pass", "reject", "strip", "per-principal", "per-audience"]
ChatTemplate = Literal["pass", "reject", "strip"]
CACHE_SALT_CHOICES: tuple[str, ...] = ("pass", "reject", "strip", "per-principal", "per-audience")
# Tenant-scoped prefix cache: the perimeter writes its own cache_salt, HMAC-SHA256(secret, subject),
# over any client's (vLLM shares prefix-cache hits only among requests with one salt).
SALTED: tuple[str, ...] = ("per-principal", "per-audience")
CHAT_TEMPLATE_CHOICES: tuple[str, ...] = ("pass", "reject", "strip")
# Stored responses: "shared" (vLLM's own behaviour: any caller naming an id reaches it) or "owned"
# (each id the perimeter hands out is bound to its principal: scanner/plan/owner.py)
Responses = Literal["shared", "owned"]
RESPONSES_CHOICES: tuple[str, ...] = ("shared", "owned")
# What the perimeter does when a request omits the field its route reads its output budget from
# (vLLM then generates up to the rest of the context window): write the cap in, refuse, or pass.
WhenAbsent = Literal["inject", "reject", "pass"]
WHEN_ABSENT_CHOICES: tuple[str, ...] = ("inject", "reject", "pass")
# Top-level request fields whose numeric value a policy may cap.
CAPPABLE_FIELDS: tuple[str, ...] = (
    "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of",
    "logprobs", "top_logprobs", "prompt_logprobs",
)
# The largest JSON cap both proxies compare exactly: njs and Lua read numbers as doubles, which
# hold every integer up to 2^53, so no integer over such a cap reads as within it.
MAX_JSON_CAP = 2 ** 53 - 1
# What an audience does with a top-level request-body field it names, and with those it does not.
FIELD_MODES: tuple[str, ...] = ("allow", "reject", "strip")
UNKNOWN_FIELD_CHOICES: tuple[str, ...] = ("reject", "strip", "pass")
# The largest per-request envelope cap (limits.max_sequences, max_request_tokens) either proxy can
# take: Envoy's hits_addend is a 32-bit count; njs and Lua count in doubles.
MAX_COUNT = (1 << 31) - 1
METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
SCHEMA_VERSION = 1


def default_tokens_burst(tokens_per_minute: int) -> int:
    """A token budget's capacity when the policy names none: a quarter of the minute, rounded up,
    so any 60 s window admits at most 1.25 x tokens_per_minute (the bucket full, then its refill)."""
    return -(-tokens_per_minute // 4)


@dataclass(frozen=True)
class Rate:
    rps: float
    burst: int


@dataclass(frozen=True)
class Limits:
    """Limits for a route and audience. None means "not limited by this policy"."""

    body_bytes: int | None = None
    json_caps: Mapping[str, int] = field(default_factory=dict)
    rate: Rate | None = None
    concurrency: int | None = None
    timeout_s: float | None = None
    when_absent: WhenAbsent | None = None   # None: not set here ("inject" when nothing sets it)
    # per principal (per client address on auth "none"), charged at admission: the request's
    # output budget + body bytes / 4 (scanner.plan.body.token_cost); None: no token budget
    tokens_per_minute: int | None = None
    # the most of that budget one principal may spend at once (the bucket's capacity, refilled at
    # tokens_per_minute / 60 a second): None here means the default, ceil(tokens_per_minute / 4)
    # (default_tokens_burst); in a plan's Decision.limits, the capacity the plan decided
    # (scanner/plan/build.py request_token_cap)
    tokens_burst: int | None = None
    # per request, the admitted envelope (scanner/plan/envelope.py): the most sequences one body
    # may run, and the most tokens (sequences x output budget per sequence + input estimate)
    max_sequences: int | None = None
    max_request_tokens: int | None = None

    def merged(self, override: Limits | None) -> Limits:
        if override is None:
            return self
        return Limits(
            body_bytes=override.body_bytes if override.body_bytes is not None else self.body_bytes,
            json_caps={**self.json_caps, **override.json_caps},
            rate=override.rate or self.rate,
            concurrency=override.concurrency if override.concurrency is not None else self.concurrency,
            timeout_s=override.timeout_s if override.timeout_s is not None else self.timeout_s,
            when_absent=override.when_absent or self.when_absent,
            tokens_per_minute=(override.tokens_per_minute if override.tokens_per_minute is not None
                               else self.tokens_per_minute),
            tokens_burst=override.tokens_burst if override.tokens_burst is not None else self.tokens_burst,
            max_sequences=(override.max_sequences if override.max_sequences is not None
                           else self.max_sequences),
            max_request_tokens=(override.max_request_tokens if override.max_request_tokens is not None
                                else self.max_request_tokens),
        )


Pin = int | float | str | bool | None
PIN_STRING = re.compile(r"^[A-Za-z0-9_.:/-]{0,64}$")   # a pinned string: written into configs as is


@dataclass(frozen=True)
class FieldRules:
    """What requests may carry at the top level of a JSON body: each named field allowed,
    rejected (400) or stripped, and one choice for every field not named (``unknown``).
    Without a ``fields:`` section nothing is named and unknown fields pass (only the body
    policy's governed fields are decided); with one, unknown fields are rejected unless it
    says otherwise: a field new in a vLLM upgrade stays closed until reviewed."""

    named: Mapping[str, str] = field(default_factory=dict)   # field -> allow | reject | strip
    unknown: str = "pass"                                     # reject | strip | pass
    # field -> the most items it may hold (a list's length, an object's keys; a string is one)
    counts: Mapping[str, int] = field(default_factory=dict)
    # field -> the value every body leaves with (number, string, boolean or null), the client's replaced
    pins: Mapping[str, Pin] = field(default_factory=dict)
    # field -> the values it may hold when present and not null (JSON equality: 1 is not "1")
    values: Mapping[str, tuple[Pin, ...]] = field(default_factory=dict)
    line: int = 0
    # field name -> the policy line naming it (errors only)
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def mode(self, name: str) -> str:
        """allow, reject or strip: what happens to ``name`` when a request carries it (a pinned
        field is allowed: its value is the perimeter's)."""
        if name in self.pins:
            return "allow"
        return self.named.get(name) or ("allow" if self.unknown == "pass" else self.unknown)

    def names(self, mode: str) -> tuple[str, ...]:
        return tuple(sorted(f for f, m in self.named.items() if m == mode))

    @property
    def decided(self) -> bool:
        """Does anything here act on a body (a field not allowed, or unknown ones not passed, a
        count or a pin)?"""
        return (self.unknown != "pass" or any(m != "allow" for m in self.named.values())
                or bool(self.counts) or bool(self.pins) or bool(self.values))


def count_of(value: object) -> int:
    """How many items a field holds, as a count cap reads it: a list's length, an object's number
    of keys, one for a string or any other value, none for null."""
    if value is None:
        return 0
    if isinstance(value, list | dict):
        return len(value)
    return 1


@dataclass(frozen=True)
class Audience:
    name: str
    kind: AudienceKind
    networks: tuple[str, ...] = ()   # names of entries in Policy.networks
    roles: tuple[str, ...] = ()      # empty with auth "key" / "jwt": any principal
    # "key": an API key of the principals file; "jwt": a bearer token verified by ``jwt``; "cert":
    # a client certificate from ``listen.tls.client_ca`` naming a certificate principal (mTLS)
    auth: Literal["key", "none", "jwt", "cert"] = "key"
    jwt: JwtAuth | None = None
    limits: Limits = field(default_factory=Limits)
    fields: FieldRules = field(default_factory=FieldRules)
    media: MediaRules = field(default_factory=MediaRules)
    line: int = 0

    @property
    def allows(self) -> bool:
        return self.kind != "none"


@dataclass(frozen=True)
class Principal:
    name: str
    role: str
    key_sha256: str  # hex digest of the full key; the key itself is never stored

    @property
    def fingerprint(self) -> str:
        return "sha256:" + self.key_sha256[:12]


@dataclass(frozen=True)
class CertPrincipal:
    """A workload known by its client certificate (``auth: cert``): by the certificate's URI SAN
    (a SPIFFE ID) or its subject DN (RFC 2253, as both proxies print it), never by the certificate
    itself, so a renewed certificate with the same name is the same principal (rotation without a
    restart); revocation: remove the entry, generate, reload."""

    name: str
    role: str
    san: str = ""       # the URI SAN (``spiffe://example.org/ns/app/sa/worker``)
    subject: str = ""   # or the subject DN (``CN=worker,O=Example``)

    @property
    def identity(self) -> str:
        """What names it: ``san:URI`` or ``subject:DN``."""
        return f"san:{self.san}" if self.san else f"subject:{self.subject}"


@dataclass(frozen=True)
class RouteRule:
    path: str
    audience: str
    methods: tuple[str, ...] = ()   # empty: every method the route declares
    limits: Limits | None = None
    state_changing: bool = False
    note: str = ""
    line: int = 0


@dataclass(frozen=True)
class BodyPolicy:
    cache_salt: CacheSalt = "reject"
    chat_template: ChatTemplate = "reject"
    cache_salt_secret_file: str | None = None   # with per-principal / per-audience: the HMAC secret
    responses: Responses = "shared"
    # with responses: owned: the HMAC secret sealing response ids, read by the proxy at run time
    responses_secret_file: str | None = None

    @property
    def salted(self) -> bool:
        return self.cache_salt in SALTED

    @property
    def owned(self) -> bool:
        return self.responses == "owned"


@dataclass(frozen=True)
class TlsServer:
    cert: str
    key: str
    # mTLS: the CA bundle (absolute path) client certificates are verified against. The listener
    # asks every client for a certificate and verifies one that is presented; only routes of an
    # ``auth: cert`` audience require one (so keys, tokens and certificates share the listener).
    client_ca: str | None = None
    verify_depth: int = 2               # intermediates between a client certificate and the CA


@dataclass(frozen=True)
class TlsUpstream:
    ca: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None


@dataclass(frozen=True)
class Listen:
    address: str = "0.0.0.0"
    port: int = 8080
    tls: TlsServer | None = None


BALANCE = ("least_conn", "round_robin")   # least connections by default: streams are long


@dataclass(frozen=True)
class Health:
    """Passive health of the replicas: after ``max_fails`` failed connections (refused, reset,
    timed out) a replica is skipped for ``eject_s`` seconds."""

    max_fails: int = 1
    eject_s: int = 10


@dataclass(frozen=True)
class Upstream:
    host: str = "127.0.0.1"       # the first (or only) replica
    port: int = 8000
    tls: TlsUpstream | None = None
    use_tls: bool = False
    # vLLM's own --api-key, presented upstream by the proxy on every allowed request: the file
    # (absolute path, read by the proxy at run time; the key is never in a generated config)
    api_key_file: str | None = None
    # more replicas of the same vLLM (data parallel, several pods); () = host:port alone
    replicas: tuple[tuple[str, int], ...] = ()
    balance: str = "least_conn"
    health: Health = field(default_factory=Health)

    @property
    def servers(self) -> tuple[tuple[str, int], ...]:
        """Every replica the proxy balances over, the first being ``host:port``."""
        return ((self.host, self.port), *self.replicas)


@dataclass(frozen=True)
class PortRule:
    """A TCP port that may answer, and the networks (policy names) it may answer from."""

    port: int
    networks: tuple[str, ...]
    note: str = ""
    line: int = 0


@dataclass(frozen=True)
class PortPolicy:
    """The ``ports:`` section: which TCP ports may answer from which network (default deny)."""

    allow: tuple[PortRule, ...] = ()

    def allowed_networks(self, port: int) -> tuple[str, ...]:
        return tuple(n for rule in self.allow if rule.port == port for n in rule.networks)


@dataclass(frozen=True)
class GrpcRule:
    """Who may call a gRPC method: ``/package.Service/Method``, or ``/package.Service/*`` for
    every method of a service."""

    method: str
    audience: str
    note: str = ""
    line: int = 0

    def covers(self, path: str) -> bool:
        return path == self.method or (self.method.endswith("/*") and path.startswith(self.method[:-1])
                                       and "/" not in path[len(self.method) - 1:])


@dataclass(frozen=True)
class GrpcPolicy:
    """The ``grpc:`` section: vLLM's gRPC server (``vllm serve --grpc``, no key check of its own)
    behind its own listener of the perimeter, default deny per method. ``inventory`` names the
    methods it has: a bundled gRPC catalog (``vllm-0.33.0``) or a file ``inventory grpc`` wrote
    (``path``: resolved against the policy's directory)."""

    inventory: str
    listen: Listen = field(default_factory=lambda: Listen(port=50052))
    upstream_host: str = "127.0.0.1"
    upstream_port: int = 50051
    rules: tuple[GrpcRule, ...] = ()
    path: str = ""      # the inventory as a file, when it names one
    line: int = 0


# What a proxy of a fleet does while the shared store (Redis) or the limiter cannot be reached:
# refuse (503 shared-store-unavailable) or enforce its own share of every limit (the policy's
# values divided by the replica count). Never unlimited.
OnUnavailable = Literal["deny", "local"]
ON_UNAVAILABLE_CHOICES: tuple[str, ...] = ("deny", "local")
LIMITER_PORT = 8081
MAX_REPLICAS = 1000


@dataclass(frozen=True)
class Shared:
    """The ``shared:`` section: a fleet of ``replicas`` proxies takes every rate, concurrency and
    token-budget limit from one limiter (``vllm-perimeter limiter``) on one Redis, so together
    they admit what the policy says (issue 21)."""

    redis: str                          # one Redis, Sentinel or Cluster (scanner.store_url); no password
    limiter: tuple[str, int] = ("127.0.0.1", LIMITER_PORT)   # where the proxies reach the limiter
    password_file: str | None = None    # the Redis password (AUTH), read by the limiter
    tls_ca: str | None = None           # rediss://: the CA bundle that signs Redis's certificate
    on_unavailable: OnUnavailable = "deny"
    replicas: int = 2                   # proxies in the fleet: the local fallback's divisor
    line: int = 0


@dataclass(frozen=True)
class Policy:
    name: str
    networks: Mapping[str, tuple[str, ...]]
    audiences: Mapping[str, Audience]
    principals: tuple[Principal, ...]
    rules: tuple[RouteRule, ...]
    body: BodyPolicy = field(default_factory=BodyPolicy)
    listen: Listen = field(default_factory=Listen)
    upstream: Upstream = field(default_factory=Upstream)
    trusted_proxies: tuple[str, ...] = ()
    ports: PortPolicy | None = None  # None: no `ports:` section (see scanner.netscan.policy)
    grpc: GrpcPolicy | None = None   # None: no gRPC listener
    shared: Shared | None = None     # None: every limit lives in each proxy (no fleet)
    certs: tuple[CertPrincipal, ...] = ()   # principals known by their client certificate
    source: str = "<policy>"
    digest: str = ""
    schema_version: int = SCHEMA_VERSION

    def roles(self) -> tuple[str, ...]:
        return tuple(sorted({p.role for p in self.principals}))

    def cert_roles(self) -> tuple[str, ...]:
        return tuple(sorted({c.role for c in self.certs}))

    def token_roles(self) -> tuple[str, ...]:
        """Every role a verified token can give (the ``jwt:`` sections' role maps and fixed roles)."""
        return tuple(sorted({r for a in self.audiences.values() if a.jwt
                             for r in (*a.jwt.roles.values(), *((a.jwt.role,) if a.jwt.role else ()))}))


def valid_cidr(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def valid_host(text: str) -> bool:
    """An IP address or a DNS name (letters, digits, '-' and '.'), nothing a config could misread."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(re.fullmatch(r"(?!-)[A-Za-z0-9-]{1,63}(\.(?!-)[A-Za-z0-9-]{1,63})*\.?", text))
    return True
