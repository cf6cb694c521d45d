"""Plan -> the data the NGINX templates print. All decisions about NGINX live here.

How a request is decided (checks in this order, each answered by the proxy with
``X-Perimeter-Decision: deny`` and an ``X-Perimeter-Reason``):

1. location match on NGINX's normalised path (``$uri``: percent-decoded, dot
   segments resolved, slashes merged). Exact routes are ``location = /path``;
   templates are anchored, case-sensitive regex locations built from
   :attr:`Decision.regex` (parameters match ``[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255}``),
   ending in PCRE's ``\\z``: ``$`` would also match before a final newline, and
   ``/v1/responses/abc%0A`` would reach vLLM as ``GET /v1/responses/abc<LF> HTTP/1.1``.
   Anything else: ``location /`` -> 404. A ``Content-Length`` over the location's
   ``client_max_body_size`` is refused with 413 by NGINX before any of the checks below.
2. rewrite phase, with ``if`` + ``return`` (so it runs before ``limit_req``):
   network (``geo`` on the client address) -> 403; method, compared case-sensitively
   and exactly (HEAD only when the plan lists it) -> 405; bearer key missing or
   unknown -> 401; role -> 403. Each check's reason is ``set`` just before its ``if``
   (an ``if`` in a location holds nothing but ``return`` or ``rewrite ... last``, the
   only directives that are safe there) and cleared once all checks passed.
3. ``limit_req`` / ``limit_conn`` keyed by principal (by client address on
   ``auth: none`` routes) -> 429.
4. body: read into memory (``client_body_buffer_size`` = ``client_max_body_size``,
   over -> 413, chunked too); JSON caps and forbidden fields checked (400), see
   ``templates/nginx-perimeter.js``. Bodies the native fast path cannot clear go to
   njs by ``rewrite ... last`` to the internal ``location = /@perimeter/body``; on a route
   where every body is parsed (``BodyCheck.parse_all``) the route's own location runs the
   exact check at once (``js_content perimeter.direct``: one njs VM, no named location).
5. proxy to vLLM with the *normalised* path: ``proxy_pass http://vllm_upstream/exact/path;``
   (a URI in ``proxy_pass``) at an exact route's own location; everywhere else (templates,
   named and internal locations) ``rewrite ^ <path> break;`` then ``proxy_pass
   http://vllm_upstream;``, which sends the rewritten URI (percent-escaped by NGINX) and the
   query. ``<path>`` is the route itself for exact routes; for templates it is
   ``$perimeter_fwd``, captured by matching ``$perimeter_path`` (``$uri`` saved at the public
   location) against the route's regex again in that same location (no match: 500, which
   cannot happen), so no value outside the template's characters can reach the request line.
   Query strings are forwarded as received (vLLM reads some, e.g.
   ``GET /v1/responses/{id}?stream=true``).

Key hashing: NGINX extracts the token (``map`` on ``$http_authorization``); only when
there is one does njs compute its sha256 (``js_set``, once per request, shared VM
with the body check); a ``map`` from hash to name and role is kept in the 0600 file.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from scanner import patterns
from scanner.errors import GenerateError
from scanner.generate.common import (
    NginxOptions,
    Stamp,
    config_dir,
    host_header,
    safe_name,
    salts,
    timeout_ms,
    upstream_tls,
    version_tuple,
)
from scanner.generate.envoy_model import JsonValue, lua_program
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx_regex import (
    NUMBER_LENIENT,
    UNSAFE_ENCODING,
    UTF8_INVALID,
    brackets_at_most,
    unsafe_body,
)
from scanner.limiter.config import HEARTBEAT_S
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
    WEBSOCKET_HEADERS,
    Decision,
    Plan,
)
from scanner.plan.program import Programs, compile_decision, inspects
from scanner.plan.zones import ConcurrencyZone, RateZone, TokenZone, Zone, conc_of, rate_of, tokens_of
from scanner.policy import media as policy_media
from scanner.policy.media import MEDIA_KEYS, MediaRules
from scanner.policy.model import FieldRules, Limits
from scanner.rules import (
    ANSWER_LINE_MAX,
    ANSWER_MAX,
    BODY_DEPTH,
    AskUsage,
    BudgetStep,
    Keys,
    Owned,
    PinStep,
    Program,
    Salt,
)

UPSTREAM = "vllm_upstream"
MAIN = "nginx.conf"
HTTP = "perimeter-http.conf"
PRINCIPALS = "perimeter-principals.conf"
PROXY = "perimeter-proxy.conf"
NJS = "perimeter.js"
RULES = "perimeter-rules.json"       # the rule programs: njs's preloaded object (rules_json)
IDENTITY = "perimeter-identity.json"  # who a certificate or a token's audience names (identity_json)
UPSTREAM_KEY = "perimeter-upstream-key.conf"     # 0600, only with upstream.api_key_file
LUA = "perimeter.lua"                # the Lua runtime's module (option lua_module): LuaRuntime
# Debian's libnginx-mod-http-ndk and libnginx-mod-http-lua, loaded in this order (after njs's)
LUA_MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")
# The steps the shared Lua interpreter (templates/perimeter_program.lua.j2) runs inside NGINX; a
# program with another (owned, ask_usage) stays njs's
LUA_STEPS = frozenset({"cap", "keys", "count", "values", "media", "budget", "salt", "pin", "envelope"})
LUA_KEY_CACHE = 4096                 # bearer -> sha256 entries per worker (Envoy's CACHE_MAX)
BODY_LOCATION = "/@perimeter/body"   # internal: njs checks the bodies the native fast path did not clear
# A media key in any spelling: on a parse_all route, a body it does not match skips njs's walk for
# media items ($perimeter_media_key 0).
MEDIA_KEY_REGEX = unsafe_body({}, MEDIA_KEYS)
# The most levels njs's JSON.parse reads (njs_json.c NJS_JSON_MAX_DEPTH 32: it throws at 32; measured on
# njs 0.7.9 and 0.9.9, ../shared/notes/proxy-facts.md): a body it parsed is nested no deeper, so with
# BODY_DEPTH at least this njs never counts a parsed body's nesting (tests/differential's depth cases
# through both builds hold the fact: a JSON.parse reading deeper would admit what the reference refuses).
NJS_JSON_DEPTH = 31
# at most BODY_DEPTH brackets: $perimeter_plain is 1 for a body UTF8_INVALID finds nothing in and this matches
SHALLOW_REGEX = brackets_at_most(BODY_DEPTH)
FORWARD = "perimeter_fwd"            # the named capture a template's proxying location forwards
INCLUDED = {"http": HTTP, "principals": PRINCIPALS, "proxy": PROXY, "njs": NJS, "rules": RULES,
            "identity": IDENTITY, "upstream_key": UPSTREAM_KEY, "lua": LUA}
DEFAULT_BODY_BYTES = 1048576       # allowed routes without a body_bytes limit (NGINX's default)
DENY_BODY_BYTES = 65536            # bodies sent to denied paths
EVERYWHERE = frozenset({"0.0.0.0/0", "::/0"})
# Characters a route may contain to be written into the config (vLLM's routes do).
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_.:~/{}-]*$")
_SAFE_FILE = re.compile(r'^[^\x00-\x1f"$\\;{}]+$')
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

# (status, reason when none was set, decision header value)
DENY_PAGES: tuple[tuple[int, str, str], ...] = (
    (400, "bad-request", "deny"), (401, "unauthenticated", "deny"), (403, "forbidden", "deny"),
    (404, "not-allowlisted", "deny"), (405, "method-not-allowed", "deny"),
    (413, "body-too-large", "deny"), (415, "grpc", "deny"), (429, "", "deny"),
    (500, "proxy-error", "error"), (502, "upstream-unavailable", "error"),
    (503, "upstream-unavailable", "error"), (504, "upstream-timeout", "error"),
)

# njs's WebCrypto parameters of each algorithm it verifies (plan.jwt.NJS_ALGORITHMS): [importKey's,
# verify's]; perimeter_identity.token.algs.
WEBCRYPTO: Mapping[str, tuple[Mapping[str, object], Mapping[str, object]]] = {
    "RS256": ({"name": "RSASSA-PKCS1-v1_5", "hash": "SHA-256"}, {"name": "RSASSA-PKCS1-v1_5"}),
    "PS256": ({"name": "RSA-PSS", "hash": "SHA-256"}, {"name": "RSA-PSS", "saltLength": 32}),
    "ES256": ({"name": "ECDSA", "namedCurve": "P-256"}, {"name": "ECDSA", "hash": "SHA-256"}),
}

# Upstream answers replaced by the perimeter's own JSON error (@perimeter_upstream_error, the
# status kept); 502 and 504 go to the upstream-unavailable / upstream-timeout pages.
UPSTREAM_ERROR_CODES: tuple[int, ...] = (500, 501, 503, 505, 506, 507, 508, 510, 511)


@dataclass(frozen=True)
class NginxZoneView:
    """A plan zone (scanner.plan.zones) as NGINX declares it: a ``limit_req_zone`` (rate), a
    ``limit_conn_zone`` (concurrency) or an njs token dict entry (tokens). Its values are the
    zone's, rendered here; only the NGINX name, the key it counts by and the note are NGINX's."""

    name: str
    key: str            # NGINX variable the zone counts by (token zones: njs's key kind)
    zone: Zone          # the plan's zone (a proxy's share of it under on_unavailable: local)
    note: str = ""

    @property
    def rate(self) -> str:
        """A rate zone's ``limit_req_zone`` rate ("10r/s", "30r/m"); "" other kinds."""
        return _rate(self.zone.rps) if isinstance(self.zone, RateZone) else ""

    @property
    def burst(self) -> int:
        """A rate zone's ``burst``, a token zone's bucket capacity; 0 a concurrency zone."""
        return 0 if isinstance(self.zone, ConcurrencyZone) else self.zone.burst

    @property
    def limit(self) -> int:
        """A concurrency zone's requests in flight; 0 other kinds."""
        return self.zone.limit if isinstance(self.zone, ConcurrencyZone) else 0

    @property
    def tokens(self) -> int:
        """A token zone's tokens per minute; 0 other kinds."""
        return self.zone.per_minute if isinstance(self.zone, TokenZone) else 0


