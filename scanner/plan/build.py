"""inventory + policy -> plan. Deterministic: same inputs, same plan, same digest."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from scanner import patterns
from scanner.errors import PerimeterError, PlanError
from scanner.inventory import grpc as grpc_inventory
from scanner.inventory.grpc import GrpcSurface
from scanner.inventory.model import Inventory, Route
from scanner.plan import jwt as plan_jwt
from scanner.plan import output_default, owner
from scanner.plan import zones as plan_zones
from scanner.plan.envelope import EnvelopeSpec, named_at
from scanner.plan.envelope import spec_for as envelope_spec_for
from scanner.plan.model import BODY_METHODS, GOVERNED_FIELDS, Decision, GrpcPlan, Plan, SharedPlan
from scanner.policy.media import MediaRules
from scanner.policy.media import positions as media_positions
from scanner.policy.model import (
    Audience,
    BodyPolicy,
    FieldRules,
    Limits,
    Policy,
    RouteRule,
    Shared,
    default_tokens_burst,
)
from scanner.state_changing import is_state_changing

# The upgrade request of a WebSocket route is a GET; a mount answers any method,
# and the plan never allows a mount (its sub-paths are unknown).
_MOUNT_METHODS = ("*",)


def build(inventory: Inventory, policy: Policy,
          network_overrides: Mapping[str, tuple[str, ...]] | None = None,
          grpc_surface: GrpcSurface | None = None) -> Plan:
    """One decision per (method, route). Routes no rule covers are denied and reported."""
    networks = dict(policy.networks)
    for name, cidrs in (network_overrides or {}).items():
        if name not in networks:
            raise PlanError(f"--network {name}=...: the policy has no network {name!r} "
                            f"(it has: {', '.join(sorted(networks)) or 'none'})")
        networks[name] = cidrs
    decisions: list[Decision] = []
    uncovered: list[str] = []
    used: set[int] = set()
    # what vLLM generates for a body without an output budget, from its serve arguments
    default = output_default.read(inventory.vllm.serve_args if inventory.vllm else ())
    for route in inventory.routes:
        for method in route.methods:
            rule = _rule_for(policy.rules, route, method)
            if rule is None:
                uncovered.append(f"{method} {route.path}")
                decisions.append(_deny(route, method, "no rule covers this route (default deny)"))
                continue
            used.add(rule.line)
            decided = _decide(route, method, rule, policy.audiences[rule.audience], networks, policy.body)
            decisions.append(replace(decided, output_default=default) if decided.allowed else decided)
    unused = tuple(f"line {r.line}: {r.path}" for r in policy.rules if r.line not in used)
    _misnamed(inventory, policy)
    clash = plan_jwt.clash(a.jwt for a in policy.audiences.values() if a.jwt is not None)
    if clash:
        raise PlanError(f"{policy.source}: {clash}")
    plan = Plan(
        decisions=tuple(sorted(decisions, key=lambda d: (d.path, d.kind, d.method))),
        principals=policy.principals,
        certs=policy.certs,
        listen=policy.listen,
        upstream=policy.upstream,
        body=policy.body,
        trusted_proxies=policy.trusted_proxies,
        networks=networks,
        policy_name=policy.name,
        policy_digest=policy.digest,
        inventory_hash=inventory.content_hash,
        vllm_version=inventory.vllm.version if inventory.vllm else "",
        uncovered=tuple(sorted(uncovered)),
        unused_rules=unused,
        unnamed_fields=_unnamed_fields(inventory, decisions, policy.source),
        responses_shared=_shared_responses(inventory, decisions, policy),
        grpc=_grpc(policy, networks, grpc_surface) if policy.grpc else None,
    )
    return replace(plan, shared=shared_plan(plan, policy.shared, policy.source)) if policy.shared else plan


def shared_plan(plan: Plan, s: Shared, source: str) -> SharedPlan:
    """Every rate, concurrency and token-budget zone of the plan, shared through the limiter,
    and each zone's per-proxy share for ``on_unavailable: local``. A zone whose value is below
    the replica count cannot be divided (each proxy still enforces at least 1: the fleet would
    admit more than the policy) under ``local``: a plan error naming it."""
    local = {name: plan_zones.local_share(z, s.replicas) for name, z in plan.zones.items()}
    after: dict[str, float] = {}
    if s.on_unavailable == "local":   # the outage the shares wait for (they start full)
        waits = {name: plan_zones.local_after(z, s.replicas) for name, z in plan.zones.items()}
        after = {name: a for name, a in waits.items() if a > 0}
        for name, zone in plan.zones.items():
            whole = _whole_value(zone)
            if whole < s.replicas:
                raise PlanError(f"{source}:{s.line}: shared.on_unavailable: local with {s.replicas} "
                                f"replicas cannot divide zone {name} ({whole} {_unit(zone)}): each proxy "
                                f"would still admit 1, the fleet {s.replicas}; raise it to at least "
                                f"{s.replicas} or use on_unavailable: deny")
    return SharedPlan(redis=s.redis, limiter=s.limiter, on_unavailable=s.on_unavailable,
                      replicas=s.replicas, zones=plan.zones, local=local, local_after_s=after,
                      password_file=s.password_file, tls_ca=s.tls_ca)


def _whole_value(zone: plan_zones.Zone) -> int:
    """What local_share divides and keeps at least 1: requests at once (rate: burst + 1), slots,
    tokens per minute."""
    if isinstance(zone, plan_zones.RateZone):
        return zone.burst + 1
    return zone.limit if isinstance(zone, plan_zones.ConcurrencyZone) else zone.per_minute


def _unit(zone: plan_zones.Zone) -> str:
    return {"rate": "requests at once (burst + 1)", "concurrency": "requests in flight",
            "tokens": "tokens a minute"}[zone.kind]


def _grpc(policy: Policy, networks: Mapping[str, tuple[str, ...]], surface: GrpcSurface | None) -> GrpcPlan:
    """One decision per method of the gRPC inventory the policy names (or ``surface``)."""
    g = policy.grpc
    assert g is not None
    if surface is None:
        try:
            surface = grpc_inventory.load(g.path or g.inventory)
        except PerimeterError as exc:
            raise PlanError(f"{policy.source}:{g.line}: grpc.inventory: {exc}") from None
    decisions, uncovered, used, unenforced = [], [], set(), []
    for m in surface.methods:
        route = Route(path=m.path, methods=("POST",), kind="grpc")
        rule = next((r for r in g.rules if r.covers(m.path)), None)
        if rule is None:
            uncovered.append(m.path)
            decisions.append(_deny(route, "POST", "no rule covers this gRPC method (default deny)"))
            continue
        used.add(rule.line)
        audience = policy.audiences[rule.audience]
        d = _decide(route, "POST", RouteRule(path=m.path, audience=rule.audience, line=rule.line),
                    audience, networks, BodyPolicy(cache_salt="pass", chat_template="pass"))
        lim = d.limits
        lost = [what for what, on in (("json caps", bool(lim.json_caps)),
                                      ("field rules", audience.fields.decided),
                                      ("media rules", audience.media.active),
                                      ("cache_salt", policy.body.salted)) if on]
        if d.allowed and lost:
            unenforced.append(f"{m.path}: the audience's {', '.join(lost)} (JSON body rules; protobuf "
                              "bodies are not read)")
        decisions.append(replace(d, reason=d.reason.replace("rule at line", "grpc rule at line"),
                                 limits=replace(lim, json_caps={}, when_absent=None),
                                 fields=FieldRules(), media=MediaRules(), salt=""))
    return GrpcPlan(listen=g.listen, upstream=(g.upstream_host, g.upstream_port),
                    decisions=tuple(sorted(decisions, key=lambda d: d.path)),
                    inventory=_surface_name(surface), uncovered=tuple(uncovered),
                    unused_rules=tuple(f"line {r.line}: {r.method}" for r in g.rules if r.line not in used),
                    unenforced=tuple(unenforced))


def _surface_name(surface: GrpcSurface) -> str:
    p = surface.provenance
    what = ", ".join(str(x) for x in p.packages) or p.target
    return f"{p.kind}: {what}" + (f" (vLLM {p.vllm})" if p.vllm else "")


_PIN_TYPES: Mapping[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,), "null": (type(None),),
    "array": (list,), "object": (dict,)}


@functools.cache
def _catalog_field_names() -> frozenset[str]:
    """Every top-level request field of every bundled catalog (all the vLLM versions known)."""
    from scanner.inventory import catalog

    return frozenset(f.name for name in catalog.names() for r in catalog.load_catalog(name).routes
                     if r.request is not None for f in r.request.fields)


def _misnamed(inventory: Inventory, policy: Policy) -> None:
    """A field name in an audience's rules that no request model has, in this inventory or any
    bundled catalog, is a misspelling that decides nothing (a denied field would pass under
    ``unknown: pass``): a policy error naming the line. Not checked on an inventory that knows
    no request model (``inventory openapi``, older inventories)."""
    models = [r.request for r in inventory.routes if r.request is not None and r.request.known]
    if not models:
        return
    known = {f.name for m in models for f in m.fields} | _catalog_field_names()
    for a in sorted(policy.audiences.values(), key=lambda a: a.fields.line):
        wrong = sorted({*a.fields.named, *a.fields.counts, *a.fields.pins, *a.fields.values} - known,
                       key=lambda n: (a.fields.lines.get(n, a.fields.line), n))
        if wrong:
            line = a.fields.lines.get(wrong[0], a.fields.line)
            raise PlanError(f"{policy.source}:{line}: audience {a.name!r} fields: {', '.join(wrong)}: no "
                            "request model has such a field (this inventory's, or any bundled vLLM "
                            "catalog's); a misspelled name decides nothing")


def _unnamed_fields(inventory: Inventory, decisions: list[Decision], source: str) -> tuple[str, ...]:
    """Fields of each allowed route's request model that its field rules do not name (those
    with rules only; a form body is not inspected, so its fields are not listed). A pin whose
    value the route's model would not accept is a policy error (PlanError naming its line)."""
    bodies = {r.path: r.request for r in inventory.routes if r.kind == "http"}
    out = []
    for d in sorted(decisions, key=lambda d: (d.path, d.method)):
        body = bodies.get(d.path)
        if not d.allowed or not d.fields.decided or body is None or "form" in body.media_type:
            continue
        for name, value in d.fields.pins.items():
            f = body.top_field(name)
            accepted = tuple(t for kind in (f.types if f else ()) for t in _PIN_TYPES.get(kind, (object,)))
            if f is not None and f.types and not (isinstance(value, accepted) and
                                                  not (isinstance(value, bool) and bool not in accepted)):
                raise PlanError(f"{source}:{d.fields.line}: fields.pin.{name}: {value!r} is not what "
                                f"{d.method} {d.path} accepts ({' or '.join(f.types)})")
        names = sorted({f.name for f in body.fields} - set(d.fields.named))
        if names:
            out.append(f"{d.method} {d.path}: {', '.join(names)} (unknown: {d.fields.unknown})")
    return tuple(out)


