"""The plan: one decision per method and path. The single truth for configs and probes.

Both generators (``scanner.generate``) render *only* from a :class:`Plan`, and the
prober (``scanner.probe``) takes its expectations from the same object, so a
config and the proof of that config cannot disagree about intent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from scanner import canonical, jsondoc, patterns
from scanner.inventory.model import RouteKind
from scanner.plan.budget import Budget
from scanner.plan.document import (
    DecisionView,
    FieldsView,
    GrpcView,
    LimitsView,
    MediaView,
    OwnerView,
    PlanView,
)
from scanner.plan.envelope import EnvelopeSpec
from scanner.plan.output_default import OutputDefault
from scanner.plan.vllm_json import vllm_int
from scanner.plan.zones import DEFAULT_DOMAIN, Zone, of_decisions, route_zones, zone_json
from scanner.policy.jwt import JwtAuth
from scanner.policy.media import MediaRules
from scanner.policy.model import (
    AudienceKind,
    BodyPolicy,
    CertPrincipal,
    FieldRules,
    Limits,
    Listen,
    OnUnavailable,
    Principal,
    Upstream,
    default_tokens_burst,
)

Action = Literal["allow", "deny"]
PLAN_SCHEMA_VERSION = 1

# Header names shared by the generated proxies and the prober.
DECISION_HEADER = "X-Perimeter-Decision"
REASON_HEADER = "X-Perimeter-Reason"
PRINCIPAL_HEADER = "X-Perimeter-Principal"
# The only request headers the perimeter forwards as the client sent them; every other one is
# dropped (default deny for headers too: vLLM reads X-Vllm-Priority, X-data-parallel-rank,
# X-Session-ID and X-Request-Id from requests, and a release may add more).
FORWARDED_HEADERS: tuple[str, ...] = ("Accept", "Content-Type", "User-Agent", "traceparent", "tracestate")
# ... and on an allowed WebSocket route, the handshake's own headers.
WEBSOCKET_HEADERS: tuple[str, ...] = ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Protocol",
                                      "Sec-WebSocket-Extensions")
# Request headers vLLM itself acts on (0.28 - 0.33): never a client's to set.
VLLM_REQUEST_HEADERS: tuple[str, ...] = ("X-Request-Id", "X-Vllm-Priority", "X-data-parallel-rank",
                                         "X-Session-ID", "endpoint-load-metrics-format")
# Methods whose request bodies the perimeter reads and checks (size, JSON caps, governed fields).
BODY_METHODS: tuple[str, ...] = ("DELETE", "PATCH", "POST", "PUT")
# Request fields a body policy governs: the policy key -> the top-level fields it names.
GOVERNED_FIELDS: Mapping[str, tuple[str, ...]] = {
    "cache_salt": ("cache_salt",),
    "chat_template": ("chat_template", "chat_template_kwargs"),
}
# Where a generating route reads how many tokens it may produce (vLLM 0.28 - 0.33): path ->
# (the fields, the first one present and not null wins; the field a cap is written into when
# none is). With none of them vLLM generates up to the rest of the context window (vLLM issue
# #11976): a cap on these fields holds only if the perimeter also decides their absence.
# /invocations validates a body as a chat request, then as a completion request; the latter
# reads max_tokens only, so only max_tokens counts there. /v1/messages (Anthropic's API) generates
# up to its max_tokens (required by vLLM's AnthropicMessagesRequest). /inference/v1/generate
# (token in, token out) reads the ``max_tokens`` of its ``sampling_params`` object (a dotted path):
# vLLM 0.29 and 0.33 give a body that does not set it the rest of the context window (serving.py,
# ``is_sampling_param_provided``: not SamplingParams' default of 16), and a null there the same
# (the engine's input processor), as on the routes above.
OUTPUT_BUDGET: Mapping[str, tuple[tuple[str, ...], str]] = {
    "/inference/v1/generate": (("sampling_params.max_tokens",), "sampling_params.max_tokens"),
    "/invocations": (("max_tokens",), "max_tokens"),
    "/v1/chat/completions": (("max_completion_tokens", "max_tokens"), "max_completion_tokens"),
    "/v1/chat/completions/batch": (("max_completion_tokens", "max_tokens"), "max_completion_tokens"),
    "/v1/completions": (("max_tokens",), "max_tokens"),
    "/v1/messages": (("max_tokens",), "max_tokens"),
    "/v1/responses": (("max_output_tokens",), "max_output_tokens"),
}
# Inbound headers a client could use to confuse the upstream or an app behind it.
SPOOFABLE_HEADERS: tuple[str, ...] = (
    "X-Original-URL", "X-Rewrite-URL", "X-Original-Method", "X-HTTP-Method-Override",
    "X-HTTP-Method", "X-Method-Override", "X-Forwarded-For", "X-Forwarded-Host",
    "X-Forwarded-Proto", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Real-IP", "Forwarded",
    PRINCIPAL_HEADER,
)


def whole(value: object) -> int:
    """A budget or sequence field's value as the token charge reads it: the integer vLLM reads
    (:func:`scanner.plan.vllm_json.vllm_int`) floored at 0; anything vLLM refuses 0."""
    return max(0, vllm_int(value) or 0)


@dataclass(frozen=True)
class Decision:
    """What the perimeter does with one method on one route."""

    method: str
    path: str                       # the route template, as in the inventory
    kind: RouteKind
    action: Action
    reason: str
    audience: str = ""
    audience_kind: AudienceKind = "none"
    auth: Literal["key", "none", "jwt", "cert"] = "key"
    roles: tuple[str, ...] = ()     # principals' roles admitted; empty + auth=key/jwt/cert: any principal
    jwt: JwtAuth | None = None      # auth "jwt": the token rules (issuers, audiences, keys, claims)
    networks: tuple[str, ...] = ()  # CIDRs the request may come from
    limits: Limits = field(default_factory=Limits)
    fields: FieldRules = field(default_factory=FieldRules)   # top-level body fields decided here
    # "principal" / "audience": every JSON body leaves with cache_salt = the perimeter's salt of
    # the principal (or of the audience), the client's replaced (cache_salt: per-principal /
    # per-audience); "" none
    salt: Literal["", "principal", "audience"] = ""
    # the audience's media rules (scanner.policy.media) where the route's request model has a media
    # position (``media_at``, from the inventory) or its body is unknown; else none (inactive)
    media: MediaRules = field(default_factory=MediaRules)
    media_at: tuple[str, ...] = ()
    state_changing: bool = False    # the policy flags it, or it is on the built-in list
    state_changing_by: str = ""     # "policy", "built-in", "policy+built-in" or ""
    upstream_guarded: bool = False  # would vLLM's own --api-key guard this path
    rule_line: int = 0              # policy line of the deciding rule; 0 = default deny
    # the fields of the route's request model that multiply its work (scanner/plan/envelope.py)
    envelope_spec: EnvelopeSpec = field(default_factory=EnvelopeSpec)
    # what vLLM generates for a body without an output budget (the inventory's serve arguments)
    output_default: OutputDefault = field(default_factory=OutputDefault)
    # the nested positions of the route's request model (inventory, through object members only)
    # named like a json cap: ``sampling_params.n`` (each capped as its name is at the top level)
    nested_caps: tuple[str, ...] = ()
    # body: responses: owned (scanner/plan/owner.py): the path parameter naming a stored response
    # (checked and unsealed on the way in), the top-level body fields naming one (the same), and
    # whether the route's answers are sealed (they may carry response ids); "", (), False: none
    owner_param: str = ""
    owner_fields: tuple[str, ...] = ()
    owner_seal: bool = False

    @property
    def owned(self) -> bool:
        """Does the perimeter act on stored responses' ids on this route (in or out)?"""
        return bool(self.owner_param or self.owner_fields or self.owner_seal)

    @property
    def owner_segment(self) -> int:
        """The index of the owned path parameter among the path's "/"-split parts (the leading ""
        counted: both proxies split the normalised path so); 0: none."""
        return self.path.split("/").index("{" + self.owner_param + "}") if self.owner_param else 0

    # limits.max_request_tokens was set by the token budget (scanner/plan/build.py
    # request_token_cap): to its capacity (limits.tokens_burst), lowered from the policy's value
    # over tokens_per_minute, or set where the policy had none
    request_tokens_by_budget: bool = False

    @property
    def exact(self) -> bool:
        return patterns.is_exact(self.path)

    @property
    def regex(self) -> str:
        return patterns.to_regex(self.path)

    @property
    def allowed(self) -> bool:
        return self.action == "allow"

    @property
    def cap_paths(self) -> tuple[tuple[str, int], ...]:
        """Every position a json cap applies at, sorted by path (the order the checks run in):
        its name at the top level, and each nested position of the request model with that name
        (a dotted path, :attr:`nested_caps`), with the name's cap."""
        caps = self.limits.json_caps
        nested = ((p, caps[p.rsplit(".", 1)[1]]) for p in self.nested_caps if p.rsplit(".", 1)[1] in caps)
        return tuple(sorted({**caps, **dict(nested)}.items()))

    @property
    def rate_zone(self) -> str:
        """The rate limiter bucket family both proxies use: one bucket per principal
        (auth "key") or client address (auth "none") in it. "" when not rate-limited."""
        rate = self.limits.rate
        return f"{self.audience}:{self.auth}:{rate.rps:g}/{rate.burst}" if rate else ""

    @property
    def conn_zone(self) -> str:
        """The concurrency limit family, counted per principal or client address; "" if none."""
        limit = self.limits.concurrency
        return f"{self.audience}:{self.auth}:{limit}" if limit else ""

    @property
    def token_zone(self) -> str:
        """The token budget family (``limits.tokens_per_minute`` N and the capacity the plan
        decided, ``limits.tokens_burst`` C), one budget per principal (auth "key") or client address
        (auth "none") in it: "" when the route has none. Only requests with a body are charged (an
        allowed HTTP route and a body method)."""
        tpm = self.limits.tokens_per_minute
        if not tpm or not self.allowed or self.kind != "http" or self.method not in BODY_METHODS:
            return ""
        return f"{self.audience}:{self.auth}:{tpm}t/m/{self.token_capacity}"

    @property
    def token_capacity(self) -> int:
        """The token budget's bucket: at most this many tokens at once, refilled at N / 60 a second
        (any t seconds admit at most C + N x t / 60); 0 on a route without a budget."""
        tpm = self.limits.tokens_per_minute
        if not tpm:
            return 0
        burst = self.limits.tokens_burst
        return burst if burst is not None else default_tokens_burst(tpm)

    @property
    def envelope_capped(self) -> bool:
        """Does this route refuse bodies by their envelope (an allowed HTTP route with a body
        method and a per-request cap)?"""
        lim = self.limits
        return (self.allowed and self.kind == "http" and self.method in BODY_METHODS
                and (lim.max_sequences is not None or lim.max_request_tokens is not None))

    def salt_subject(self, principal: str) -> str:
        """What this route's salt is computed over ("principal:NAME" / "audience:NAME"); "" none."""
        if self.salt == "principal":
            return f"principal:{principal}"
        return f"audience:{self.audience}" if self.salt == "audience" else ""

    @property
    def budget(self) -> Budget | None:
        """The output budget both proxies enforce on this route (None: it has none, or the plan
        caps none of its fields)."""
        spec = OUTPUT_BUDGET.get(self.path)
        if spec is None or self.kind != "http" or self.method not in BODY_METHODS or not self.allowed:
            return None
        caps = [cap for f, cap in self.cap_paths if f in spec[0]]
        if not caps:
            return None
        return Budget(spec[0], spec[1], min(caps), self.limits.when_absent or "inject", self.output_default)

    @property
    def enforced_budget(self) -> Budget | None:
        """:attr:`budget` when the proxies act on it (inject or reject); None also for ``pass``."""
        budget = self.budget
        return budget if budget is not None and budget.when_absent != "pass" else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self.view())
        return out

    def view(self) -> DecisionView:
        """The decision as the plan document shows it (scanner.plan.document)."""
        lim, rules = self.limits, self.fields
        return DecisionView(
            method=self.method, path=self.path, kind=self.kind, action=self.action, reason=self.reason,
            audience=self.audience, audience_kind=self.audience_kind, auth=self.auth, roles=self.roles,
            networks=self.networks, jwt=self.jwt.to_dict() if self.jwt else None,
            limits=LimitsView(
                body_bytes=lim.body_bytes, json_caps=dict(sorted(lim.json_caps.items())),
                cap_paths=dict(self.cap_paths) if self.nested_caps else None,
                rate=lim.rate, concurrency=lim.concurrency, timeout_s=lim.timeout_s,
                tokens_per_minute=lim.tokens_per_minute or None,
                tokens_burst=lim.tokens_burst if self.token_zone else None,
                max_sequences=lim.max_sequences, max_request_tokens=lim.max_request_tokens,
                max_request_tokens_by="tokens_burst" if self.request_tokens_by_budget else None),
            envelope=self.envelope_spec if self.envelope_capped or self.token_zone else None,
            budget=self.budget,
            fields=FieldsView(allow=rules.names("allow"), reject=rules.names("reject"),
                              strip=rules.names("strip"), unknown=rules.unknown, counts=rules.counts,
                              pins=rules.pins, values=rules.values, salt=self.salt or None),
            media=MediaView(urls=self.media.urls, domains=self.media.domains,
                            data_max_bytes=self.media.data_max_bytes, max_items=self.media.max_items,
                            embeds=self.media.embeds, at=self.media_at) if self.media.active else None,
            owner=OwnerView(param=self.owner_param, fields=self.owner_fields, seal=self.owner_seal)
            if self.owned else None,
            state_changing=self.state_changing, state_changing_by=self.state_changing_by,
            upstream_guarded=self.upstream_guarded, rule_line=self.rule_line)