@dataclass(frozen=True)
class BodyCheck:
    id: str
    program: str        # the id of the check's rule program (NginxModel.programs; scanner/plan/program.py),
                        # which njs runs on every body the native fast path does not clear
    regex: str          # the native fast path (see nginx_regex.unsafe_body)
    parse_all: bool = False   # njs parses every body: an absent budget, or fields the rules do
                              # not name, have no native fast path
    salt: str = ""      # "principal" / "principal-cert" (a certificate principal's) / "audience:NAME":
                        # whose salt ($perimeter_salt, from the 0600 principals file) the program's
                        # salt step writes as cache_salt
    media_regex: str = ""   # a media key in any spelling (MEDIA_KEY_REGEX): on a parse_all route,
                            # a body it does not match skips njs's walk ($perimeter_media_key 0)
    tokens: str = ""    # the token zone njs charges (chargeTokens): its name ("t1"), the key of its
                        # bucket's numbers in perimeter-rules.json (rules_json "tokens")


@dataclass(frozen=True)
class BlockWeakening:
    """A mutation operator's switches on one block (scanner/mutate/nginx.py). The generator sets
    none: every switch off is the plan's config."""

    method_unchecked: bool = False      # no ``if`` on the request method (nor the dispatch on it)
    rate_dry_run: bool = False          # limit_req_dry_run on: NGINX only logs what it would refuse
    conn_dry_run: bool = False          # limit_conn_dry_run on
    principal_from_client: bool = False  # the principal header forwarded as the client sent it
    upgrade: bool = False               # Upgrade and Connection "upgrade" passed on (a plain route)
    raw_target: bool = False            # proxy_pass without a URI or rewrite: the raw request target
    checked_errors_passed: bool = False  # <up>_checked: vLLM's 5xx bodies reach the client
    checked_timeout: str = ""           # <up>_checked: this upstream timeout, not the block's


@dataclass(frozen=True)
class Weakening:
    """A mutation operator's switches on the whole config (scanner/mutate/nginx.py). The generator
    sets none: every switch off is the plan's config."""

    rate_dry_run: bool = False          # limit_req_dry_run on for the server
    xff_from_anyone: bool = False       # the client address from X-Forwarded-For, whoever sends it
    host_from_client: bool = False      # the client's Host forwarded upstream
    xff_appended: bool = False          # X-Forwarded-For: the client's own with its address appended
    request_id_from_client: bool = False  # X-Request-Id: the client's, not NGINX's own $request_id
    h2c: bool = False                   # the plain listener also speaks HTTP/2 (prior knowledge)
    grpc_accepted: bool = False         # no application/grpc refusal
    catch_all_proxied: bool = False     # location / proxies instead of answering 404
    exposed: tuple[str, ...] = ()       # matches of proxying locations added after location /
    tls_legacy: bool = False            # TLS 1.0 / 1.1 and every cipher suite on the listener
    cert_any_ca: bool = False           # client certificates from any CA, the verification unread
    tokens_uncharged: bool = False      # njs charges no token budget ($perimeter_tokens empty)
    unsettled: bool = False             # no settlement body filter (js_body_filter perimeter.settle)
    any_key: tuple[str, str] | None = None   # (principal, role) an unknown key is taken for
    # the bearer key's digest (njs keyHash; the Lua runtime's M.key_hash)
    key_digest_accepted: bool = False   # a bearer of 64 hex digits taken as its own sha256 (pass-the-hash)
    key_prefix: int = 0                 # only the bearer's first N characters hashed (0: all of it)
    client_headers: bool = False        # proxy_pass_request_headers on: every client header passed
    upstream_key_dropped: bool = False  # vLLM's own key not sent upstream
    from_client: tuple[str, ...] = ()   # headers forwarded as the client sent them
    # the njs module (templates/nginx-perimeter.js): a bearer token's checks, a certificate's name,
    # the response seal
    jwt_signature_unchecked: bool = False   # the signature's verdict ignored
    jwt_audience_unchecked: bool = False
    jwt_expiry_unchecked: bool = False
    jwt_issuer_unchecked: bool = False
    jwt_issuer_prefix: bool = False         # the issuer compared as a prefix of an allowed one
    jwt_duplicates_read: bool = False       # a member named twice read (its last copy), not refused
    jwt_crit_ignored: bool = False
    jwt_trailing_accepted: bool = False     # trailing '.' / '=' stripped before the form is checked
    jwt_unprefixed: bool = False            # a token principal without its "jwt:ID:" kind
    cert_anyone: str = ""                   # an unknown certificate names "anyone" with this role
    cert_subject_fallback: bool = False     # a URI SAN naming nobody falls back to the subject
    owner_unbound: bool = False             # response seals not bound to the principal
    slots_kept: bool = False                # the limiter's slots never released after the answer
    failover_at_once: bool = False          # this proxy's share decides at the limiter's first
                                            # "store unavailable", not once it says "local"