def _rule_for(rules: tuple[RouteRule, ...], route: Route, method: str) -> RouteRule | None:
    for rule in rules:  # the loader guarantees at most one rule matches
        if rule.methods and method not in rule.methods:
            continue
        if patterns.covers(rule.path, route.path):
            return rule
    return None


def _state_changing(route: Route, rule: RouteRule | None) -> tuple[bool, str]:
    """The policy's flag merged with the built-in list, and who said so."""
    said = [who for who, flag in (("policy", bool(rule and rule.state_changing)),
                                  ("built-in", is_state_changing(route.path))) if flag]
    return bool(said), "+".join(said)


def _deny(route: Route, method: str, reason: str, rule: RouteRule | None = None,
          audience: Audience | None = None) -> Decision:
    changes, by = _state_changing(route, rule)
    return Decision(
        method=method, path=route.path, kind=route.kind, action="deny", reason=reason,
        audience=audience.name if audience else "",
        state_changing=changes, state_changing_by=by,
        upstream_guarded=route.guarded, rule_line=rule.line if rule else 0,
    )


def _fields(route: Route, method: str, audience: Audience, body: BodyPolicy) -> FieldRules:
    """The body fields decided on this route: the audience's own rules over the body policy's
    governed fields (a service audience may allow a ``cache_salt`` end users may not send).
    Only requests with a body are decided."""
    if route.kind != "http" or method not in BODY_METHODS:
        return FieldRules()
    named = {f: mode for key, fields in GOVERNED_FIELDS.items()
             if (mode := getattr(body, key)) != "pass" for f in fields}
    named.update(audience.fields.named)
    if body.salted:   # the perimeter's own salt replaces any client's (see _salt)
        named["cache_salt"] = "strip"
    return replace(audience.fields, named=dict(sorted(named.items())))   # every other rule as the audience's


