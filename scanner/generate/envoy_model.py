"""Plan -> the data the Envoy templates render: routes, Lua groups, rate filters, clusters.

Everything here is derived from the :class:`~scanner.plan.model.Plan` alone and sorted,
so the same plan gives the same model (and the same bytes).

Route table (first match wins, exact paths before templates):

* one route per allowed (method, path): exact ``path`` (templates: the anchored, narrow
  ``safe_regex`` of ``Decision.regex``) plus an exact ``:method`` header match;
* per known path, after its methods: ``405`` (some method is allowed) or ``404``
  (every method is denied), answered by Envoy itself;
* a final catch-all ``404``.

Per allowed route, in filter-chain order: network ACL (RBAC on the source address,
403), key -> principal and roles (Lua ``perimeter.auth``, 401/403), rate per
principal (one ``local_ratelimit`` filter per audience and rate, 429), body size
(``buffer``, 413), JSON caps and forbidden fields (Lua ``perimeter.body``, 400).
Concurrency per principal: one cluster per principal and concurrency group with a
circuit breaker; overflow is mapped to 429.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from scanner import patterns, reasons
from scanner.errors import GenerateError
from scanner.generate.common import (
    EnvoyOptions,
    Stamp,
    config_dir,
    host_header,
    retries_allowed,
    safe_name,
    salts,
    timeout_ms,
    upstream_tls,
)
from scanner.generate.interface import GenerateOptions
from scanner.plan import credential, settle
from scanner.plan import jwt as plan_jwt
from scanner.plan.certs import refusal as cert_refusal
from scanner.plan.jwt import refusal as jwt_refusal
from scanner.plan.jwt import verified
from scanner.plan.model import (
    BODY_METHODS,
    DECISION_HEADER,
    FORWARDED_HEADERS,
    PRINCIPAL_HEADER,
    REASON_HEADER,
    SPOOFABLE_HEADERS,
    WEBSOCKET_HEADERS,
    Decision,
    Plan,
    SharedPlan,
)
from scanner.plan.program import Programs, compile_decision
from scanner.plan.vllm_json import utf8_whitespace
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone, Zone, conc_of, rate_of, tokens_of
from scanner.policy.media import KEY_KINDS
from scanner.policy.model import CertPrincipal, Principal, Rate
from scanner.rules import ANSWER_LINE_MAX, ANSWER_MAX, BODY_DEPTH, Program

LUA_FILTER = "perimeter.lua"
PRINCIPALS = "envoy-principals.tsv"
# a JSON document as Python holds it (a rule program's steps)
JsonValue = dict[str, "JsonValue"] | list["JsonValue"] | str | int | float | bool | None
STREAM_BUFFER = 1048576    # Envoy's default per-connection buffer limit
UPSTREAM_HEADER = "x-perimeter-upstream"   # internal: the concurrency cluster Lua picked
BASE_CLUSTER = "vllm"
GRPC_CLUSTER = "vllm_grpc"
# What a gRPC call needs besides content-type and user-agent: its framing and deadline headers
# (client metadata is dropped like any other header).
GRPC_HEADERS: tuple[str, ...] = ("grpc-accept-encoding", "grpc-encoding", "grpc-timeout", "te")
# Besides the forwarded headers, what the Lua filter must leave for Envoy itself: the body's
# framing, the key (read by Lua, removed by the router), and what Envoy set as the edge proxy.
ENVOY_KEPT = frozenset({"content-length", "transfer-encoding", "authorization", "x-forwarded-for",
                        "x-forwarded-proto", "x-request-id", UPSTREAM_HEADER})


@dataclass(frozen=True)
class Cidr:
    address: str
    prefix_len: int


@dataclass(frozen=True)
class RouteView:
    """One entry of the route table."""

    name: str
    path: str = ""            # exact match, or
    regex: str = ""           # anchored safe_regex, or
    prefix: str = ""          # a path prefix (a mutation operator's); none of the three: prefix "/"
    connect: bool = False     # CONNECT requests (authority-form), which only a connect_matcher matches
    method: str = ""          # :method exact match; "" = any method
    status: int = 0           # direct response status; 0 = forwarded upstream
    reason: str = ""          # X-Perimeter-Reason of a direct response
    rule: str = ""            # why (plan reason), route metadata for the access log
    allow: str = ""           # Allow header of a 405
    # forwarded routes only
    cluster: str = ""
    cluster_header: str = ""
    timeout: str = "0s"
    # limits.timeout_s: how long the route waits for vLLM without a byte either way (NGINX's
    # proxy_read_timeout), not how long an answer may take: a stream runs while its events flow.
    # Also bounds the wait for the first byte (the connection manager's 5-minute
    # stream_idle_timeout would cut a longer one); 0s: no limit (the plan sets none).
    idle_timeout: str = "0s"
    networks: tuple[Cidr, ...] | None = None   # None: any source
    lua_group: str = ""       # Lua group id (headers, key, roles, body check); "" = Lua off
    buffer_bytes: int = 0     # buffer filter limit; 0 = no body limit from the policy
    stream_buffer: int = 0    # route request_body_buffer_limit (Lua reads bodies > 1 MiB)
    rate_filter: str = ""
    token_filter: str = ""    # the local_ratelimit filter of the route's token budget; "" none
    websocket: bool = False
    retry: str = ""           # Envoy retry_on; "" = no retry
    grpc: bool = False        # a gRPC method: matched only with content-type application/grpc
    jwt: str = ""             # jwt_authn requirement (the audience's provider) on an auth "jwt" route
    shared: tuple[SharedAction, ...] = ()   # the limiter's descriptors (RateLimitPerRoute); () none


@dataclass(frozen=True)
class JwtProvider:
    """One jwt_authn provider per audience with ``auth: jwt``: it verifies the signature (kid and
    alg against the JWKS) only, and writes the token's header and payload (or why it failed) to
    dynamic metadata; Lua judges the token's text before and its claims after (its clock skew
    the largest jwt_authn takes, no audiences: ``audiences`` and ``clock_skew_s`` are Lua's)."""

    name: str                          # provider, requirement and metadata key prefix
    jwks_file: str
    remote_jwks: str                   # "" none
    remote_cluster: str
    remote_host: str
    remote_port: int
    audiences: tuple[str, ...]
    clock_skew_s: int