@dataclass(frozen=True)
class Block:
    """One set of checks and one way to proxy: the body of a location."""

    methods: tuple[str, ...]
    method_test: str            # an ``if`` condition that is true for a wrong method
    net: str | None             # geo variable; None: any address
    auth: str                   # "key" | "none"
    roleset: str | None         # map variable; None: any principal
    rate_zone: str | None
    burst: int
    conn_zone: str | None
    conn: int
    body_bytes: int
    timeout: str | None         # "600s" / "1500ms"
    check: BodyCheck | None
    websocket: bool
    up: str                     # the named proxying location (inspected blocks)
    rewrite: bool               # also emit ``<up>_rewrite`` (fields stripped, a budget injected)
    # auth "jwt": the audience's token rules (JwtAudience.id); njs verifies the token here, then
    # redirects to ``jwt_next``, the named location holding the rest of the block
    jwt: str = ""
    jwt_roles: str = ""         # the id of the roles admitted (perimeter-identity.json "roles"; "" any)
    jwt_next: str = ""
    # responses: owned (scanner/plan/owner.py): the path segment (index after splitting on "/")
    # holding a sealed response id (0: none; njs ownedPath unseals it), and whether answers are
    # sealed (njs settleHeaders / settle)
    owner_param: int = 0
    owner_seal: bool = False
    # the fleet's limiter (policy shared:): "p ZONE ..." / "a ZONE ...", the key (the principal or
    # the client address) then the route's zones in the limiter's order; "" none
    shared: str = ""
    shared_up: str = ""         # a route without a body check: the named location proxying it
    # the route holds something to give back once answered (a concurrency slot, a token
    # reservation): post_action releases and settles; a route with only a rate zone has none
    shared_after: bool = False
    # on_unavailable: local: the named location holding this proxy's share of the route's limits
    # (the plan's, Plan.own_zones: Plan.shared.local), where njs sends a request the limiter cannot decide
    local_up: str = ""
    local_rate_zone: str = ""
    local_burst: int = 0
    local_conn_zone: str = ""
    local_conn: int = 0
    local_tokens: str = ""      # the share's token zone (BodyCheck.tokens' form); "" none
    weak: BlockWeakening = BlockWeakening()   # a mutation operator's switches (none set here)
    # the Lua runtime (NginxModel.lua) runs this block's body check (content_by_lua, perimeter.lua
    # M.body) in place of njs's perimeter.direct; lua_note: which runtime checks it and why, for the
    # generated conf ("" without the Lua runtime): decided by lua_refusal, in one place
    lua: bool = False
    lua_note: str = ""


@dataclass(frozen=True)
class JwtAudience:
    """An ``auth: jwt`` audience as njs reads it (perimeter-identity.json "jwt"): its rules (a JSON
    object) and its keys (the token's kid -> its algorithms and SPKI base64; SPKI imports on njs 0.7
    and 0.9)."""

    id: str
    audience: str
    config: str
    keys: tuple[tuple[str, tuple[str, ...], str], ...]


@dataclass(frozen=True)
class Location:
    match: str                  # '= /v1/models' or '~ "^...\\z"'
    route: str                  # the plan's path template
    exact: bool
    target: str                 # proxy_pass argument at an exact route's own location
    blocks: tuple[Block, ...]
    internal: tuple[str, ...]   # with several blocks: the internal location of each
    capture: str = ""           # templates: the route's regex capturing $perimeter_fwd


@dataclass(frozen=True)
class LuaRuntime:
    """The Lua runtime (option ``lua_module``: Debian's libnginx-mod-http-lua, OpenResty style,
    LuaJIT): ``perimeter.lua`` (templates/nginx-perimeter.lua.j2), loaded once per worker, hashes
    the bearer key (set_by_lua, cached per bearer in the worker, bounded) and runs the body checks
    lua_refusal gives it with Envoy's interpreter (templates/perimeter_program.lua.j2): one
    interpreter for two proxies. njs stays loaded for everything else."""

    modules: tuple[str, ...]    # load_module paths (LUA_MODULES under the option's directory)
    package_dir: str            # where perimeter.lua is (lua_package_path): the config directory
    key_cache: int = LUA_KEY_CACHE