@dataclass(frozen=True)
class GrpcPlan:
    """The gRPC listener: one decision per method of the gRPC inventory (kind "grpc", method
    "POST", path ``/package.Service/Method``), default deny. A method's limits are its
    audience's rate, concurrency, timeout and body size; the JSON body rules (caps, output
    budget, fields, media, salt) cannot be read in protobuf and are listed in ``unenforced``."""

    listen: Listen
    upstream: tuple[str, int]
    decisions: tuple[Decision, ...]
    inventory: str                      # where the methods were read (catalog, file, reflection)
    uncovered: tuple[str, ...] = ()     # methods no rule covers: denied, reported
    unused_rules: tuple[str, ...] = ()
    unenforced: tuple[str, ...] = ()    # "METHOD: the audience's json caps ... not enforced"

    @property
    def allowed(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.allowed)

    def decision(self, path: str) -> Decision | None:
        return next((d for d in self.decisions if d.path == path), None)

    def view(self) -> GrpcView:
        """The gRPC listener as the plan document shows it (scanner.plan.document)."""
        return GrpcView(listen={"address": self.listen.address, "port": self.listen.port,
                                "tls": bool(self.listen.tls)},
                        upstream=f"{self.upstream[0]}:{self.upstream[1]}", inventory=self.inventory,
                        decisions=tuple(d.view() for d in self.decisions), uncovered=self.uncovered,
                        unused_rules=self.unused_rules, unenforced=self.unenforced)