@dataclass(frozen=True)
class LuaJwt:
    """What Lua checks of a verified token (Decision.jwt)."""

    provider: str
    issuers: tuple[tuple[str, str], ...]    # (issuer, its token principals' prefix: scanner.plan.jwt)
    algorithms: tuple[str, ...]
    required: tuple[tuple[str, tuple[str, ...]], ...]
    principal_claim: str
    role_claim: str
    roles: tuple[tuple[str, str], ...]
    role: str
    max_bytes: int
    skew: int = 60
    # the policy's audiences (Lua checks them: jwt_authn holds none); the JWKS keys Lua checks a
    # token's kid and alg against (kid, algorithms verified), known only with a local JWKS
    audiences: tuple[str, ...] = ()
    keys: tuple[tuple[str, tuple[str, ...]], ...] = ()
    local_keys: bool = False


@dataclass(frozen=True)
class SharedAction:
    """One ``rate_limits`` entry of a route's ``RateLimitPerRoute`` (scanner.limiter.rls's
    descriptor scheme): ``(zone, NAME)``, the key (``principal`` from the metadata Lua wrote, or
    ``remote_address``), then ``(op, release|settle)`` and ``(slot, ID)`` as needed; ``hits``:
    the ``perimeter`` metadata key its hits_addend is read from ("" none)."""

    zone: str
    per_address: bool
    slot: bool = False
    hits: str = ""
    op: str = ""

    @property
    def on_done(self) -> bool:
        """Sent when the stream ends (release a slot, settle a token reservation)."""
        return bool(self.op)


@dataclass(frozen=True)
class SharedLimiter:
    """The limiter every replica calls (policy ``shared:``): Envoy's ratelimit filter over gRPC
    (h2c) to ``host:port``. ``failure_mode_deny`` always: a limiter that does not answer is a 503
    ``shared-store-unavailable``; with ``on_unavailable: local`` the limiter itself answers OK
    with ``{shared: unavailable}`` in the filter's dynamic metadata while Redis is down, and the
    local filters (each zone's per-proxy share) count only requests so marked."""

    host: str
    port: int
    ip: bool
    domain: str
    on_unavailable: str
    timeout: str = "1s"
    # Each try of a call: Envoy 1.40 ends a try of the gRPC service's retry policy at the back-off's
    # max_interval (measured: 20 ms ended every call slower than that, and the retry charged the
    # request again, up to 3 times, then 503), and tells the limiter in
    # x-envoy-expected-rq-timeout-ms, which the limiter makes its Redis deadline: a try it answers
    # too late writes nothing (scanner.limiter.server), so a retry never charges twice.
    try_timeout: str = "0.25s"

    @property
    def local(self) -> bool:
        return self.on_unavailable == "local"


@dataclass(frozen=True)
class LuaGroup:
    """What the Lua filter checks on a set of routes."""

    id: str
    key: bool                                    # a key is needed (auth "key")
    roles: tuple[str, ...] = ()                  # empty: any principal
    limited: bool = False                        # a concurrency limit: a cluster per principal
    upstreams: tuple[tuple[str, str], ...] = ()  # principal -> concurrency cluster
    check_body: bool = False                     # the body read and its program run
    program: str = ""                            # the id of its rule program (EnvoyModel.programs)
    body_limit: int = 0                          # bytes; 0 = none (checked bodies only)
    websocket: bool = False                      # also pass the WebSocket handshake headers
    salt: str = ""                               # "principal" / "audience:NAME": the subject whose
                                                 # cache_salt (from the 0600 TSV) the salt step writes
    grpc: bool = False                           # a gRPC method: also pass gRPC's own headers
    # a token budget (tokens per minute, the bucket's capacity): Lua sets perimeter.cost
    tokens: tuple[int, int] | None = None
    token_zone: str = ""                         # its local_ratelimit filter (the credit ledger's zone)
    jwt: LuaJwt | None = None                    # auth "jwt": the token's checks after jwt_authn
    cert: bool = False                           # auth "cert": a client certificate principal
    slot: bool = False                           # a shared concurrency zone: Lua sets perimeter.slot
    # responses: owned (scanner/plan/owner.py): the :path part holding a sealed response id (0:
    # none), and whether answers are sealed (Lua unseals / seals; body fields: the owned step)
    owner_param: int = 0
    owner_seal: bool = False



@dataclass(frozen=True)
class TokenFilter:
    """One token zone (scanner.plan.zones.TokenZone: the plan's, or this proxy's share of it under
    on_unavailable: local): a local_ratelimit filter after Lua, one bucket of ``burst`` tokens per
    principal (or client address), refilled continuously at ``limit`` a minute, charged
    hits_addend = the cost Lua put in perimeter.cost."""

    name: str
    zone: TokenZone
    per_address: bool
    max_descriptors: int
    audience: str = ""
    fallback: bool = False     # on_unavailable: local: counts only requests the limiter could not decide

    @property
    def limit(self) -> int:
        """Tokens per minute (the bucket's tokens_per_fill, fill_interval 60 s)."""
        return self.zone.per_minute

    @property
    def burst(self) -> int:
        """The bucket's capacity (max_tokens)."""
        return self.zone.burst


# what a salt adds to a body Lua forwards: ,"cache_salt":"<64 hex>"
SALT_BYTES = len(',"cache_salt":""') + 64
# the most asking a stream for its usage adds (settle.asking_usage)
ASK_BYTES = len(',"stream_options":{"include_usage":true}')


@dataclass(frozen=True)
class TokenBucketView:
    """A rate as Envoy's ``token_bucket`` writes it (:func:`bucket`): render only, the values are
    the rate zone's."""

    max_tokens: int
    tokens_per_fill: int
    fill_interval: str