@dataclass(frozen=True)
class NginxModel:
    stamp: Stamp
    runtime_dir: str
    access_log: str
    error_log: str
    njs_module: str
    user: str
    worker_processes: str
    upstream_keepalive: int
    includes: Mapping[str, str]
    listen: str
    tls_cert: str
    tls_key: str
    # mTLS (auth "cert"): the CA bundle a presented client certificate is verified against
    # (ssl_verify_client optional) and the chain depth; "" none
    tls_client_ca: str
    tls_verify_depth: int
    upstream_servers: tuple[str, ...]  # `server` lines' arguments, one per replica
    upstream_balance: str              # "" (one server, or NGINX's round robin) or "least_conn"
    upstream_scheme: str
    upstream_tls: Mapping[str, str]
    host_header: str                   # the Host vLLM receives (the plan's), never the client's
    trusted_proxies: tuple[str, ...]
    principals: tuple[tuple[str, str, str], ...]   # (sha256, name, role)
    salts: tuple[tuple[str, str], ...]             # (subject, salt): 0600 principals file only
    # auth "cert": {"san:URI" | "subject:DN": [name, role]} as JSON, for njs (principals file); "" none
    certs_json: str
    cert_rolesets: Mapping[str, tuple[str, ...]]   # like rolesets, over $perimeter_cert_role
    geos: Mapping[str, tuple[str, ...]]
    rolesets: Mapping[str, tuple[str, ...]]
    rate_zones: tuple[NginxZoneView, ...]
    conn_zones: tuple[NginxZoneView, ...]
    checks: tuple[BodyCheck, ...]
    programs: Mapping[str, Program]       # the checks' rule programs by id (perimeter-rules.json)
    token_zones: tuple[NginxZoneView, ...]     # limits.tokens_per_minute: njs, one shared dict
    locations: tuple[Location, ...]
    upstream_key_file: str                           # the policy's file of vLLM's key ("" none)
    owner_secret_file: str                           # responses: owned: njs reads the secret ("" none)
    forwarded_headers: tuple[tuple[str, str], ...]   # (name, NGINX variable) passed from the client
    websocket_headers: tuple[tuple[str, str], ...]
    deny_pages: tuple[tuple[int, str, str], ...] = DENY_PAGES
    upstream_error_codes: tuple[int, ...] = UPSTREAM_ERROR_CODES
    decision_header: str = DECISION_HEADER
    reason_header: str = REASON_HEADER
    principal_header: str = PRINCIPAL_HEADER
    deny_body_bytes: int = DENY_BODY_BYTES
    unsafe_encoding: str = UNSAFE_ENCODING
    media_key_regex: str = MEDIA_KEY_REGEX
    utf8_invalid: str = UTF8_INVALID
    shallow_regex: str = SHALLOW_REGEX
    number_lenient: str = NUMBER_LENIENT
    upstream: str = UPSTREAM
    body_location: str = BODY_LOCATION
    forward: str = FORWARD
    notes: tuple[str, ...] = field(default_factory=tuple)
    jwt: tuple[JwtAudience, ...] = ()   # auth "jwt" audiences: njs verifies their tokens
    jwt_roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # Block.jwt_roles ids
    jwt_principal_max: int = plan_jwt.PRINCIPAL_MAX   # the longest token principal (jwt:ID:CLAIM)
    limiter: str = ""           # the fleet's limiter's HTTP door (policy shared:); "" none
    fetch_keepalive: bool = False   # njs >= 0.9: js_fetch_keepalive
    # njs >= 0.8.1 with the limiter: this NGINX says it is alive this often (js_periodic
    # perimeter.heartbeat), so its slots are renewed while it lives (0: none)
    heartbeat_ms: int = 0
    lua: LuaRuntime | None = None   # the Lua runtime (option lua_module); None: njs only
    weak: Weakening = Weakening()   # a mutation operator's switches (none set here)

    def shared_ids(self) -> dict[str, str]:
        """Each limiter spec a block holds (Block.shared) -> its id ("s1"), which the block sets in
        $perimeter_shared and perimeter-rules.json's "shared" maps to the zones (rules_json)."""
        out: dict[str, str] = {}
        for loc in self.locations:
            for b in loc.blocks:
                if b.shared and b.shared not in out:
                    out[b.shared] = f"s{len(out) + 1}"
        return out


# --- validation helpers ------------------------------------------------------------------

def _path(route: str) -> str:
    if not _SAFE_PATH.match(route) or "//" in route:
        raise GenerateError(f"nginx generator: route {route!r} has characters this generator "
                            "will not write into a config (allowed: letters, digits, _ . : ~ - /)")
    return route


def _name(kind: str, value: str) -> str:
    return safe_name("nginx", kind, value)


def _file(kind: str, value: str) -> str:
    if not _SAFE_FILE.match(value):
        raise GenerateError(f"nginx generator: {kind} path {value!r} contains characters "
                            "that cannot be written safely (quotes, '$', '\\', ';', braces)")
    return value


def _hostport(host: str, port: int) -> str:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not re.match(r"^[A-Za-z0-9.-]+$", host):
            raise GenerateError(f"nginx generator: {host!r} is not an address or host name") from None
        return f"{host}:{port}"
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _rate(rps: float) -> str:
    if rps >= 1 and float(rps).is_integer():
        return f"{int(rps)}r/s"
    return f"{max(1, round(rps * 60))}r/m"


def enforced_rps(rps: float) -> float:
    """The rate a ``limit_req_zone`` written for ``rps`` enforces (``_rate``: r/s, or r/m rounded)."""
    text = _rate(rps)
    n = int(text[:-3])
    return float(n) if text.endswith("r/s") else n / 60


def _duration(seconds: float) -> str:
    ms = timeout_ms(seconds)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _method_test(methods: tuple[str, ...]) -> str:
    for m in methods:
        if not re.match(r"^[A-Z]+$", m):
            raise GenerateError(f"nginx generator: method {m!r} cannot be allowlisted")
    if len(methods) == 1:
        return f"$request_method != {methods[0]}"
    return f"$request_method !~ ^(?:{'|'.join(methods)})$"


# --- the model -------------------------------------------------------------------------