@dataclass(frozen=True)
class SharedPlan:
    """The fleet's shared limits (policy ``shared:``), decided once: every rate, concurrency and
    token-budget zone of the plan lives in the limiter (``zones``: the plan's, ``Plan.zones``; the
    zones file ``generate`` writes and ``vllm-perimeter limiter --zones`` reads), and each zone's
    per-proxy share (``local``: every value divided by ``replicas``,
    scanner.plan.zones.local_share), which a proxy enforces on its own under ``on_unavailable:
    local`` while the store cannot be reached, after ``local_after_s`` of an outage
    (scanner.plan.zones.local_after). The generators render from this and nothing else."""

    redis: str
    limiter: tuple[str, int]
    on_unavailable: OnUnavailable
    replicas: int
    zones: Mapping[str, Zone]
    local: Mapping[str, Zone]
    password_file: str | None = None
    tls_ca: str | None = None
    # on_unavailable: local: seconds of an outage before a zone's requests go to the local shares
    # (the shares start full); zones not named: at once
    local_after_s: Mapping[str, float] = field(default_factory=dict)
    domain: str = DEFAULT_DOMAIN        # the Envoy rate limit domain the limiter answers for
    slot_lease_s: float | None = None   # a slot's lease at the limiter (None: the limiter's default)

    @property
    def limiter_url(self) -> str:
        host, port = self.limiter
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def route_zones(self, d: Decision) -> tuple[str, ...]:
        """The shared zones a request of ``d`` is taken through, in the limiter's order (rate,
        concurrency, tokens)."""
        return tuple(z for z in route_zones(d) if z in self.zones)

    def to_dict(self) -> dict[str, Any]:
        host, port = self.limiter
        return {"redis": self.redis, "limiter": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                "on_unavailable": self.on_unavailable, "replicas": self.replicas,
                "domain": self.domain,
                **({"password_file": self.password_file} if self.password_file else {}),
                **({"tls_ca": self.tls_ca} if self.tls_ca else {}),
                "zones": {name: {**zone_json(z), "local": zone_json(self.local[name])}
                          for name, z in sorted(self.zones.items())}}


@dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    principals: tuple[Principal, ...]
    listen: Listen
    upstream: Upstream
    body: BodyPolicy
    trusted_proxies: tuple[str, ...]
    networks: Mapping[str, tuple[str, ...]]
    policy_name: str
    policy_digest: str
    inventory_hash: str
    vllm_version: str = ""
    uncovered: tuple[str, ...] = ()        # "METHOD path" with no rule: denied, reported
    unused_rules: tuple[str, ...] = ()     # "line N: path" rules that matched no route
    # "METHOD path: a, b (unknown: reject)": fields of an allowed route's request model (from the
    # inventory) its field rules do not name; form bodies are not inspected and not listed
    unnamed_fields: tuple[str, ...] = ()
    # "METHOD path": end users' routes taking a stored response's id while stored responses are
    # shared among principals (body: responses: shared): reported, see docs/ownership.md
    responses_shared: tuple[str, ...] = ()
    grpc: GrpcPlan | None = None           # the gRPC listener's decisions (policy grpc:)
    shared: SharedPlan | None = None       # the fleet's shared limits (policy shared:)
    # principals known by a client certificate's URI SAN or subject (auth "cert" routes); the
    # listener verifies client certificates against listen.tls.client_ca when there is one
    certs: tuple[CertPrincipal, ...] = ()
    schema_version: int = PLAN_SCHEMA_VERSION

    @property
    def allowed(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.allowed)

    @property
    def denied(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d.allowed)

    @cached_property
    def zones(self) -> Mapping[str, Zone]:
        """Every limiter zone of the allowed routes (HTTP and gRPC) by name, sorted: made here
        once (scanner.plan.zones.of_decisions); the limiter, both generators and the fleet's
        shares read these."""
        return of_decisions((*self.decisions, *(self.grpc.decisions if self.grpc else ())))

    @property
    def own_zones(self) -> Mapping[str, Zone]:
        """The zones each proxy enforces on its own: every zone of the plan without a fleet; with
        one, each zone's per-proxy share under ``on_unavailable: local`` (counted only while the
        limiter cannot decide), none under ``deny`` (every limit is the limiter's)."""
        if self.shared is None:
            return self.zones
        return self.shared.local if self.shared.on_unavailable == "local" else {}

    @property
    def host_header(self) -> str:
        """The Host header vLLM receives on every forwarded request, whatever the client sent
        (its Host, an absolute-form target): the upstream's TLS server name when one is set,
        else the first server's host, with the first server's port (IPv6 in brackets). One
        fixed value across replicas; both generators write it, the witness checks it."""
        up = self.upstream
        name = (up.tls.server_name if up.use_tls and up.tls and up.tls.server_name else "") or up.host
        return f"[{name}]:{up.port}" if ":" in name else f"{name}:{up.port}"

    def allowed_paths(self) -> dict[str, tuple[Decision, ...]]:
        """Allowed decisions grouped by path, paths sorted: the generators' unit of work."""
        out: dict[str, list[Decision]] = {}
        for d in self.allowed:
            out.setdefault(d.path, []).append(d)
        return {p: tuple(sorted(ds, key=lambda d: d.method)) for p, ds in sorted(out.items())}

    @cached_property
    def _index(self) -> dict[tuple[str, str], Decision]:
        out: dict[tuple[str, str], Decision] = {}
        for d in self.decisions:  # sorted by (path, kind, method): an http route before a mount
            out.setdefault((d.method, d.path), d)
        return out

    @cached_property
    def _by_path(self) -> dict[str, tuple[Decision, ...]]:
        out: dict[str, list[Decision]] = {}
        for d in self.decisions:
            if d.kind != "mount":
                out.setdefault(d.path, []).append(d)
        return {p: tuple(ds) for p, ds in out.items()}

    def decision(self, method: str, path: str) -> Decision | None:
        """The decision for ``method`` on the route template ``path`` (an exact route
        before a mount of the same path)."""
        return self._index.get((method, path))

    def routes(self) -> dict[str, tuple[Decision, ...]]:
        """Decisions per path of HTTP and WebSocket routes (a mount has no exact path)."""
        return self._by_path

    def body_dict(self) -> dict[str, Any]:
        """The plan document without its digest."""
        out: dict[str, Any] = jsondoc.dump(self.view(""))
        del out["digest"]
        return out

    def view(self, digest: str) -> PlanView:
        """The plan as its document shows it (scanner.plan.document), with ``digest``."""
        tls = self.upstream.tls
        return PlanView(
            schema_version=1,
            policy={"name": self.policy_name, "digest": self.policy_digest},
            inventory_hash=self.inventory_hash,
            vllm_version=self.vllm_version,
            listen={"address": self.listen.address, "port": self.listen.port,
                       "tls": bool(self.listen.tls),
                       **({"client_ca": self.listen.tls.client_ca,
                           "verify_depth": self.listen.tls.verify_depth}
                          if self.listen.tls and self.listen.tls.client_ca else {})},
            upstream={"host": self.upstream.host, "port": self.upstream.port,
                         "servers": [f"[{h}]:{p}" if ":" in h else f"{h}:{p}"
                                     for h, p in self.upstream.servers],
                         "balance": self.upstream.balance,
                         "health": {"max_fails": self.upstream.health.max_fails,
                                    "eject_s": self.upstream.health.eject_s},
                         "tls": self.upstream.use_tls,
                         "mtls": bool(tls and tls.client_cert),
                         "api_key_file": self.upstream.api_key_file},
            body=self.body,
            trusted_proxies=self.trusted_proxies,
            networks=dict(sorted(self.networks.items())),
            principals=tuple({"name": p.name, "role": p.role, "fingerprint": p.fingerprint}
                             for p in self.principals),
            cert_principals=tuple({"name": c.name, "role": c.role,
                                   **({"san": c.san} if c.san else {"subject": c.subject})}
                                  for c in self.certs),
            decisions=tuple(d.view() for d in self.decisions),
            uncovered=self.uncovered,
            unused_rules=self.unused_rules,
            unnamed_fields=self.unnamed_fields,
            responses_shared=self.responses_shared,
            grpc=self.grpc.view() if self.grpc else None,
            shared=self.shared.to_dict() if self.shared else None,
            digest=digest)

    @property
    def digest(self) -> str:
        return canonical.digest(self.body_dict())

    def to_json(self) -> str:
        return canonical.dumps(jsondoc.dump(self.view(self.digest)))