@dataclass(frozen=True)
class RateFilter:
    """One rate zone (scanner.plan.zones.RateZone: the plan's, or this proxy's share of it under
    on_unavailable: local): a local_ratelimit filter, a bucket per principal or client address."""

    name: str
    zone: RateZone
    principals: tuple[str, ...]    # a descriptor (own bucket) per principal
    per_address: bool              # auth "none": a bucket per client address
    audience: str = ""
    per_token: bool = False        # auth "jwt": a bucket per token principal (a wildcard descriptor)
    fallback: bool = False         # on_unavailable: local: counts only requests the limiter could not decide

    @property
    def bucket(self) -> TokenBucketView:
        return bucket(self.zone)


@dataclass(frozen=True)
class ClusterView:
    name: str
    max_requests: int = 0          # 0: Envoy's defaults
    max_pending: int = 0
    grpc: bool = False             # vLLM's gRPC server (HTTP/2), not its HTTP app


@dataclass(frozen=True)
class GrpcListener:
    """The gRPC listener (policy ``grpc:``) and vLLM's gRPC server behind it."""

    listen_address: str
    listen_port: int
    upstream_endpoints: tuple[tuple[str, int], ...]
    upstream_ip: bool
    routes: tuple[RouteView, ...]


@dataclass(frozen=True)
class UpstreamTlsContext:
    ca: str
    sni: str = ""
    san_dns: str = ""
    san_ip: str = ""
    client_cert: str = ""
    client_key: str = ""


@dataclass(frozen=True)
class Balance:
    """Several replicas: the load-balancing policy, passive health (outlier detection on
    failed connections) and a retry on another replica while nothing was sent."""

    lb_policy: str      # LEAST_REQUEST | ROUND_ROBIN
    max_fails: int
    eject_s: int
    retries: int        # one per other replica


@dataclass(frozen=True)
class EnvoyWeakening:
    """A mutation operator's switches on the whole config (scanner/mutate/envoy.py). The generator
    sets none: every switch off is the plan's config."""

    xff_trusted_hops: int = 0        # X-Forwarded-For hops believed: 1 takes the client's own claim for
                                     # its address (what vLLM is told, per-address limits)
    request_id_from_client: bool = False  # preserve_external_request_id: the client's X-Request-Id
                                          # reaches vLLM
    client_headers: bool = False     # every client header passed on (the Lua drops none: no allowlist)
    # the Lua's token checks (auth "jwt"; jwt_authn verifies the signature only) and certificate names
    jwt_signature_unchecked: bool = False   # a token failing verification admitted (as "unverified")
    jwt_audience_unchecked: bool = False
    jwt_expiry_unchecked: bool = False
    jwt_crit_ignored: bool = False
    jwt_issuer_unchecked: bool = False      # any issuer taken for the policy's
    jwt_issuer_prefix: bool = False         # the issuer compared as a prefix of an allowed one
    jwt_trailing_accepted: bool = False     # trailing '.' / '=' stripped before the form is checked
    jwt_unprefixed: bool = False            # a token principal without its "jwt:ID:" kind
    cert_anyone: str = ""                   # an unknown certificate names "anyone" with this role
    cert_subject_fallback: bool = False     # a URI SAN naming nobody falls back to the subject
    cert_any_ca: bool = False               # client certificates from any CA, their validation unread
    owner_unbound: bool = False             # response seals not bound to the principal
    any_key: tuple[str, str] | None = None  # (principal, role) an unknown key is taken for
    key_digest_accepted: bool = False       # a bearer of 64 hex digits taken as its own sha256
                                            # (pass-the-hash)
    key_prefix: int = 0                     # only the bearer's first N characters hashed (0: all of it)
    xff_from_anyone: bool = False           # the client address (RBAC, use_remote_address) from the
                                            # client's own X-Forwarded-For
    principal_from_client: bool = False     # the principal header added only if the client sent none
    shared_failure_allowed: bool = False    # the limiter's failure lets a request on (failure_mode_deny
                                            # false: to the local shares, a fleet operator's)
    h2c: bool = False                       # codec_type AUTO: HTTP/2 prior knowledge on the listener
    host_from_client: bool = False          # no host_rewrite_literal: the client's Host reaches vLLM
    retry_5xx: bool = False                 # routes with a retry policy also resend on a 5xx, 3 times
    shadow: tuple[str, ...] = ()            # local rate limit filters in shadow mode (filter_enforced 0)
    raw_target: bool = False                # paths matched and forwarded raw (no normalisation)
    grpc_accepted: bool = False             # no deny:grpc route: gRPC-shaped requests not refused
    upstream_key_dropped: bool = False      # vLLM's own key not added to requests upstream
    errors_passed: tuple[str, ...] = ()     # routes whose vLLM 5xx bodies reach the client (the
                                            # custom_response filter off there)
    unsettled: tuple[str, ...] = ()         # token filters charged the whole cost, not the settled hits
    tls_legacy: bool = False                # the listener from TLS 1.0, with the CBC cipher suites