@dataclass
class _NginxRegistry:
    """Deterministic ids for shared objects (geo sets, role sets, zones, checks)."""

    geos: dict[tuple[str, ...], str] = field(default_factory=dict)
    rolesets: dict[tuple[str, ...], str] = field(default_factory=dict)
    cert_rolesets: dict[tuple[str, ...], str] = field(default_factory=dict)
    # by the plan's zone (a proxy's share of it under on_unavailable: local is another zone)
    rate: dict[RateZone, NginxZoneView] = field(default_factory=dict)
    conn: dict[ConcurrencyZone, NginxZoneView] = field(default_factory=dict)
    tokens: dict[TokenZone, NginxZoneView] = field(default_factory=dict)
    jwt: dict[str, JwtAudience] = field(default_factory=dict)  # by audience
    jwt_roles: dict[tuple[str, ...], str] = field(default_factory=dict)   # roles admitted -> id
    checks: dict[tuple[str, str, str], BodyCheck] = field(default_factory=dict)   # by (program, salt, tokens)
    programs: Programs = field(default_factory=Programs)
    compiled: dict[str, Program] = field(default_factory=dict)     # programs by id

    def geo(self, cidrs: tuple[str, ...]) -> str | None:
        if set(cidrs) >= EVERYWHERE:
            return None
        key = tuple(sorted(str(ipaddress.ip_network(c, strict=False)) for c in cidrs))
        return self.geos.setdefault(key, f"$perimeter_net_{len(self.geos) + 1}")

    def jwt_audience(self, d: Decision) -> str:
        """The njs token rules of an auth "jwt" route's audience ("" other routes)."""
        t = d.jwt
        if t is None:
            return ""
        if d.audience not in self.jwt:
            algs = verified(d, "nginx")
            config = {"iss": list(t.issuers), "aud": list(t.audiences), "algs": list(algs),
                      "skew": t.clock_skew_s, "req": [[k, list(v)] for k, v in t.required_claims.items()],
                      "sub": t.principal_claim, "rc": t.role_claim, "roles": dict(t.roles), "role": t.role,
                      "max": t.max_token_bytes, "pfx": list(plan_jwt.prefixes(t))}
            text = json.dumps(config, sort_keys=True, separators=(",", ":"))
            keys = tuple((k.kid, tuple(a for a in k.algorithms if a in algs), k.spki)
                         for k in t.keys if any(a in algs for a in k.algorithms))
            if len(keys) == 1:   # a token without a kid is verified with the only key
                keys = (("", *keys[0][1:]), *keys)
            self.jwt[d.audience] = JwtAudience(str(len(self.jwt) + 1), _name("audience", d.audience),
                                               text, keys)
        return self.jwt[d.audience].id

    def jwt_roleset(self, d: Decision) -> str:
        """The id of the roles an auth "jwt" route admits ("" other routes, or any role)."""
        if d.jwt is None or not d.roles:
            return ""
        key = tuple(_name("role", r) for r in d.roles)
        return self.jwt_roles.setdefault(key, str(len(self.jwt_roles) + 1))

    def roleset(self, roles: tuple[str, ...]) -> str | None:
        if not roles:
            return None
        key = tuple(sorted(_name("role", r) for r in roles))
        return self.rolesets.setdefault(key, f"$perimeter_roles_{len(self.rolesets) + 1}")

    def cert_roleset(self, roles: tuple[str, ...]) -> str | None:
        """The map variable admitting a certificate principal's role ($perimeter_cert_role)."""
        if not roles:
            return None
        key = tuple(sorted(_name("role", r) for r in roles))
        return self.cert_rolesets.setdefault(key, f"$perimeter_cert_roles_{len(self.cert_rolesets) + 1}")

    def rate_zone(self, d: Decision, zone: RateZone | None) -> NginxZoneView | None:
        """The ``limit_req_zone`` of ``zone``, ``d``'s rate zone (None: none)."""
        if zone is None:
            return None
        if zone not in self.rate:
            self.rate[zone] = NginxZoneView(
                name=f"perimeter_rate_{len(self.rate) + 1}", key=_zone_key(d.auth), zone=zone,
                note=f"audience {d.audience}, per {'principal' if d.auth != 'none' else 'address'}")
        return self.rate[zone]

    def conn_zone(self, d: Decision, zone: ConcurrencyZone | None) -> NginxZoneView | None:
        """The ``limit_conn_zone`` of ``zone``, ``d``'s concurrency zone (None: none)."""
        if zone is None:
            return None
        if zone not in self.conn:
            self.conn[zone] = NginxZoneView(
                name=f"perimeter_conn_{len(self.conn) + 1}", key=_zone_key(d.auth), zone=zone,
                note=f"audience {d.audience}, per {'principal' if d.auth != 'none' else 'address'}")
        return self.conn[zone]

    def token_zone(self, d: Decision, zone: TokenZone | None) -> str:
        """njs's name of ``zone``, ``d``'s token budget ("" none), see BodyCheck.tokens."""
        if zone is None:
            return ""
        if zone not in self.tokens:
            who = {"key": "principal", "jwt": "token", "cert": "cert"}.get(d.auth, "address")
            self.tokens[zone] = NginxZoneView(name=f"t{len(self.tokens) + 1}", key=who, zone=zone,
                                              note=f"audience {d.audience}, per {who}")
        return self.tokens[zone].name

    def check(self, d: Decision, rules: FieldRules, salt: str, media: MediaRules, tokens: str,
              owner: tuple[str, ...]) -> BodyCheck:
        """The body check of a block whose inspected decision is ``d``: its rule program (shared by
        every check with the same rules) and what NGINX decides natively around it."""
        compiled = compile_decision(d)
        program = self.programs.add(compiled)
        self.compiled[program] = compiled
        key = (program, salt, tokens)
        if key not in self.checks:
            named = tuple(sorted({*rules.names("reject"), *rules.names("strip"), *rules.counts,
                                  *(MEDIA_KEYS if media.active else ()), *owner}))
            caps = d.cap_paths
            self.checks[key] = BodyCheck(
                id=f"c{len(self.checks) + 1}", program=program,
                # the regex sees a name wherever it is (a nested copy too): the top-level names
                regex=unsafe_body({k: v for k, v in caps if "." not in k}, named),
                parse_all=(d.enforced_budget is not None or bool(salt) or bool(tokens) or d.envelope_capped
                           or bool(d.token_zone)
                           or bool(rules.pins) or (rules.decided and rules.unknown != "pass")),
                salt=salt, tokens=tokens, media_regex=MEDIA_KEY_REGEX if media.active else "")
        return self.checks[key]


def writes(program: Program) -> bool:
    """Does ``program`` change a body it admits (a field stripped, a budget written, a salt, a pin,
    an unsealed id, a stream asking for its usage): the block's ``<up>_rewrite`` forwards those."""
    for s in program.steps:
        if isinstance(s, Keys) and (s.unknown == "strip" or "strip" in s.modes.values()):
            return True
        if isinstance(s, Salt | PinStep | Owned | AskUsage):
            return True
        if isinstance(s, BudgetStep) and s.absent == "inject":
            return True
    return False


