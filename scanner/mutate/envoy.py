"""Envoy mutation operators: the plan's weakenings rendered by the Envoy generator, or the
generator's model changed in one marked place (a route's match or filters, a route added or opened,
a rate filter's buckets, a cluster's thresholds) or by EnvoyWeakening's switches the YAML and Lua
templates honour. No operator edits rendered text."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import scanner.mutate.core as core
from scanner.generate.common import owner_secret
from scanner.generate.envoy import render_model
from scanner.generate.envoy_model import (
    BASE_CLUSTER,
    GRPC_CLUSTER,
    PRINCIPALS,
    EnvoyModel,
    RouteView,
    build_model,
)
from scanner.generate.interface import GenerateOptions
from scanner.mutate.core import NotApplicable, Operator, register, where
from scanner.output import write_text
from scanner.plan.model import PRINCIPAL_HEADER, Decision, Plan
from scanner.policy.model import CertPrincipal
from scanner.rules import Keys, Program, Step

KIND = "envoy"
ENVOY = "envoy.yaml"
ModelEdit = Callable[[EnvoyModel, Plan], tuple[EnvoyModel, str]]


# --- rendering: the weakened plan or model, written over the generated files -----------------

def render(directory: Path, plan: Plan, edit: ModelEdit | None = None) -> str:
    """Render ``plan`` (its model changed by ``edit``) over the files in ``directory`` with the
    options ``scanner.runtime.envoy.write`` used."""
    options = GenerateOptions(output_dir=str(directory.absolute()), access_log=str(directory / "access.log"))
    model = build_model(plan, options)
    what = ""
    if edit is not None:
        model, what = edit(model, plan)
    main, principals = render_model(model, owner_secret(plan))
    write_text(directory / ENVOY, main)
    write_text(directory / PRINCIPALS, principals, mode=0o600)
    return what


core.register_plan_operators(KIND, render)


def _model_op(op_id: str, family: str, target: str, title: str, catches: tuple[str, ...],
              edit: ModelEdit, needs: str = "") -> None:
    register(Operator(f"{KIND}.{op_id}", KIND, family, target, title, catches,
                      lambda directory, plan: render(directory, plan, edit), needs))


# --- model edits: one route's match, one rate filter's buckets, one cluster's thresholds -----

def _route(model: EnvoyModel, d: Decision, change: Callable[[RouteView], RouteView],
           what: str) -> tuple[EnvoyModel, str]:
    """``change`` the allowed route of ``d`` and the 405 route of its path (same match)."""
    names = {f"allow:{d.method} {d.path}", f"method:{d.path}"}
    routes = [change(r) if r.name in names else r for r in model.routes]
    if routes == list(model.routes):
        raise NotApplicable(f"{where(d)}: nothing to change")
    return replace(model, routes=tuple(routes)), f"{where(d)}: {what}"


PARAMETER = "[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255}"


def _parameter_any(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    return _route(model, core.template_last(plan),
                  lambda r: replace(r, regex=r.regex.replace(PARAMETER, ".+")), "path parameter -> .+")


def _case_insensitive(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    return _route(model, core.template(plan), lambda r: replace(r, regex="(?i)" + r.regex) if r.regex else r,
                  "case-insensitive regex")


def _anchor_dropped(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    return _route(model, core.template(plan), lambda r: replace(r, regex=r.regex.removesuffix("$") + ".*"),
                  "end anchor dropped (a prefix of the path matches)")


def _rate_by_address(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.rated_by_principal(plan)
    name = next((r.rate_filter for r in model.routes if r.name == f"allow:{d.method} {d.path}"), "")
    filters = [replace(f, per_address=True) if f.name == name and not f.per_address else f
               for f in model.rate_filters]
    if not name or filters == list(model.rate_filters):
        raise NotApplicable(f"{where(d)}: no rate filter per principal")
    return replace(model, rate_filters=tuple(filters)), f"{name} ({where(d)}) keyed by client address"


def _breaker_max(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    """The circuit breakers of one concurrency zone (a cluster per principal) at their maximum."""
    d = core.limited(plan)
    prefix = f"vllm.{d.audience}.c{d.limits.concurrency}."
    big = 2 ** 31 - 1
    new = tuple(replace(c, max_requests=big, max_pending=big) if c.name.startswith(prefix) and c.max_requests
                else c for c in model.clusters)
    if new == model.clusters:
        raise NotApplicable(f"{where(d)}: no circuit breaker named {prefix}*")
    return replace(model, clusters=new), f"{prefix}* ({where(d)}): circuit breaker thresholds {big}"


def _weakened(op: str, pick: Callable[[Plan], Decision],
              change: Callable[[Step], Step | None] = lambda s: None, ops: tuple[str, ...] = (),
              said: str = "") -> ModelEdit:
    """A model edit: the route of ``pick(plan)`` gets a copy of its Lua group whose rule program has
    each ``op`` step (and each of ``ops``) changed (None: removed), rendered from the model."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        d = pick(plan)
        name = f"allow:{d.method} {d.path}"
        route = next((r for r in model.routes if r.name == name), None)
        group = next((g for g in model.lua_groups if route and g.id == route.lua_group), None)
        programs = dict(model.programs)
        if route is None or group is None or not group.program:
            raise NotApplicable(f"{where(d)}: no rule program")
        old = programs[group.program]
        steps = [t for t in (change(s) if s.op in (op, *ops) else s for s in old.steps) if t is not None]
        if not any(s.op == op for s in old.steps):
            raise NotApplicable(f"{where(d)}: no {op} step")
        pid, gid = f"{group.program}x", f"{group.id}x"
        programs[pid] = Program(steps=steps)
        routes = tuple(replace(r, lua_group=gid) if r.name == name else r for r in model.routes)
        return replace(model, routes=routes, programs=tuple(programs.items()),
                       lua_groups=(*model.lua_groups, replace(group, id=gid, program=pid))), \
            f"{where(d)}: {said or f'its program without {op}'}"
    return edit