@dataclass(frozen=True)
class EnvoyModel:
    stamp: Stamp
    listen_address: str
    listen_port: int
    listen_tls: tuple[str, str] | None
    # mTLS (auth "cert"): the CA bundle client certificates are verified against, the chain depth;
    # a certificate is asked for, not required (key and token routes share the listener)
    listen_client_ca: str
    listen_verify_depth: int      # max_verify_depth: verify_depth + 1 (Envoy counts the trust anchor)
    upstream_endpoints: tuple[tuple[str, int], ...]   # every replica (host, port)
    upstream_ip: bool                                  # all are IP addresses: a STATIC cluster
    balance: Balance | None                            # None: one vLLM
    upstream_tls: UpstreamTlsContext | None
    host_header: str                                   # the Host vLLM receives (the plan's)
    trusted_proxies: tuple[Cidr, ...]
    access_log: str
    keys_file: str
    admin: tuple[str, int] | None
    routes: tuple[RouteView, ...]
    lua_groups: tuple[LuaGroup, ...]
    rate_filters: tuple[RateFilter, ...]
    clusters: tuple[ClusterView, ...]
    kept_headers: tuple[str, ...]         # passed on from the client (lower case); the rest dropped
    websocket_headers: tuple[str, ...]
    request_headers_to_remove: tuple[str, ...]
    principals: tuple[Principal, ...]
    salts: tuple[tuple[str, str], ...] = ()       # (subject, cache_salt): the 0600 TSV only
    certs: tuple[CertPrincipal, ...] = ()         # auth "cert": by URI SAN / subject, in the TSV
    upstream_key_file: str = ""                   # vLLM's key, read by Lua at load ("" none)
    owner_file: str = ""                          # responses: owned: the secret, read by Lua at load
    grpc: GrpcListener | None = None              # the gRPC listener; None: none
    token_filters: tuple[TokenFilter, ...] = ()   # token budgets: after Lua, before the buffer
    # the rule programs of the Lua groups (scanner.plan.program: Programs), by id
    programs: tuple[tuple[str, Program], ...] = ()
    workers: int = 1            # Envoy's --concurrency: each worker holds a share of the credits
    jwt_providers: tuple[JwtProvider, ...] = ()   # auth "jwt" audiences: jwt_authn before Lua
    ca_bundle: str = ""                           # trusted CAs of a remote JWKS
    shared: SharedLimiter | None = None   # the fleet's limiter (policy shared:); None: local limits only
    grpc_headers: tuple[str, ...] = GRPC_HEADERS  # passed on gRPC routes as the client sent them
    decision_header: str = DECISION_HEADER
    reason_header: str = REASON_HEADER
    principal_header: str = PRINCIPAL_HEADER.lower()
    upstream_header: str = UPSTREAM_HEADER
    lua_filter: str = LUA_FILTER
    weak: EnvoyWeakening = EnvoyWeakening()   # a mutation operator's switches (none set here)

    @property
    def scheme(self) -> str:
        return "https" if self.listen_tls else "http"

    @property
    def whitespace(self) -> tuple[str, ...]:
        """vLLM's whitespace around a numeric string (scanner/plan/vllm_json.py WHITESPACE), each
        a UTF-8 string for Lua's WS table: generated, not copied."""
        return tuple(w.decode("utf-8") for w in utf8_whitespace())

    @property
    def media_kinds(self) -> dict[str, JsonValue]:
        """Each media key's kind (scanner/policy/media.py KEY_KINDS; Lua's MEDIA table)."""
        return dict(KEY_KINDS)

    @property
    def body_depth(self) -> int:
        """The most nesting a body may have (scanner/rules.py BODY_DEPTH; Lua's BODY_DEPTH)."""
        return BODY_DEPTH

    @property
    def answer_max(self) -> int:
        """The largest JSON answer settled or sealed (scanner/rules.py ANSWER_MAX; Lua's JSON_MAX)."""
        return ANSWER_MAX

    @property
    def answer_line_max(self) -> int:
        """The longest stream line settled or sealed (scanner/rules.py ANSWER_LINE_MAX; Lua's LINE_MAX)."""
        return ANSWER_LINE_MAX

    @property
    def program_steps(self) -> tuple[tuple[str, list[JsonValue]], ...]:
        """Each program's steps as JSON (the Lua table PROGRAMS), as Lua runs them."""
        return tuple((pid, lua_program(p)) for pid, p in self.programs)

    @property
    def group_table(self) -> tuple[tuple[str, dict[str, JsonValue]], ...]:
        """Each Lua group as the Lua table GROUPS holds it (lua_value), by id."""
        return tuple((g.id, _lua_group(g)) for g in self.lua_groups)

    @property
    def header_sets(self) -> dict[str, JsonValue]:
        """The request headers Lua passes on as the client sent them, by the kind of a group's
        routes (LuaGroup.websocket, LuaGroup.grpc; else plain): every other one is dropped."""
        kept = set(self.kept_headers)
        return {"plain": _lua_set(self.kept_headers),
                "websocket": _lua_set(tuple(sorted(kept | set(self.websocket_headers)))),
                "grpc": _lua_set(tuple(sorted(kept | set(self.grpc_headers))))}

    @property
    def final_types(self) -> dict[str, JsonValue]:
        """scanner/plan/settle.py FINAL_TYPES as the JSON texts Lua compares an event's "type" to."""
        return {json.dumps(t): True for t in sorted(settle.FINAL_TYPES)}

    @property
    def true_texts(self) -> dict[str, JsonValue]:
        """scanner/plan/settle.py TRUE_TEXT (the strings vLLM reads as true), for Lua's vllm_true."""
        return dict.fromkeys(sorted(settle.TRUE_TEXT), True)

    @property
    def jwt_limits(self) -> tuple[int, int]:
        """scanner/plan/credential.py TIME_MAX and MAX_DEPTH (a token's largest exp / nbf / iat,
        its deepest nesting), for Lua's JWT_TIME_MAX, JWT_DEPTH."""
        return credential.TIME_MAX, credential.MAX_DEPTH

    @property
    def settles(self) -> bool:
        """Does Lua charge token costs and settle answers (a token budget, local or shared)?"""
        return bool(self.token_filters) or any(g.tokens for g in self.lua_groups)


# --- helpers ---------------------------------------------------------------------------


def lua_program(program: Program) -> list[JsonValue]:
    """A rule program's steps as the shared Lua interpreter (templates/perimeter_program.lua.j2)
    runs them, in Envoy's filter and in NGINX's Lua runtime alike."""
    return [_lua_step(step.model_dump(mode="json")) for step in program.steps]


def _lua_step(step: dict[str, JsonValue]) -> JsonValue:
    """A step as Lua runs it: a budget also with its field's names and the names its fields have
    in the object the budget is written to (the parent's, or the body's), computed once here, not
    split and matched on every request; media also with its domains as [name, port, the suffix a
    "*." name matches or false] (scanner/policy/media.py host_listed's partition, done here once)."""
    if step["op"] == "media" and isinstance(step["domains"], list):
        hosts: list[JsonValue] = []
        for entry in map(str, step["domains"]):
            name, _, port = entry.partition(":")
            hosts.append([name, port, name[1:] if name.startswith("*.") else False])
        return {"op": "media", "hosts": hosts, **step}
    if step["op"] != "budget" or not isinstance(step["field"], str) or not isinstance(step["fields"], list):
        return step
    names = step["field"].split(".")
    prefix = names[0] + "." if len(names) > 1 else ""
    level: list[JsonValue] = [f.removeprefix(prefix) for f in step["fields"] if isinstance(f, str)
                              and f.startswith(prefix) and "." not in f.removeprefix(prefix)]
    split: list[JsonValue] = list(names)
    return {"op": "budget", "names": split, "level": level, **step}   # then the step as the plan has it