def _media(route: Route, method: str, audience: Audience) -> tuple[MediaRules, tuple[str, ...]]:
    """The audience's media rules where a body of this route can carry media: its request model
    has a media position, or its body is not known (decided, never assumed free of media). A form
    body is not inspected."""
    body = route.request
    if not audience.media.active or route.kind != "http" or method not in BODY_METHODS:
        return MediaRules(), ()
    if body is not None and "form" in body.media_type:
        return MediaRules(), ()
    at = media_positions(tuple(body.positions())) if body is not None and body.known else ()
    if body is not None and body.known and not at:
        return MediaRules(), ()
    return audience.media, at


def _salt(route: Route, method: str, audience: Audience,
          body: BodyPolicy) -> Literal["", "principal", "audience"]:
    """Whose salt this route's bodies carry: per-principal on a keyed route; per-audience, and
    per-principal on a route without keys (its anonymous clients are one tenant), the audience's."""
    if not body.salted or route.kind != "http" or method not in BODY_METHODS:
        return ""
    if body.cache_salt == "per-principal" and audience.auth == "jwt":
        raise PlanError(f"audience {audience.name!r} (line {audience.line}): cache_salt: per-principal "
                        "with auth: jwt is not supported (a token's principal is known only at request "
                        "time, and the salts are computed when the config is generated); use "
                        "per-audience")
    return ("principal" if body.cache_salt == "per-principal" and audience.auth in ("key", "cert")
            else "audience")