def _switched(what: str, **switches: object) -> ModelEdit:
    """A model edit: the config-wide switches ``switches`` of EnvoyWeakening set."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        if "xff_trusted_hops" in switches and model.trusted_proxies:
            raise NotApplicable("X-Forwarded-For is believed from the plan's trusted proxies only")
        return replace(model, weak=replace(model.weak, **switches)), what  # type: ignore[arg-type]
    return edit


def _client_salt(step: Step) -> Step | None:
    """The salt step gone, and the client's cache_salt kept (stripped where the salt is written)."""
    if isinstance(step, Keys) and step.modes.get("cache_salt") == "strip":
        return step.model_copy(update={"modes": {**step.modes, "cache_salt": "allow"}})
    return None if step.op == "salt" else step


_model_op("forbidden-field-check-removed", "remove", "a route with field rules and JSON caps",
          "one route passes the fields the policy forbids", ('limits',),
          _weakened("keys", core.field_checked))
_model_op("media-check-removed", "remove", "a route with media rules",
          "one route passes any media URL, data and embeddings", ('media',),
          _weakened("media", core.media_checked))
_model_op("budget-not-enforced", "remove", "a route with an output budget",
          "one route forwards bodies without an output budget as sent", ('limits',),
          _weakened("budget", core.budgeted))
_model_op("written-budget-raised", "raise", "a route with an output budget written in",
          "one route writes its output budget x10 into the bodies without one (its caps unchanged)",
          ("limits",), _weakened("budget", core.budget_written, core.written_x10,
                                 said="its program's budget step writes x10"))
_model_op("xff-hops-raised", "source", "the listener",
          "X-Forwarded-For's trusted hop count raised to 1: the client's own X-Forwarded-For names the "
          "address vLLM is told", ("upstream",), _switched("xff_num_trusted_hops 1", xff_trusted_hops=1))
_model_op("request-id-from-client", "forward", "the listener",
          "the client's X-Request-Id reaches vLLM (preserve_external_request_id)", ("upstream",),
          _switched("preserve_external_request_id", client_request_id=True))
_model_op("salt-not-rewritten", "forward", "a salted route",
          "one route forwards the client's cache_salt (no tenant salt)", ('limits',),
          _weakened("salt", core.salted, _client_salt, ops=("keys",)), needs="body.cache_salt")