def _lua_set(names: tuple[str, ...]) -> dict[str, JsonValue]:
    return dict.fromkeys(names, True)


def _lua_jwt(t: LuaJwt) -> dict[str, JsonValue]:
    """A group's ``jwt`` entry: what token_auth reads (sets as name -> true, maps as tables)."""
    out: dict[str, JsonValue] = {
        "provider": t.provider, "issuers": dict(t.issuers), "algs": _lua_set(t.algorithms),
        "required": [[claim, _lua_set(values)] for claim, values in t.required],
        "principal": t.principal_claim, "role_claim": t.role_claim, "roles": dict(t.roles),
        "role": t.role, "max": t.max_bytes, "skew": t.skew, "audiences": _lua_set(t.audiences)}
    if t.local_keys:   # the JWKS is known here: a token's kid and alg are checked against it
        out["keys"] = {kid: _lua_set(algs) for kid, algs in t.keys}
        if len(t.keys) == 1:   # a token without a kid takes the only key
            out["only"] = _lua_set(t.keys[0][1])
    return out


def _lua_group(g: LuaGroup) -> dict[str, JsonValue]:
    """One entry of the Lua table GROUPS (envoy_perimeter.lua.j2 reads these names): an absent
    name is Lua's nil (roles: any principal; upstream: no concurrency cluster per principal)."""
    out: dict[str, JsonValue] = {"key": g.key, "check": g.check_body, "limit": g.body_limit,
                                 "headers": "websocket" if g.websocket else "grpc" if g.grpc else "plain"}
    if g.roles:
        out["roles"] = _lua_set(g.roles)
    if g.limited:
        out["upstream"] = dict(g.upstreams)
    optional: dict[str, JsonValue] = {
        "cert": g.cert, "program": g.program, "salt": g.salt,
        "owner_param": g.owner_param, "owner_seal": g.owner_seal, "slot": g.slot,
        "jwt": _lua_jwt(g.jwt) if g.jwt else None,
        "tokens": {"limit": g.tokens[0], "cap": g.tokens[1], "zone": g.token_zone} if g.tokens else None}
    out.update((name, v) for name, v in optional.items() if v)
    return out


def cidr(text: str) -> Cidr:
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise GenerateError(f"envoy generator: {text!r} is not an IP network") from None
    return Cidr(str(net.network_address), net.prefixlen)


def _any_source(cidrs: tuple[Cidr, ...]) -> bool:
    return {(c.address, c.prefix_len) for c in cidrs} >= {("0.0.0.0", 0), ("::", 0)}


def duration(seconds: float | None) -> str:
    """Envoy duration text; None (no limit in the policy) -> 0s (no timeout)."""
    if seconds is None:
        return "0s"
    ms = timeout_ms(seconds)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms / 1000:.3f}s"


def bucket(rate: Rate | RateZone) -> TokenBucketView:
    """A token bucket for ``rps`` with ``burst`` tokens; fill intervals are whole seconds.

    Local rate-limit descriptors need fill intervals that are multiples of the filter's
    (1 s), so a rate becomes ``k`` tokens every ``n`` seconds with n in 1..60 chosen to
    make ``rps * n`` as close to a whole number as possible.
    """
    best = min(range(1, 61), key=lambda n: (abs(rate.rps * n - round(rate.rps * n)) / n
                                            + (1.0 if round(rate.rps * n) < 1 else 0.0), n))
    tokens = max(1, round(rate.rps * best))
    return TokenBucketView(max_tokens=max(rate.burst, tokens, 1), tokens_per_fill=tokens,
                           fill_interval=f"{best}s")


def _check_name(kind: str, name: str) -> str:
    return safe_name("envoy", kind, name)


def _admitted(principals: tuple[Principal, ...], roles: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in principals if not roles or p.role in roles))


# --- registries: one id per distinct group, in first-seen order of sorted routes --------