def _decide(route: Route, method: str, rule: RouteRule, audience: Audience,
            networks: Mapping[str, tuple[str, ...]], body: BodyPolicy) -> Decision:
    where = f"rule at line {rule.line}"
    if not audience.allows:
        return _deny(route, method, f"{where}: audience {audience.name!r} is denied to everyone",
                     rule, audience)
    if route.kind == "mount" or method in _MOUNT_METHODS:
        return _deny(route, method, f"{where}: a mounted sub-app cannot be allowlisted exactly",
                     rule, audience)
    cidrs = tuple(sorted({c for n in audience.networks for c in networks[n]}))
    changes, by = _state_changing(route, rule)
    media, media_at = _media(route, method, audience)
    limits, by_budget = request_token_cap(route, method, audience.limits.merged(rule.limits), where)
    return Decision(
        method=method, path=route.path, kind=route.kind, action="allow",
        reason=f"{where}: audience {audience.name!r}",
        audience=audience.name, audience_kind=audience.kind, auth=audience.auth,
        roles=tuple(sorted(audience.roles)), networks=cidrs, jwt=audience.jwt,
        limits=limits, nested_caps=_nested_caps(route, method, limits.json_caps),
        fields=_fields(route, method, audience, body), salt=_salt(route, method, audience, body),
        media=media, media_at=media_at,
        state_changing=changes, state_changing_by=by, upstream_guarded=route.guarded,
        rule_line=rule.line, envelope_spec=_envelope(route, method), request_tokens_by_budget=by_budget,
        **_owner(route, method, audience, body),
    )


def request_token_cap(route: Route, method: str, limits: Limits, where: str = "") -> tuple[Limits, bool]:
    """The route's limits with its token budget's capacity and per-request token cap decided, on a
    route charged to a budget (an HTTP route with a body method and ``tokens_per_minute`` N). The
    capacity (``tokens_burst`` in the result) bounds what any t seconds admit: capacity + N x t / 60.
    With B the policy's ``tokens_burst`` (default ceil(N / 4), at most N) and M its own
    ``max_request_tokens``: M <= N keeps the cap M and the capacity max(B, M) (every request the
    cap admits fits a full bucket); otherwise (none, or over N) cap = capacity = B, since a request
    over the capacity can never be admitted (refused 400 envelope-tokens, permanent, rather than
    429 token-budget for ever). Also whether the budget set the cap (True: from B)."""
    tpm, cap = limits.tokens_per_minute, limits.max_request_tokens
    if not tpm or route.kind != "http" or method not in BODY_METHODS:
        return limits, False
    burst = limits.tokens_burst if limits.tokens_burst is not None else default_tokens_burst(tpm)
    if burst > tpm:
        raise PlanError(f"{where or f'{method} {route.path}'}: tokens_burst {burst} is more than "
                        f"tokens_per_minute {tpm} (the budget's capacity is at most one minute of it)")
    if cap is not None and cap <= tpm:
        return replace(limits, tokens_burst=max(burst, cap)), False
    return replace(limits, tokens_burst=burst, max_request_tokens=burst), True