def _compact(value: object) -> str:
    """JSON as the preloaded files hold it: sorted keys, no spaces (deterministic)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def identity_json(model: NginxModel) -> str:
    """``perimeter-identity.json``: the certificate principals (``certs``: ``san:URI`` /
    ``subject:DN`` -> [name, role]) and each ``auth: jwt`` audience's rules (``jwt``: its id ->
    the rules), which NGINX loads once at configure time (``js_preload_object
    perimeter_identity``): read by njs (perimeter.certWho, perimeter.jwt), never parsed per
    request. An audience's keys are its public keys (kid -> [algorithms, SPKI base64]); ``roles``:
    the roles an auth "jwt" route admits by id (Block.jwt_roles). No secret (names, roles, issuers,
    public keys): the key hashes stay in the 0600 principals file."""
    certs = json.loads(model.certs_json) if model.certs_json else {}
    jwt = {a.id: {**json.loads(a.config), "keys": {kid: [list(algs), spki] for kid, algs, spki in a.keys}}
           for a in model.jwt}
    roles = {i: list(r) for i, r in model.jwt_roles.items()}
    # a token's form (scanner/plan/credential.py): its nesting (within njs JSON.parse's own 32) and
    # times at most, and each algorithm's WebCrypto parameters
    token = {"algs": {a: WEBCRYPTO[a] for a in plan_jwt.NJS_ALGORITHMS}, "depth": credential.MAX_DEPTH,
             "time_max": credential.TIME_MAX}
    return (f'{{\n "certs": {_compact(certs)},\n "jwt": {_compact(jwt)},\n "roles": {_compact(roles)},\n'
            f' "token": {_compact(token)}\n}}\n')


def rules_json(model: NginxModel) -> str:
    """``perimeter-rules.json``: every body check's program id and the programs
    (scanner/plan/program.py), which NGINX loads once at configure time into one immutable object
    all njs VMs share (``js_preload_object perimeter_rules``): data compiled with the config, never
    parsed or built per request. One program a line. Beside them, what a route's variables name:
    ``tokens``, each token zone's bucket (chargeTokens: tokens per minute, capacity, counted by),
    and ``shared``, each limiter spec's key kind and zones (a fleet's: the limiter's order, and its
    concurrency zones and token zone picked out for the release and the settlement)."""
    checks = _compact({c.id: c.program for c in model.checks})
    steps = {pid: [_njs_step(s) for s in p.model_dump(mode="json")["steps"]]
             for pid, p in model.programs.items()}
    programs = ",\n".join(f"  {_compact(pid)}: {_compact(ss)}" for pid, ss in steps.items())
    depth = BODY_DEPTH      # the most nesting a body may have (bad-json:depth-over-N past it)
    parse_depth = NJS_JSON_DEPTH   # what njs's JSON.parse reads: a parsed body within depth needs no count
    tokens = {z.name: {"by": z.key, "cap": z.burst, "limit": z.tokens} for z in model.token_zones}
    shared: dict[str, object] = {}
    for spec, sid in model.shared_ids().items():
        by, *zones = spec.split(" ")
        shared[sid] = {"by": by, "zones": zones, "conc": [z for z in zones if z.startswith("conc:")],
                       "tokens": next((z for z in zones if z.startswith("tokens:")), "")}
    # settlement's tables (scanner/plan/settle.py): a bool's true texts, a stream's final event types;
    # each media key's kind, the case of media.py's _item it takes (njs mediaItem)
    media = dict(policy_media.KEY_KINDS)
    # and how much of an answer settle and seal read (scanner/rules.py ANSWER_MAX, ANSWER_LINE_MAX)
    tables = f' "answer_max": {ANSWER_MAX},\n "answer_line_max": {ANSWER_LINE_MAX},\n' \
             f' "final_types": {_compact(dict.fromkeys(settle.FINAL_TYPES, 1))},\n' \
             f' "media": {_compact(media)},\n' \
             f' "true_text": {_compact(dict.fromkeys(settle.TRUE_TEXT, 1))},\n'
    return (f'{{\n "checks": {checks},\n "depth": {depth},\n "parse_depth": {parse_depth},\n'
            f' "shared": {_compact(shared)},\n'
            f' "tokens": {_compact(tokens)},\n{tables} "programs": {{\n{programs}\n }}\n}}\n')


def lua_programs(model: NginxModel) -> tuple[dict[str, JsonValue], dict[str, JsonValue]]:
    """perimeter.lua's tables: each program as Lua runs it (envoy_model.lua_program, Envoy's form)
    by id, and each body check's program id: the same programs as perimeter-rules.json."""
    programs: dict[str, JsonValue] = {pid: lua_program(p) for pid, p in model.programs.items()}
    return programs, {c.id: c.program for c in model.checks}


def lua_refusal(b: Block, program: Program | None) -> str:
    """Why the Lua runtime does not run block ``b``'s body check, which then stays njs's; "" when it
    does. Lua takes a route whose every body is parsed (perimeter.direct's work: the program, the
    access log's fields, the refusal and the admitted body's way on), not what only njs does."""
    if b.check is None or program is None:
        return "no body check"
    if not b.check.parse_all:
        return "njs: the native fast path first, then njs's perimeter.body"
    if b.jwt:
        return "njs: auth jwt (njs verifies the token and reads the body)"
    if b.check.tokens or b.local_tokens:
        return "njs: a token budget (njs charges and settles it)"
    if b.shared or b.local_up:
        return "njs: the fleet's limiter (njs asks it)"
    other = sorted({step.op for step in program.steps} - LUA_STEPS)
    if other:
        return f"njs: the rule program's {', '.join(other)} (njs only)"
    return ""


def _on_lua(loc: Location, programs: Mapping[str, Program]) -> Location:
    """``loc`` with each block's body check given to the Lua runtime where lua_refusal allows."""
    blocks = []
    for b in loc.blocks:
        if b.check is None:
            blocks.append(b)
            continue
        why = lua_refusal(b, programs.get(b.check.program))
        blocks.append(replace(b, lua=not why, lua_note=why or "Lua: perimeter.lua runs the rule program"))
    return replace(loc, blocks=tuple(blocks))


def _lua_runtime(opts: NginxOptions, options: GenerateOptions) -> LuaRuntime:
    """The Lua runtime the options ask for; a target that cannot take it: GenerateError."""
    if not opts.njs_module:
        raise GenerateError("nginx generator: lua_module needs a build that loads dynamic modules "
                            "(njs_module given, e.g. Debian's NGINX); njs built in (the static pip "
                            "build) loads no module")
    missing = [m for m in LUA_MODULES if not Path(opts.lua_module, m).is_file()]
    if missing:
        raise GenerateError(f"nginx generator: lua_module {opts.lua_module!r} has no {', '.join(missing)} "
                            "(apt-get install libnginx-mod-http-lua libnginx-mod-http-ndk lua-resty-core)")
    where = config_dir("nginx", opts.config_dir, options.output_dir)
    if not where:
        raise GenerateError("nginx generator: lua_module needs to know where perimeter.lua will be "
                            "(lua_package_path): give config_dir=DIR or an output directory")
    return LuaRuntime(modules=tuple(_file("lua_module", str(Path(opts.lua_module, m))) for m in LUA_MODULES),
                      package_dir=_file("config_dir", where))


def _njs_step(step: dict[str, object]) -> dict[str, object]:
    """A step as njs runs it: a media step also with its domains as [name, port, the suffix a "*."
    name matches or false] (media.py host_listed's partition, done here once, not per URL)."""
    domains = step.get("domains")
    if step.get("op") != "media" or not isinstance(domains, list):
        return step
    hosts = [[name, port, name[1:] if name.startswith("*.") else False]
             for name, _, port in (str(e).partition(":") for e in domains)]
    return {**step, "hosts": hosts}


def _rules_key(rules: FieldRules) -> tuple[object, ...]:
    """A route's field rules as a comparable value (what two methods of one path must share)."""
    return (rules.unknown, tuple(sorted(rules.named.items())), tuple(sorted(rules.counts.items())),
            tuple(sorted((k, repr(v)) for k, v in rules.pins.items())))