@dataclass
class _EnvoyRegistry:
    principals: tuple[Principal, ...]
    lua: dict[tuple[object, ...], LuaGroup] = field(default_factory=dict)
    # by the zone this proxy keeps (Plan.own_zones: the plan's, or its share under local)
    rate: dict[RateZone, RateFilter] = field(default_factory=dict)
    clusters: dict[str, ClusterView] = field(default_factory=dict)
    concurrency: dict[tuple[ConcurrencyZone, bool], str] = field(default_factory=dict)   # (zone, gRPC)
    tokens: dict[TokenZone, TokenFilter] = field(default_factory=dict)
    jwt: dict[str, JwtProvider] = field(default_factory=dict)      # by audience
    programs: Programs = field(default_factory=Programs)          # the groups' rule programs
    shared: SharedPlan | None = None
    zones: Mapping[str, Zone] = field(default_factory=dict)        # the plan's (Plan.zones)
    own: Mapping[str, Zone] = field(default_factory=dict)          # this proxy's (Plan.own_zones)

    def jwt_provider(self, d: Decision) -> str:
        """The jwt_authn provider of an auth "jwt" route's audience ("" other routes)."""
        if d.jwt is None:
            return ""
        if d.audience not in self.jwt:
            t = d.jwt
            host, port = "", 443
            if t.remote_jwks:
                netloc = t.remote_jwks.split("/")[2]
                host, _, p = netloc.partition(":")
                port = int(p) if p else 443
            name = f"perimeter.jwt.{d.audience}"
            self.jwt[d.audience] = JwtProvider(
                name=name, jwks_file=t.jwks_file, remote_jwks=t.remote_jwks,
                remote_cluster=f"{name}.jwks" if t.remote_jwks else "", remote_host=host, remote_port=port,
                audiences=t.audiences, clock_skew_s=t.clock_skew_s)
        return self.jwt[d.audience].name

    def lua_jwt(self, d: Decision) -> LuaJwt | None:
        t = d.jwt
        if t is None:
            return None
        algs = verified(d, "envoy")
        return LuaJwt(provider=self.jwt_provider(d), algorithms=verified(d, "envoy"),
                      issuers=tuple(zip(t.issuers, plan_jwt.prefixes(t), strict=True)),
                      required=tuple((k, v) for k, v in t.required_claims.items()),
                      principal_claim=t.principal_claim, role_claim=t.role_claim,
                      roles=tuple(t.roles.items()), role=t.role, max_bytes=t.max_token_bytes,
                      skew=t.clock_skew_s, audiences=t.audiences, local_keys=not t.remote_jwks,
                      keys=tuple((k.kid, tuple(a for a in k.algorithms if a in algs)) for k in t.keys
                                 if any(a in algs for a in k.algorithms)))

    def concurrency_group(self, d: Decision, zone: ConcurrencyZone) -> str:
        """The cluster (auth none) or cluster prefix (auth key) of ``zone``, ``d``'s concurrency."""
        limit = zone.limit
        grpc = d.kind == "grpc"
        if (zone, grpc) not in self.concurrency:
            gid = f"{GRPC_CLUSTER if grpc else BASE_CLUSTER}.{d.audience}.c{limit}"
            self.concurrency[(zone, grpc)] = gid
            # HTTP/1.1 upstream: at most `limit` requests in flight to vLLM per principal,
            # at most `limit` more waiting for a connection; beyond that, overflow -> 429.
            names = ([f"{gid}.{p}" for p in _admitted(self.principals, d.roles)]
                     if d.auth == "key" else [gid])
            for name in names:
                self.clusters[name] = ClusterView(name, max_requests=limit, max_pending=limit, grpc=grpc)
        return self.concurrency[(zone, grpc)]

    def lua_group(self, d: Decision, upstream_prefix: str, check_body: bool) -> str:
        """The Lua group of an allowed route (every one: Lua drops the headers not forwarded)."""
        key_needed = d.auth == "key"
        cert = d.auth == "cert"
        websocket = d.kind == "websocket"
        limit = (d.limits.body_bytes or 0) if check_body else 0
        budget = d.enforced_budget if check_body else None
        if budget is not None and budget.field.count(".") > 1:
            raise GenerateError(f"envoy generator: {d.method} {d.path}: an output budget nested deeper "
                                f"than one object ({budget.field}) is not supported")
        program = self.programs.add(compile_decision(d)) if check_body else ""
        salt = "" if not (check_body and d.salt) else (
            "principal" if d.salt == "principal" else f"audience:{d.audience}")
        grpc = d.kind == "grpc"
        budget_zone = tokens_of(self.zones, d)
        tokens = (budget_zone.per_minute, budget_zone.burst) if budget_zone else None
        own = self.token_filter(d, tokens_of(self.own, d))   # its local filter ("" none)
        slot = self.shared is not None and any(a.slot for a in shared_actions(self.shared, d))
        ident = (key_needed, cert, d.roles if key_needed or cert else (), upstream_prefix, check_body,
                 program, limit, websocket, salt, grpc, tokens, own,
                 self.lua_jwt(d), d.roles if d.jwt else (), slot, d.owner_segment, d.owner_seal)
        if ident not in self.lua:
            ups = tuple((p, f"{upstream_prefix}.{p}") for p in _admitted(self.principals, d.roles)
                        ) if upstream_prefix else ()
            self.lua[ident] = LuaGroup(
                id=f"g{len(self.lua) + 1}", key=key_needed, jwt=self.lua_jwt(d), cert=cert,
                roles=d.roles if key_needed or cert or d.jwt else (), limited=bool(upstream_prefix),
                upstreams=ups, check_body=check_body, program=program, body_limit=limit,
                websocket=websocket, salt=salt, grpc=grpc, tokens=tokens,
                token_zone=own, slot=slot, owner_param=d.owner_segment,
                owner_seal=d.owner_seal)
        return self.lua[ident].id

    def rate_filter(self, d: Decision, zone: RateZone | None) -> str:
        """The local_ratelimit filter of ``zone``, ``d``'s rate ("" none)."""
        if zone is None:
            return ""
        if zone not in self.rate:
            n = sum(1 for f in self.rate.values() if f.audience == d.audience)
            name = f"perimeter.rate.{d.audience}" + (f".{n + 1}" if n else "")
            principals = _admitted(self.principals, d.roles) if d.auth == "key" else ()
            self.rate[zone] = RateFilter(name, zone, principals, per_address=d.auth == "none",
                                         audience=d.audience, per_token=d.auth in ("jwt", "cert"),
                                         fallback=self.shared is not None)
        return self.rate[zone].name

    def token_filter(self, d: Decision, zone: TokenZone | None) -> str:
        """The local_ratelimit filter of ``zone``, ``d``'s token budget ("" none)."""
        if zone is None:
            return ""
        if zone not in self.tokens:
            n = sum(1 for f in self.tokens.values() if f.audience == d.audience)
            name = f"perimeter.tokens.{d.audience}" + (f".{n + 1}" if n else "")
            # the filter's LRU of buckets: every principal's own (an evicted one would come back full)
            self.tokens[zone] = TokenFilter(name, zone, per_address=d.auth == "none",
                                            max_descriptors=max(64, len(self.principals) + 1)
                                            if d.auth == "key" else 10000, audience=d.audience,
                                            fallback=self.shared is not None)
        return self.tokens[zone].name


# --- routes ----------------------------------------------------------------------------


def _route_name(prefix: str, method: str, path: str) -> str:
    return f"{prefix}:{method} {path}" if method else f"{prefix}:{path}"


def _exact(path: str) -> str:
    return path if patterns.is_exact(path) else ""


def _regex(path: str) -> str:
    """The anchored, narrow regex of a route template (path parameters: one safe segment)."""
    return "" if patterns.is_exact(path) else patterns.to_regex(path)