def _response_ids(route: Route, method: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(the path parameter naming a stored response, the request model's top-level fields naming
    one, every field name of the model) of ``method route``, from the inventory."""
    params = [p for p in (patterns.PARAM.match(s) for s in patterns.segments(route.path)) if p]
    param = next((p.group(1) for p in params if p.group(1) in owner.OWNED_PARAMS), "")
    model = route.request if method in BODY_METHODS and route.request is not None else None
    names = tuple(f.name for f in model.fields) if model is not None and model.known else ()
    return param, tuple(sorted(n for n in names if owner.is_owned_field(n))), names


def _shared_responses(inventory: Inventory, decisions: list[Decision], policy: Policy) -> tuple[str, ...]:
    """"METHOD path" of the allowed routes of end-user audiences that take a stored response's id
    while the policy shares stored responses (``body: responses: shared``): any of their principals
    who learns another's id can read, cancel or continue that response (vLLM checks no owner)."""
    if policy.body.owned:
        return ()
    routes = {(m, r.path): r for r in inventory.routes if r.kind == "http" for m in r.methods}
    out = []
    for d in decisions:
        route = routes.get((d.method, d.path))
        audience = policy.audiences.get(d.audience)
        if not d.allowed or route is None or audience is None or audience.kind != "end-user":
            continue
        param, fields, _names = _response_ids(route, d.method)
        if param or fields:
            out.append(f"{d.method} {d.path}")
    return tuple(sorted(out))


def _owner(route: Route, method: str, audience: Audience, body: BodyPolicy) -> dict[str, Any]:
    """Ownership of stored responses on this route (``body: responses: owned``), from the
    inventory: its path parameter naming a response (:data:`owner.OWNED_PARAMS`), its request
    model's top-level fields naming one (:func:`owner.is_owned_field`); either: its answers are
    sealed. Needs a principal (auth key, jwt or cert), and no client-chosen response id (``request_id``) from
    end users (one could store its own answer under another's id)."""
    if not body.owned or route.kind != "http":
        return {}
    param, fields, names = _response_ids(route, method)
    if not param and not fields:
        return {}
    where = f"{method} {route.path}"
    if audience.auth == "none":
        raise PlanError(f"{where}: responses: owned binds stored responses to a principal; audience "
                        f"{audience.name!r} has auth: none (give it keys or tokens, or deny the route)")
    chosen = audience.kind == "end-user" and audience.fields.mode("request_id") == "allow"
    if "request_id" in names and chosen:
        raise PlanError(f"{where}: responses: owned, yet audience {audience.name!r} lets clients send "
                        "request_id (vLLM's id of the response they create): deny it in its fields")
    return {"owner_param": param, "owner_fields": fields, "owner_seal": True}


def _nested_caps(route: Route, method: str, caps: Mapping[str, int]) -> tuple[str, ...]:
    """The nested positions of the route's request model (through object members) where a json
    cap's name is: each capped as at the top level (``sampling_params.n``)."""
    body = route.request
    if route.kind != "http" or method not in BODY_METHODS or body is None or not body.known or not caps:
        return ()
    return named_at(caps, body.positions())


def _envelope(route: Route, method: str) -> EnvelopeSpec:
    """The fields multiplying this route's work, from its request model in the inventory (every
    multiplier when the model is not known); none for a request without a JSON body."""
    if route.kind != "http" or method not in BODY_METHODS:
        return EnvelopeSpec()
    body = route.request
    if body is not None and "form" in body.media_type:
        return EnvelopeSpec()
    known = body is not None and body.known
    if body is None or not known:
        return envelope_spec_for(None)
    return envelope_spec_for({f.name: f.types for f in body.fields}, body.positions())