_model_op("parameter-any", "loosen", "a template route's match",
          "a template parameter matches .+ (any characters, slashes too)",
          ("bypass", "upstream"), _parameter_any)
_model_op("case-insensitive", "loosen", "a template route's match", "a template route matches any case",
          ("bypass", "matrix"), _case_insensitive)
_model_op("anchor-dropped", "loosen", "a template route's match",
          "a template route's end anchor dropped (longer paths match)", ("matrix", "bypass", "sweep"),
          _anchor_dropped)
_model_op("rate-zone-by-address", "source", "a rate filter per principal",
          "a rate filter keyed by client address instead of principal", ("rate",), _rate_by_address)
_model_op("circuit-breaker-max", "switch", "a concurrency zone's clusters",
          "one concurrency zone's circuit breaker thresholds at their maximum",
          ("concurrency",), _breaker_max)


# --- the route table: a route's filters, added or opened routes ---------------------------------

def _allowed(model: EnvoyModel, d: Decision) -> RouteView:
    name = f"allow:{d.method} {d.path}"
    route = next((r for r in model.routes if r.name == name), None)
    if route is None:
        raise NotApplicable(f"no route {name}")
    return route


def _swapped(routes: tuple[RouteView, ...], old: RouteView, new: RouteView) -> tuple[RouteView, ...]:
    return tuple(new if r is old else r for r in routes)