def _allowed_route(reg: _EnvoyRegistry, d: Decision) -> RouteView:
    _check_name("audience", d.audience)
    for role in d.roles:
        _check_name("role", role)
    nets = tuple(cidr(c) for c in d.networks)
    # the zones this proxy keeps itself (Plan.own_zones; none under deny: the limiter's alone)
    slots = conc_of(reg.own, d)
    concurrency = reg.concurrency_group(d, slots) if slots else ""
    key = d.auth == "key"
    websocket = d.kind == "websocket"
    check_body = (not websocket and d.method in BODY_METHODS
                  and bool(d.limits.json_caps or d.fields.decided or d.media.active or d.token_zone
                           or d.envelope_capped or d.owner_fields))
    body_bytes = 0 if websocket else (d.limits.body_bytes or 0)
    # Lua refuses a body over body_bytes itself; the buffer after it must also hold the body
    # Lua forwards, which grows by the output budget it writes in
    budget = d.budget if check_body else None
    grown = len(f',"{budget.field}":{budget.cap}') if budget and budget.when_absent == "inject" else 0
    grown += SALT_BYTES if check_body and d.salt else 0
    grown += sum(len(f',"{k}":{json.dumps(v)}') for k, v in d.fields.pins.items()) if check_body else 0
    grown += ASK_BYTES if check_body and d.token_zone and d.envelope_spec.ask_usage else 0
    held = body_bytes + grown if body_bytes else 0
    grpc = d.kind == "grpc"
    return RouteView(
        name=_route_name("allow", d.method, d.path), method=d.method, rule=d.reason,
        cluster="" if (key and concurrency) else (concurrency or (GRPC_CLUSTER if grpc else BASE_CLUSTER)),
        cluster_header=UPSTREAM_HEADER if (key and concurrency) else "",
        idle_timeout=duration(d.limits.timeout_s),
        networks=None if _any_source(nets) else nets,
        lua_group=reg.lua_group(d, concurrency if key else "", check_body),
        buffer_bytes=held,
        stream_buffer=held if check_body and held > STREAM_BUFFER else 0,
        rate_filter=reg.rate_filter(d, rate_of(reg.own, d)),
        token_filter=reg.token_filter(d, tokens_of(reg.own, d)),
        websocket=websocket, shared=shared_actions(reg.shared, d),
        # a state-changing request is retried only if it never reached the upstream
        retry="" if websocket else ("connect-failure,reset" if retries_allowed(d)
                                    else "connect-failure,reset-before-request"),
        path=_exact(d.path), regex=_regex(d.path), grpc=grpc, jwt=reg.jwt_provider(d),
    )


def shared_actions(shared: SharedPlan | None, d: Decision) -> tuple[SharedAction, ...]:
    """The limiter's descriptors of ``d`` (the plan's zones, in the limiter's order): acquire
    each zone (a rate 1, a slot named by perimeter.slot, a token zone the cost Lua wrote), then
    at the stream's end release the slot and settle the reservation (the refund Lua wrote from
    the answer's usage; none written: not sent, the charge stands)."""
    if shared is None:
        return ()
    per_address = d.auth == "none"   # else the principal Lua wrote (a key's or a token's)
    acquire: list[SharedAction] = []
    done: list[SharedAction] = []
    for name in shared.route_zones(d):
        kind = shared.zones[name].kind
        if kind == "rate":
            acquire.append(SharedAction(name, per_address))
        elif kind == "concurrency":
            acquire.append(SharedAction(name, per_address, slot=True))
            done.append(SharedAction(name, per_address, slot=True, op="release"))
        else:
            acquire.append(SharedAction(name, per_address, hits="cost"))
            done.append(SharedAction(name, per_address, hits="refund", op="settle"))
    return (*acquire, *done)


def _shared_limiter(plan: Plan) -> SharedLimiter | None:
    s = plan.shared
    if s is None:
        return None
    host, port = s.limiter
    return SharedLimiter(host=host, port=port, ip=_is_ip(host), domain=s.domain,
                         on_unavailable=s.on_unavailable)


def _fallback_route(path: str, decisions: tuple[Decision, ...]) -> RouteView:
    allowed = sorted({d.method for d in decisions if d.allowed})
    if allowed:
        return RouteView(name=_route_name("method", "", path), status=405,
                         reason=reasons.token("method-not-allowed"), allow=", ".join(allowed),
                         rule=f"allowed methods: {', '.join(allowed)}", path=_exact(path), regex=_regex(path))
    why = sorted({d.reason for d in decisions})
    return RouteView(name=_route_name("deny", "", path), status=404, reason=reasons.token("not-allowlisted"),
                     rule="; ".join(why), path=_exact(path), regex=_regex(path))


def _path_order(path: str) -> tuple[int, int, str]:
    """Exact paths first, then templates with fewer parameters first."""
    segs = patterns.segments(path)
    params = sum(1 for s in segs if patterns.is_param(s))
    return (0 if patterns.is_exact(path) else 1, params, path)


def _routes(reg: _EnvoyRegistry, plan: Plan) -> tuple[RouteView, ...]:
    by_path: dict[str, list[Decision]] = {}
    for d in plan.decisions:
        if d.kind == "mount" or d.method == "*":
            continue  # a mount's sub-paths are unknown: the catch-all denies them
        by_path.setdefault(d.path, []).append(d)
    out: list[RouteView] = []
    for path in sorted(by_path, key=_path_order):
        ds = tuple(sorted(by_path[path], key=lambda d: d.method))
        out.extend(_allowed_route(reg, d) for d in ds if d.allowed)
        out.append(_fallback_route(path, ds))
    # CONNECT (authority-form, host:port) matches only a connect_matcher: without this route the
    # Lua filter refused it as a route without a group (500 internal). Envoy answers it 403 as a
    # failed upgrade before the direct response (reason upgrade, local_reply_config).
    out.append(RouteView(name="deny:connect", connect=True, status=405,
                         reason=reasons.token("method-not-allowed"),
                         rule="CONNECT (no route in the inventory)"))
    out.append(RouteView(name="deny:unknown", regex="", path="", status=404,
                         reason=reasons.token("not-allowlisted"),
                         rule="no route in the inventory (default deny)"))
    return tuple(out)