def _passed(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(header, the NGINX variable holding the client's value) for headers passed on as sent."""
    return tuple((n, "$content_type" if n.lower() == "content-type"
                   else "$http_" + n.lower().replace("-", "_")) for n in names)


def _zone_key(auth: str) -> str:
    return {"key": "$perimeter_principal", "jwt": "$perimeter_jwt_who",
            "cert": "$perimeter_cert_principal"}.get(auth, "$binary_remote_addr")


def _profile(d: Decision) -> tuple[object, ...]:
    """What must be equal for two methods of one path to share a location."""
    lim: Limits = d.limits
    rate = (lim.rate.rps, lim.rate.burst) if lim.rate else None
    return (d.kind, d.audience, d.auth, d.roles, d.networks, lim.body_bytes,
            d.cap_paths, rate, lim.concurrency, lim.timeout_s, lim.when_absent,
            _rules_key(d.fields), d.salt, d.media, d.token_zone, lim.max_sequences, lim.max_request_tokens,
            d.envelope_spec, d.owner_param, d.owner_fields, d.owner_seal)


def _block(reg: _NginxRegistry, plan: Plan, ds: tuple[Decision, ...], up: str) -> Block:
    d = ds[0]
    methods = tuple(sorted(x.method for x in ds))
    lim = d.limits
    websocket = d.kind == "websocket"
    rules = next((x.fields for x in ds if x.fields.decided), d.fields)
    media = next((x.media for x in ds if x.media.active), d.media)
    tokens = next((reg.token_zone(x, tokens_of(plan.zones, x)) for x in ds if x.token_zone), "")
    envelope = any(x.token_zone or x.envelope_capped for x in ds)
    owner = next((x.owner_fields for x in ds if x.owner_fields), ())
    inspect = (not websocket and bool(set(BODY_METHODS) & set(methods))
               and bool(lim.json_caps or rules.decided or media.active or tokens or envelope or owner))
    shared = _shared_spec(plan, d)
    # the zones this proxy keeps itself (Plan.own_zones): the plan's without a fleet (the route's
    # own limit_req / limit_conn), the shares with one under on_unavailable: local (the named
    # location njs sends a request the limiter could not decide to), none under deny
    own = plan.own_zones
    rate_zone = reg.rate_zone(d, rate_of(own, d))
    conn_zone = reg.conn_zone(d, conc_of(own, d))
    local = bool(shared) and plan.shared is not None and plan.shared.on_unavailable == "local"
    salted = next((x for x in ds if x.salt), None)
    salt = (("principal-cert" if salted.auth == "cert" else "principal") if salted.salt == "principal"
            else f"audience:{_name('audience', salted.audience)}") if salted else ""
    # the decision whose body rules the check runs (the methods of one block share them)
    body = next((x for x in ds if inspects(x)), next((x for x in ds if x.method in BODY_METHODS), d))
    check = reg.check(body, rules, salt, media, tokens, owner) if inspect else None
    if d.auth not in ("key", "none", "jwt", "cert"):
        raise GenerateError(f"nginx generator: unknown auth {d.auth!r} for {d.method} {d.path}")
    return Block(
        methods=methods, method_test=_method_test(methods),
        net=reg.geo(d.networks),
        auth=d.auth, roleset=(reg.roleset(d.roles) if d.auth == "key" else
                              reg.cert_roleset(d.roles) if d.auth == "cert" else None),
        rate_zone=rate_zone.name if rate_zone and not shared else None,
        burst=rate_zone.burst if rate_zone and not shared else 0,
        conn_zone=conn_zone.name if conn_zone and not shared else None,
        conn=conn_zone.limit if conn_zone and not shared else 0,
        body_bytes=lim.body_bytes if lim.body_bytes is not None else DEFAULT_BODY_BYTES,
        timeout=_duration(lim.timeout_s) if lim.timeout_s else None,
        check=check,
        websocket=websocket, up=up,
        shared=shared, shared_up=f"{up}_shared" if shared and check is None else "",
        shared_after=_shared_after(plan, d),
        local_up=f"{up}_local" if local else "",
        local_rate_zone=rate_zone.name if rate_zone and local else "",
        local_burst=rate_zone.burst if rate_zone and local else 0,
        local_conn_zone=conn_zone.name if conn_zone and local else "",
        local_conn=conn_zone.limit if conn_zone and local else 0,
        local_tokens=reg.token_zone(d, tokens_of(own, d)) if local else "",
        rewrite=check is not None and writes(reg.compiled[check.program]),
        jwt=reg.jwt_audience(d), jwt_roles=reg.jwt_roleset(d),
        jwt_next=up.replace("@perimeter_up_", "@perimeter_jwt_") if d.jwt else "",
        owner_param=d.owner_segment,
        owner_seal=d.owner_seal,
    )


def _shared_spec(plan: Plan, d: Decision) -> str:
    """njs's form of the limiter's zones of ``d`` (Block.shared): "p|a ZONE ..."; "" none."""
    if plan.shared is None:
        return ""
    zones = plan.shared.route_zones(d)
    return " ".join(("a" if d.auth == "none" else "p", *zones)) if zones else ""


def _shared_after(plan: Plan, d: Decision) -> bool:
    """Does a request of ``d`` hold anything at the limiter after its answer (Block.shared_after)?"""
    if plan.shared is None:
        return False
    kinds = {plan.shared.zones[n].kind for n in plan.shared.route_zones(d)}
    return bool(kinds & {"concurrency", "tokens"})


def _limiter(plan: Plan) -> str:
    """The limiter's HTTP door for njs's ngx.fetch ("" without shared:). ngx.fetch resolves no
    names here (no resolver): the limiter must be given as an IP address."""
    s = plan.shared
    if s is None:
        return ""
    host, _port = s.limiter
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise GenerateError(f"nginx generator: shared.limiter {host!r} must be an IP address (njs's "
                            "ngx.fetch resolves no names here); give the limiter's address") from None
    return s.limiter_url


def _location(reg: _NginxRegistry, plan: Plan, index: int, route: str,
              decisions: tuple[Decision, ...], scheme: str) -> Location:
    _path(route)
    exact = patterns.is_exact(route)
    if not exact and not patterns.is_template(route):
        raise GenerateError(f"nginx generator: {route!r} is neither an exact path nor a template")
    groups: dict[tuple[object, ...], list[Decision]] = {}
    for d in decisions:
        groups.setdefault(_profile(d), []).append(d)
    ordered = sorted((tuple(sorted(g, key=lambda x: x.method)) for g in groups.values()),
                     key=lambda g: g[0].method)
    blocks = tuple(_block(reg, plan, g, f"@perimeter_up_{index}_{i}") for i, g in enumerate(ordered))
    target = f"{scheme}://{UPSTREAM}{route}" if exact else ""
    match, capture = (f"= {route}", "") if exact else _template_regexes(decisions[0].regex)
    internal = tuple(f"/@perimeter/{index}/{i}" for i in range(len(blocks))) if len(blocks) > 1 else ()
    return Location(match=match, route=route, exact=exact, target=target, blocks=blocks,
                    internal=internal, capture=capture)


def _template_regexes(regex: str) -> tuple[str, str]:
    """The location match and the forwarding capture for a template's plan regex ``^/...$``.

    PCRE's ``$`` also matches before a final newline (``/v1/responses/abc%0A`` decodes to a
    ``$uri`` ending in LF); ``\\z`` is the end of the subject only."""
    if not (regex.startswith("^/") and regex.endswith("$")) or '"' in regex or "\\z" in regex:
        raise GenerateError(f"nginx generator: template regex {regex!r} is not an anchored path regex")
    body = regex[1:-1]
    return f'~ "^{body}\\z"', f"^(?<{FORWARD}>{body})\\z"


def _certs_json(plan: Plan) -> str:
    """The certificate principals as njs reads them (``perimeter.certWho``): a JSON object from
    ``san:URI`` / ``subject:DN`` to ``[name, role]``; "" without any. Written into the 0600
    principals file inside single quotes: the policy admits no quote, backslash or '$' in a name."""
    if not plan.certs:
        return ""
    for c in plan.certs:
        _name("principal", c.name)
        _name("role", c.role)
    text = json.dumps({c.identity: [c.name, c.role] for c in sorted(plan.certs, key=lambda c: c.identity)},
                      separators=(",", ":"), sort_keys=True)
    if any(ch in text for ch in "'\\$;\n\r"):
        raise GenerateError("nginx generator: a certificate principal's name holds a character NGINX "
                            "cannot take inside quotes")
    return text


def _principals(plan: Plan) -> tuple[tuple[str, str, str], ...]:
    seen: dict[str, str] = {}
    out = []
    for p in sorted(plan.principals, key=lambda p: p.name):
        digest = p.key_sha256.lower()
        if not _HEX64.match(digest):
            raise GenerateError(f"nginx generator: principal {p.name!r}: key_sha256 is not a sha256 hex")
        if digest in seen:
            raise GenerateError(f"nginx generator: principals {seen[digest]!r} and {p.name!r} "
                                "share one key")
        seen[digest] = p.name
        out.append((digest, _name("principal", p.name), _name("role", p.role)))
    return tuple(out)


def _servers(plan: Plan) -> tuple[str, ...]:
    """One vLLM: never marked down (NGINX ignores max_fails for a lone server anyway). Replicas:
    after ``max_fails`` failed connections one is skipped for ``eject_s`` (passive health);
    a request is passed to the next replica only while nothing of it was sent (NGINX's
    ``proxy_next_upstream`` default for POST), so no generation runs twice."""
    up = plan.upstream
    if not up.replicas:
        return (f"{_hostport(up.host, up.port)} max_fails=0",)
    health = f"max_fails={up.health.max_fails} fail_timeout={up.health.eject_s}s"
    return tuple(f"{_hostport(host, port)} {health}" for host, port in up.servers)


def _balance(plan: Plan) -> str:
    return "least_conn" if plan.upstream.replicas and plan.upstream.balance == "least_conn" else ""


def _upstream_tls(plan: Plan, opts: NginxOptions) -> dict[str, str]:
    tls = upstream_tls(plan, "nginx", opts.ca_bundle)
    if tls is None:
        return {}
    out = {"ca": _file("upstream CA", tls.ca), "name": tls.verify_name}
    if tls.client_cert:
        out["cert"] = _file("upstream client certificate", tls.client_cert)
        out["key"] = _file("upstream client key", tls.client_key)
    return out


def build_model(plan: Plan, options: GenerateOptions) -> NginxModel:
    opts = NginxOptions.parse(options.extra)
    why = jwt_refusal(plan, "nginx") or cert_refusal(plan, "nginx")
    if why:
        raise GenerateError(f"nginx generator: {why}")
    if plan.grpc is not None:
        raise GenerateError("nginx generator: the policy's grpc: listener is generated for Envoy only "
                            "(`generate envoy`); NGINX's HTTP listener refuses gRPC and HTTP/2 cleartext")
    reg = _NginxRegistry()
    up_tls = _upstream_tls(plan, opts)
    scheme = "https" if up_tls else "http"
    locations = tuple(_location(reg, plan, i + 1, route, ds, scheme)
                      for i, (route, ds) in enumerate(plan.allowed_paths().items()))
    lua = _lua_runtime(opts, options) if opts.lua_module else None
    if lua is not None:
        locations = tuple(_on_lua(loc, reg.compiled) for loc in locations)
    base = opts.config_dir.rstrip("/") + "/" if opts.config_dir else ""
    includes = {k: _file("config", base + v) for k, v in INCLUDED.items()}
    listen = plan.listen
    tls_cert = _file("listener certificate", listen.tls.cert) if listen.tls else ""
    tls_key = _file("listener key", listen.tls.key) if listen.tls else ""
    ca = listen.tls.client_ca if listen.tls else None
    client_ca = _file("listener client CA", ca) if ca else ""
    for cidr in plan.trusted_proxies:
        ipaddress.ip_network(cidr, strict=False)
    if reg.tokens and opts.njs and version_tuple(opts.njs) < (0, 8):
        raise GenerateError(f"nginx generator: tokens_per_minute needs njs >= 0.8 (js_shared_dict_zone); "
                            f"this NGINX has njs {opts.njs}: use the static build or Envoy")
    return NginxModel(
        stamp=Stamp.of(plan),
        runtime_dir=_file("runtime_dir", options.runtime_dir.rstrip("/") or "/"),
        access_log=_file("access_log", options.access_log),
        error_log=_file("error_log", options.error_log),
        njs_module=_file("njs_module", opts.njs_module) if opts.njs_module else "",
        user=opts.user, worker_processes=opts.worker_processes, upstream_keepalive=opts.upstream_keepalive,
        includes=includes,
        listen=_hostport(listen.address, listen.port), tls_cert=tls_cert, tls_key=tls_key,
        tls_client_ca=client_ca, tls_verify_depth=listen.tls.verify_depth if listen.tls else 0,
        upstream_servers=_servers(plan), upstream_balance=_balance(plan),
        upstream_scheme=scheme, upstream_tls=up_tls, host_header=host_header(plan, "nginx"),
        trusted_proxies=tuple(sorted(str(ipaddress.ip_network(c, strict=False))
                                     for c in plan.trusted_proxies)),
        principals=_principals(plan), salts=salts(plan, "nginx"),
        geos={var: cidrs for cidrs, var in reg.geos.items()},
        rolesets={var: roles for roles, var in reg.rolesets.items()},
        cert_rolesets={var: roles for roles, var in reg.cert_rolesets.items()},
        certs_json=_certs_json(plan),
        rate_zones=tuple(reg.rate.values()), conn_zones=tuple(reg.conn.values()),
        checks=tuple(reg.checks.values()), programs=dict(reg.compiled),
        token_zones=tuple(reg.tokens.values()),
        locations=locations,
        upstream_key_file=plan.upstream.api_key_file or "",
        owner_secret_file=_file("responses_secret_file", plan.body.responses_secret_file or "")
        if plan.body.owned else "",
        forwarded_headers=_passed(FORWARDED_HEADERS), websocket_headers=_passed(WEBSOCKET_HEADERS),
        jwt=tuple(reg.jwt.values()), jwt_roles={i: roles for roles, i in reg.jwt_roles.items()},
        limiter=_limiter(plan), fetch_keepalive=bool(opts.njs) and version_tuple(opts.njs) >= (0, 9),
        heartbeat_ms=round(HEARTBEAT_S * 1000)
        if _limiter(plan) and (not opts.njs or version_tuple(opts.njs) >= (0, 8, 1)) else 0,
        lua=lua,
    )