def _lua_off(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.capped(plan)
    route = _allowed(model, d)
    return replace(model, routes=_swapped(model.routes, route, replace(route, lua_group=""))), where(d)


_model_op("lua-disabled-on-route", "remove", "a route with JSON caps",
          "the Lua filter turned off on one route (no key, role or body check)", ('matrix', 'limits', 'rate'),
          _lua_off)


def _errors_passed(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.budgeted(plan)
    name = _allowed(model, d).name
    return _switched(f"{where(d)}: perimeter.upstream_errors disabled",
                     errors_passed=(*model.weak.errors_passed, name))(model, plan)


_model_op("upstream-errors-passed", "remove", "a route with an output budget",
          "vLLM's 5xx bodies reach the client on one route (the custom_response filter off there)",
          ("upstream",), _errors_passed)


def _retry_5xx(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    retried = [r for r in model.routes if r.retry and not r.status]
    if not retried:
        raise NotApplicable("no route with a retry policy")
    return _switched(f"{len(retried)} routes: retry_on +5xx, num_retries 3", retry_5xx=True)(model, plan)


_model_op("retried-on-5xx", "forward", "every forwarding route",
          "each request resent up to 3 times when vLLM answers a 5xx (its work done again each time)",
          ("upstream",), _retry_5xx)


def _any_method(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.plain_get(plan)
    name = f"allow:{d.method} {d.path}"
    routes = tuple(replace(r, method="") if r.name == name else r for r in model.routes)
    if routes == model.routes:
        raise NotApplicable(f"no route {name} with a method match")
    return replace(model, routes=routes), where(d)


_model_op("method-match-removed", "remove", "a GET route", "one route matches every method", ('matrix',),
          _any_method)


def _owner_unbound(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    core.owned(plan)
    return _switched("owner_tag computed without the principal", owner_unbound=True)(model, plan)


_model_op("ownership-unbound", "remove", "the Lua filter's response seal",
          "stored responses' seals not bound to the principal (any principal's seal is every principal's)",
          ('ownership',), _owner_unbound, needs="body.responses")


def _token_filter(model: EnvoyModel, plan: Plan) -> tuple[Decision, str]:
    """The token budget route and the name of its token filter."""
    d = core.token_budgeted(plan)
    name = _allowed(model, d).token_filter
    if not name:
        raise NotApplicable("no token filter on that route")
    return d, name


def _tokens_removed(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    """The route's token filter turned on by no route (every route of its zone charges nothing)."""
    d, name = _token_filter(model, plan)
    routes = tuple(replace(r, token_filter="") if r.token_filter == name else r for r in model.routes)
    return replace(model, routes=routes), f"{d.token_zone} ({where(d)})"


_model_op("token-budget-removed", "remove", "a token zone",
          "one token zone's budget removed (its filter off on every route)", ('token-budget',),
          _tokens_removed, needs="limits.tokens_per_minute")


def _unsettled(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d, name = _token_filter(model, plan)
    return _switched(f"{d.token_zone} ({where(d)})", unsettled=(*model.weak.unsettled, name))(model, plan)


_model_op("settlement-skipped", "remove", "a token zone",
          "one token zone's charge not settled from usage (its bucket charged the whole reservation: the "
          "credits of settled answers ignored)", ('token-budget',), _unsettled,
          needs="limits.tokens_per_minute")


def _xff_from_anyone(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    if model.trusted_proxies:
        raise NotApplicable("X-Forwarded-For is believed from the plan's trusted proxies only")
    return _switched("RBAC on the X-Forwarded-For address", xff_from_anyone=True)(model, plan)


_model_op("network-from-forwarding-header", "source", "the listener",
          "client address taken from X-Forwarded-For", ('spoof', 'matrix'), _xff_from_anyone)


def _forwarding(name: str, regex: str = "", prefix: str = "") -> RouteView:
    """A route forwarding what its ``regex`` or ``prefix`` matches to vLLM, no check on the way."""
    return RouteView(name=name, cluster=BASE_CLUSTER, regex=regex, prefix=prefix)


def _prefix_added(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    routes = (*model.routes[:-1], _forwarding("mutant:prefix", prefix="/v1/"), model.routes[-1])
    return replace(model, routes=routes), "prefix /v1/"


def _regex_added(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    path = core.denied_path(plan)
    route = _forwarding("mutant:regex", regex=f"^{re.escape(path)}.*")
    return replace(model, routes=(route, *model.routes)), f"regex ^{path}"


def _opened(routes: tuple[RouteView, ...], name: str, cluster: str = BASE_CLUSTER) -> tuple[RouteView, ...]:
    """The refusing route ``name`` forwarding to ``cluster`` instead (its match and rule kept)."""
    old = next((r for r in routes if r.name == name), None)
    if old is None:
        raise NotApplicable(f"no route {name}")
    return _swapped(routes, old, replace(old, status=0, reason="", allow="", cluster=cluster))


def _catch_all(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    return replace(model, routes=_opened(model.routes, "deny:unknown")), "catch-all forwarded"


def _denied(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    path = core.denied_path(plan)
    return replace(model, routes=_opened(model.routes, f"deny:{path}")), path


def _grpc_denied(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    g = plan.grpc
    denied = next((d.path for d in (g.decisions if g else ()) if not d.allowed), "")
    if not denied or model.grpc is None:
        raise NotApplicable("no gRPC listener with a denied method")
    routes = _opened(model.grpc.routes, f"deny:{denied}", GRPC_CLUSTER)
    return replace(model, grpc=replace(model.grpc, routes=routes)), denied


_model_op("prefix-route-added", "expose", "the routes under /v1/",
          "a prefix route forwards everything under /v1/", ('bypass', 'sweep'), _prefix_added)
_model_op("regex-route-added", "expose", "a denied route",
          "a regex route (first in the table) forwards a denied route", ('matrix',), _regex_added)
_model_op("catch-all-forwarded", "expose", "the catch-all route",
          "the catch-all route forwards instead of refusing", ('bypass', 'matrix', 'sweep'), _catch_all)
_model_op("denied-route-forwarded", "expose", "a denied route", "a denied route is forwarded",
          ('matrix',), _denied)
_model_op("grpc-denied-method-forwarded", "expose", "a denied gRPC method",
          "a gRPC method the plan denies is forwarded to vLLM's gRPC server", ('grpc',), _grpc_denied,
          needs="grpc")


_model_op("raw-target-forwarded", "forward", "the listener",
          "paths are matched and forwarded raw (no normalisation)", ('upstream', 'bypass'),
          _switched("normalize_path off", raw_target=True))


def _key_forwarded(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    if "authorization" not in model.request_headers_to_remove:
        raise NotApplicable("authorization is not removed from requests")
    removed = tuple(h for h in model.request_headers_to_remove if h != "authorization")
    return replace(model, request_headers_to_remove=removed), "authorization kept"


_model_op("client-key-forwarded", "forward", "every route", "the client's Authorization forwarded upstream",
          ('upstream',), _key_forwarded)


def _upstream_keyed(plan: Plan) -> None:
    if not plan.upstream.api_key_file:
        raise NotApplicable("the policy sets no upstream.api_key_file")


def _upstream_key(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    _upstream_keyed(plan)
    if not model.upstream_key_file:
        raise NotApplicable("no Authorization added upstream")
    return _switched("authorization not added", upstream_key_dropped=True)(model, plan)


_model_op("upstream-key-not-presented", "forward", "every route", "vLLM's own key no longer sent upstream",
          ('upstream',), _upstream_key, needs="upstream.api_key_file")


_model_op("client-headers-forwarded", "forward", "every route",
          "the header allowlist turned off (hop-by-hop, spoofable forwarded)", ('upstream',),
          _switched("drop_headers off", client_headers=True))


def _kept(name: str, what: str) -> ModelEdit:
    """A model edit: the client's header ``name`` (lower case) passed on by the Lua's allowlist."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        if name in model.kept_headers:
            raise NotApplicable(f"{name} is passed on already")
        return replace(model, kept_headers=tuple(sorted((*model.kept_headers, name)))), what
    return edit


_model_op("vllm-header-forwarded", "forward", "every route",
          "X-Vllm-Priority from the client forwarded (queue jumping)", ('upstream',),
          _kept("x-vllm-priority", "x-vllm-priority kept"))


def _principal_from_client(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    name = PRINCIPAL_HEADER.lower()
    if name not in model.request_headers_to_remove:
        raise NotApplicable(f"{name} is not removed from requests")
    removed = tuple(h for h in model.request_headers_to_remove if h != name)
    return replace(model, request_headers_to_remove=removed,
                   kept_headers=tuple(sorted({*model.kept_headers, name})),
                   weak=replace(model.weak, principal_from_client=True)), f"{name} kept"


_model_op("principal-header-from-client", "source", "every route",
          "the principal header from the client is kept", ('upstream',), _principal_from_client)


def _upgrade(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.plain_get(plan)
    name = f"allow:{d.method} {d.path}"
    if not any(r.name == name for r in model.routes):
        raise NotApplicable(f"no route {name}")
    routes = tuple(replace(r, websocket=True) if r.name == name else r for r in model.routes)
    kept = {*model.kept_headers, "upgrade", "connection", "sec-websocket-key", "sec-websocket-version"}
    return replace(model, routes=routes, kept_headers=tuple(sorted(kept))), where(d)


_model_op("upgrade-on-plain-route", "expose", "a GET route", "one plain route passes WebSocket upgrades",
          ('upstream', 'matrix'), _upgrade)


_model_op("h2c-accepted", "expose", "the listener",
          "the listener also speaks HTTP/2 in clear text (codec_type AUTO)", ('protocol',),
          _switched("codec_type AUTO", h2c=True))


_model_op("grpc-accepted", "expose", "the listener",
          "gRPC-shaped requests (content-type application/grpc) no longer refused", ('protocol',),
          _switched("route deny:grpc removed", grpc_accepted=True))


def _any_key(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    first = sorted(plan.principals, key=lambda p: p.name)
    if not first:
        raise NotApplicable("no principals")
    return _switched(f"unknown keys -> {first[0].name}", any_key=(first[0].name, first[0].role))(model, plan)


_model_op("any-key-accepted", "remove", "the key lookup", "an unknown key is taken for a principal",
          ('matrix',), _any_key)


# switch: the limit stays written, Envoy only counts what it would refuse (shadow mode)

def _shadow(kind: str, pick: core.Pick) -> ModelEdit:
    """The route's local rate limit filter of ``kind`` (rate, token) in shadow mode, on the route
    ``pick`` chooses."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        d = pick(plan)
        route = next((r for r in model.routes if r.name == f"allow:{d.method} {d.path}"), None)
        name = (route.rate_filter if kind == "rate" else route.token_filter) if route else ""
        if not name:
            raise NotApplicable(f"{where(d)}: no {kind} filter")
        return _switched(f"{name} ({where(d)}): filter_enforced 0 (shadow)",
                         shadow=(*model.weak.shadow, name))(model, plan)
    return edit


_model_op("rate-shadow", "switch", "a rate filter per principal",
          "one rate filter in shadow mode (filter_enforced 0)", ("rate",),
          _shadow("rate", core.rated_by_principal))
_model_op("rate-shadow-address", "switch", "a rate filter per client address",
          "one auth-none rate filter in shadow mode (filter_enforced 0)", ("rate",),
          _shadow("rate", core.rated_by_address))
_model_op("token-shadow", "switch", "a token budget filter",
          "one token budget filter in shadow mode (filter_enforced 0)", ("token-budget",),
          _shadow("token", core.token_budgeted), needs="limits.tokens_per_minute")


# source / loosen edits of the rendered routes

def _host_from_client(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    rewritten = [r for r in model.routes if not r.status and not r.grpc]
    if not rewritten:
        raise NotApplicable("the generated config sets no Host of its own (the client's reaches vLLM)")
    what = f"host_rewrite_literal dropped on {len(rewritten)} routes"
    return _switched(what, host_from_client=True)(model, plan)


_model_op("host-from-client", "source", "every route",
          "the client's Host forwarded upstream (no host rewrite)", ("upstream",), _host_from_client)


def _exact_to_prefix(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.exact_get(plan)
    route = _allowed(model, d)
    if not route.path:
        raise NotApplicable(f"{where(d)}: no exact path match")
    new = replace(route, path="", prefix=route.path)
    return replace(model, routes=_swapped(model.routes, route, new)), f"{where(d)}: path -> prefix"


_model_op("exact-to-prefix", "loosen", "an exact GET route",
          "an exact route's path match made a prefix match", ("bypass", "sweep"), _exact_to_prefix)


# --- bearer tokens (auth: jwt): the Lua token checks weakened (jwt_authn verifies the signature only)

JWT_NEEDS = "auth: jwt"


def _jwt(what: str, **switches: object) -> ModelEdit:
    """Every auth: jwt route's token checks in the Lua with the given EnvoyWeakening switches."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        d = core.token_checked(plan)
        return _switched(f"{where(d)} (every auth: jwt route): {what}", **switches)(model, plan)
    return edit


_model_op("jwt-signature-unchecked", "remove", "the token verification",
          "a token that fails verification (signature, kid, alg) is admitted", ("identity",),
          _jwt("a token failing verification admitted", jwt_signature_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-audience-unchecked", "remove", "the token's audience",
          "a token for another audience is admitted (Lua's audience check removed; jwt_authn holds none)",
          ("identity",), _jwt("the audience check removed", jwt_audience_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-expiry-unchecked", "remove", "the token's expiry",
          "an expired token is admitted (Lua's exp check removed; jwt_authn's skew is its largest)",
          ("identity",), _jwt("the expiry check removed", jwt_expiry_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-crit-ignored", "remove", "the token's crit header",
          "a token naming an extension nobody understands in crit is admitted", ("identity",),
          _jwt("the crit check removed", jwt_crit_ignored=True), needs=JWT_NEEDS)
_model_op("jwt-issuer-unchecked", "remove", "the token's issuer",
          "a token from another issuer is admitted", ("identity",),
          _jwt("the issuer check removed", jwt_issuer_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-issuer-prefix", "remove", "the token's issuer",
          "a token whose issuer merely starts with an allowed one is admitted (the exact match loosened to "
          "a prefix: https://idp.example/realms/llm2 passes for .../llm)", ("identity",),
          _jwt("the issuer compared as a prefix", jwt_issuer_prefix=True), needs=JWT_NEEDS)
_model_op("jwt-trailing-accepted", "remove", "the token's form",
          "a token followed by '.', '..' or '==' is admitted (the trailing characters stripped before its "
          "form is checked; jwt_authn itself verifies such a token)", ("identity",),
          _jwt("trailing dots and padding stripped from the token", jwt_trailing_accepted=True),
          needs=JWT_NEEDS)
_model_op("principal-namespace-collision", "source", "the token principal's kind",
          "a token principal named by its claim alone (no jwt:ID: prefix): a subject equal to a key "
          "principal's name is that principal (its header, log name, seals)", ("identity",),
          _jwt("the token principal's jwt:ID: prefix dropped", jwt_unprefixed=True), needs=JWT_NEEDS)


# --- client certificates (auth: cert): the listener's validation and the Lua name check -------

CERT_NEEDS = "auth: cert"


def _cert_any_ca(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.cert_checked(plan)
    if not model.listen_client_ca:
        raise NotApplicable("no validation_context")
    return _switched(f"{where(d)} (every auth: cert route): client certificates not verified",
                     cert_any_ca=True)(model, plan)


_model_op("cert-any-ca", "remove", "the client certificate's verification",
          "any CA accepted: trust_chain_verification ACCEPT_UNTRUSTED and the Lua validated test removed "
          "(a certificate from another CA, or expired, names its principal)", ("mtls",), _cert_any_ca,
          needs=CERT_NEEDS)


def _cert_anyone(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.cert_checked(plan)
    return _switched(f"{where(d)} (every auth: cert route): an unknown certificate names 'anyone'",
                     cert_anyone=core.cert_role(plan, d))(model, plan)


_model_op("cert-san-unchecked", "remove", "the client certificate's name",
          "any verified certificate is a principal (its URI SAN and subject not looked up)", ("mtls",),
          _cert_anyone, needs=CERT_NEEDS)


def _cert_fallback(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.cert_checked(plan)
    return _switched(f"{where(d)} (every auth: cert route): an unlisted URI SAN falls back to the subject",
                     cert_subject_fallback=True)(model, plan)


_model_op("cert-san-fallback", "remove", "the client certificate's name",
          "a certificate whose URI SAN names nobody (a revoked SPIFFE ID) is named by its subject instead "
          "(the fallback SPIFFE semantics forbid)", ("mtls",), _cert_fallback, needs=CERT_NEEDS)


def _cert_revoked(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    """The probe's unknown name mapped as a principal the plan no longer lists (the model's
    certificate principals, not the plan's)."""
    from scanner.probe.certs_cases import UNKNOWN_SAN

    d = core.cert_checked(plan)
    if not model.certs:
        raise NotApplicable(f"{PRINCIPALS}: no certificate principals")
    revoked = CertPrincipal(name="revoked", role=core.cert_role(plan, d), san=UNKNOWN_SAN)
    return replace(model, certs=(*model.certs, revoked)), \
        f"{where(d)} (every auth: cert route): a revoked principal still mapped"


_model_op("cert-revoked-mapped", "remove", "a revoked certificate principal",
          "a principal the plan no longer lists is still mapped (the principals file not regenerated): "
          "the probe's unknown name stands for it", ("mtls",), _cert_revoked, needs=CERT_NEEDS)


# --- the listener's TLS: legacy versions --------------------------------------------------------

TLS_NEEDS = "listen.tls"


def _tls_legacy(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    if plan.listen.tls is None:
        raise NotApplicable("the listener speaks plain HTTP (no listen.tls)")
    if model.listen_tls is None:
        raise NotApplicable("the listener has no TLS context")
    return _switched("listener: tls_minimum_protocol_version TLSv1_0, CBC suites added",
                     tls_legacy=(*LEGACY_SUITES, *ENVOY_DEFAULT_SUITES))(model, plan)


_model_op("tls-legacy-versions", "add", "the listener's TLS versions and suites",
          "TLS 1.0 and 1.1 admitted on the listener (tls_minimum_protocol_version TLSv1_0) with the CBC "
          "suites they need (Envoy's defaults have none)", ("tls",), _tls_legacy, needs=TLS_NEEDS)


LEGACY_SUITES = ("ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA", "AES128-SHA", "ECDHE-ECDSA-AES256-SHA",
                 "ECDHE-RSA-AES256-SHA", "AES256-SHA", "DES-CBC3-SHA")
ENVOY_DEFAULT_SUITES = ("[ECDHE-ECDSA-AES128-GCM-SHA256|ECDHE-ECDSA-CHACHA20-POLY1305]",
                        "[ECDHE-RSA-AES128-GCM-SHA256|ECDHE-RSA-CHACHA20-POLY1305]",
                        "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384")