def _grpc(reg: _EnvoyRegistry, plan: Plan) -> GrpcListener | None:
    """The gRPC listener: a route per allowed method (content-type application/grpc only), a 404
    for every other method of the inventory and for anything else."""
    g = plan.grpc
    if g is None:
        return None
    routes: list[RouteView] = []
    for d in g.decisions:
        if d.allowed:
            routes.append(replace(_allowed_route(reg, d), method=""))
        why = d.reason if not d.allowed else "a gRPC method is called with content-type application/grpc"
        routes.append(RouteView(name=_route_name("deny", "", d.path), status=404,
                                reason=reasons.token("not-allowlisted"), rule=why, path=d.path))
    routes.append(RouteView(name="deny:unknown", status=404, reason=reasons.token("not-allowlisted"),
                            rule="no method in the gRPC inventory (default deny)"))
    host, port = g.upstream
    if not (0 < g.listen.port < 65536 and 0 < port < 65536):
        raise GenerateError("envoy generator: gRPC ports must be in 1..65535")
    if g.listen.tls:
        raise GenerateError("envoy generator: TLS on the gRPC listener is not supported yet "
                            "(grpc.listen.tls)")
    return GrpcListener(listen_address=_ip("gRPC listen address", g.listen.address),
                        listen_port=g.listen.port,
                        upstream_endpoints=((host, port),), upstream_ip=_is_ip(host), routes=tuple(routes))


# --- TLS -------------------------------------------------------------------------------


def _upstream_tls(plan: Plan, opts: EnvoyOptions) -> UpstreamTlsContext | None:
    tls = upstream_tls(plan, "envoy", opts.ca_bundle)
    if tls is None:
        return None
    # Envoy checks the certificate against a SAN only when told to: the server name if given,
    # else the upstream host (DNS name or IP address).
    return UpstreamTlsContext(ca=tls.ca, sni=tls.server_name, san_dns=tls.server_name,
                       san_ip=tls.host if tls.host_is_ip and not tls.server_name else "",
                       client_cert=tls.client_cert, client_key=tls.client_key)


def _ip(what: str, text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise GenerateError(f"envoy generator: {what} {text!r} must be an IP address") from None


def _removed_headers() -> tuple[str, ...]:
    spoofable = {h.lower() for h in SPOOFABLE_HEADERS}
    internal = {"authorization", UPSTREAM_HEADER, DECISION_HEADER.lower(), REASON_HEADER.lower()}
    return tuple(sorted(spoofable | internal))


def keys_file(options: GenerateOptions, opts: EnvoyOptions) -> str:
    """Where the key-hash file is at run time (Lua opens it by absolute path): the config
    directory, i.e. ``config_dir`` if given, else the output directory; never ``runtime_dir``."""
    directory = config_dir("envoy", opts.config_dir, options.output_dir)
    if not directory:
        raise GenerateError("envoy generator: no config directory: set config_dir (the absolute "
                            f"directory {PRINCIPALS} will be in at run time) or the output directory")
    return str(PurePosixPath(directory) / PRINCIPALS)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _balance(plan: Plan) -> Balance | None:
    up = plan.upstream
    if not up.replicas:
        return None
    return Balance(lb_policy="LEAST_REQUEST" if up.balance == "least_conn" else "ROUND_ROBIN",
                   max_fails=up.health.max_fails, eject_s=up.health.eject_s, retries=len(up.replicas))


# --- entry point -----------------------------------------------------------------------


def build_model(plan: Plan, options: GenerateOptions) -> EnvoyModel:
    opts = EnvoyOptions.parse(options.extra)
    why = jwt_refusal(plan, "envoy") or cert_refusal(plan, "envoy")
    if why:
        raise GenerateError(f"envoy generator: {why}")
    for p in plan.principals:
        _check_name("principal", p.name)
        _check_name("role", p.role)
    reg = _EnvoyRegistry(plan.principals, shared=plan.shared, zones=plan.zones, own=plan.own_zones)
    routes = _routes(reg, plan)
    grpc = _grpc(reg, plan)
    if not all(0 < port < 65536 for port in (plan.listen.port, *(p for _, p in plan.upstream.servers))):
        raise GenerateError("envoy generator: ports must be in 1..65535")
    tls = plan.listen.tls
    listen_tls = (tls.cert, tls.key) if tls else None
    return EnvoyModel(
        stamp=Stamp.of(plan),
        listen_address=_ip("listen address", plan.listen.address),
        listen_port=plan.listen.port, listen_tls=listen_tls,
        listen_client_ca=(tls.client_ca or "") if tls else "",
        listen_verify_depth=tls.verify_depth + 1 if tls else 0,   # max_verify_depth counts the trust anchor
        upstream_endpoints=plan.upstream.servers,
        upstream_ip=all(_is_ip(host) for host, _ in plan.upstream.servers),
        balance=_balance(plan), upstream_tls=_upstream_tls(plan, opts),
        host_header=host_header(plan, "envoy"),
        trusted_proxies=tuple(sorted({cidr(c) for c in plan.trusted_proxies},
                                     key=lambda c: (c.address, c.prefix_len))),
        access_log=options.access_log, keys_file=keys_file(options, opts), admin=opts.admin,
        routes=routes,
        lua_groups=tuple(reg.lua.values()),
        rate_filters=tuple(reg.rate.values()),
        clusters=(ClusterView(BASE_CLUSTER), *((ClusterView(GRPC_CLUSTER, grpc=True),) if grpc else ()),
                  *sorted(reg.clusters.values(), key=lambda c: c.name)),
        kept_headers=tuple(sorted({h.lower() for h in FORWARDED_HEADERS} | ENVOY_KEPT)),
        websocket_headers=tuple(sorted(h.lower() for h in (*WEBSOCKET_HEADERS, "Upgrade", "Connection"))),
        request_headers_to_remove=_removed_headers(),
        principals=tuple(sorted(plan.principals, key=lambda p: p.name)),
        salts=salts(plan, "envoy"),
        certs=tuple(sorted(plan.certs, key=lambda c: c.name)),
        upstream_key_file=plan.upstream.api_key_file or "",
        owner_file=plan.body.responses_secret_file or "" if plan.body.owned else "",
        grpc=grpc, token_filters=tuple(reg.tokens.values()),
        programs=tuple(reg.programs.document().programs.items()),
        workers=opts.workers, jwt_providers=tuple(reg.jwt.values()), ca_bundle=opts.ca_bundle,
        shared=_shared_limiter(plan),
    )
