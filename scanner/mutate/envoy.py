"""Envoy mutation operators, each rendered by the Envoy generator: how this proxy applies each of
scanner.mutate.core's definitions (a plan transform; a switch of EnvoyWeakening, which the YAML and
Lua templates honour; a route's rule program changed; its own model edits: a route's match or
filters, the header lists), then the operators only Envoy has (a route added or opened, a rate
filter's buckets, a cluster's thresholds, shadow mode, retries). No operator edits rendered text."""

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
from scanner.rules import Program

KIND = "envoy"
ENVOY = "envoy.yaml"
ModelEdit = core.ModelEdit[EnvoyModel]


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


def _switched(what: str, **switches: object) -> ModelEdit:
    """A model edit: the config-wide switches ``switches`` of EnvoyWeakening set."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        if "xff_trusted_hops" in switches and model.trusted_proxies:
            raise NotApplicable("X-Forwarded-For is believed from the plan's trusted proxies only")
        return replace(model, weak=replace(model.weak, **switches)), what  # type: ignore[arg-type]
    return edit


def _rules(r: core.RuleEdit) -> ModelEdit:
    """The route of ``r.pick`` gets a copy of its Lua group whose rule program is changed by
    ``r.change``, rendered from the model."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        d = r.pick(plan)
        name = f"allow:{d.method} {d.path}"
        route = next((x for x in model.routes if x.name == name), None)
        group = next((g for g in model.lua_groups if route and g.id == route.lua_group), None)
        programs = dict(model.programs)
        if route is None or group is None or not group.program:
            raise NotApplicable(f"{where(d)}: no rule program")
        old = list(programs[group.program].steps)
        steps = r.change(old)
        if steps == old:
            raise NotApplicable(f"{where(d)}: nothing to change in its rule program")
        pid, gid = f"{group.program}x", f"{group.id}x"
        programs[pid] = Program(steps=steps)
        routes = tuple(replace(x, lua_group=gid) if x.name == name else x for x in model.routes)
        return replace(model, routes=routes, programs=tuple(programs.items()),
                       lua_groups=(*model.lua_groups, replace(group, id=gid, program=pid))), \
            f"{where(d)}: {r.what}"
    return edit


# --- the definitions both proxies share (scanner.mutate.core.DEFINITIONS), applied to this model --

def _rewritten(model: EnvoyModel) -> str:
    if not [r for r in model.routes if not r.status and not r.grpc]:
        return "the generated config sets no Host of its own (the client's reaches vLLM)"
    return ""


# why a switch cannot apply to this plan's config ("" it can)
GUARDS: dict[str, Callable[[EnvoyModel], str]] = {
    "cert_any_ca": lambda model: "" if model.listen_client_ca else "no validation_context",
    "host_from_client": _rewritten,
    "upstream_key_dropped":
        lambda model: "" if model.upstream_key_file else "no Authorization added upstream",
    "xff_from_anyone": lambda model: "X-Forwarded-For is believed from the plan's trusted proxies only"
    if model.trusted_proxies else "",
    "tls_legacy": lambda model: "" if model.listen_tls else "the listener has no TLS context",
}


def _switch(model: EnvoyModel, field: str, value: object) -> EnvoyModel:
    """The model with the :class:`EnvoyWeakening` switch ``field`` set to ``value``."""
    return replace(model, weak=replace(model.weak, **{field: value}))  # type: ignore[arg-type]


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


def _unsettled(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d, name = _token_filter(model, plan)
    return _switched(f"{d.token_zone} ({where(d)})", unsettled=(*model.weak.unsettled, name))(model, plan)


def _errors_passed(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.budgeted(plan)
    name = _allowed(model, d).name
    return _switched(f"{where(d)}: perimeter.upstream_errors disabled",
                     errors_passed=(*model.weak.errors_passed, name))(model, plan)


def _key_forwarded(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    if "authorization" not in model.request_headers_to_remove:
        raise NotApplicable("authorization is not removed from requests")
    removed = tuple(h for h in model.request_headers_to_remove if h != "authorization")
    return replace(model, request_headers_to_remove=removed), "authorization kept"


def _kept(name: str, what: str) -> ModelEdit:
    """A model edit: the client's header ``name`` (lower case) passed on by the Lua's allowlist."""
    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        if name in model.kept_headers:
            raise NotApplicable(f"{name} is passed on already")
        return replace(model, kept_headers=tuple(sorted((*model.kept_headers, name)))), what
    return edit


def _principal_from_client(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    name = PRINCIPAL_HEADER.lower()
    if name not in model.request_headers_to_remove:
        raise NotApplicable(f"{name} is not removed from requests")
    removed = tuple(h for h in model.request_headers_to_remove if h != name)
    return replace(model, request_headers_to_remove=removed,
                   kept_headers=tuple(sorted({*model.kept_headers, name})),
                   weak=replace(model.weak, principal_from_client=True)), f"{name} kept"


def _upgrade(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.plain_get(plan)
    name = f"allow:{d.method} {d.path}"
    if not any(r.name == name for r in model.routes):
        raise NotApplicable(f"no route {name}")
    routes = tuple(replace(r, websocket=True) if r.name == name else r for r in model.routes)
    kept = {*model.kept_headers, "upgrade", "connection", "sec-websocket-key", "sec-websocket-version"}
    return replace(model, routes=routes, kept_headers=tuple(sorted(kept))), where(d)


def _exact_to_prefix(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    d = core.exact_get(plan)
    route = _allowed(model, d)
    if not route.path:
        raise NotApplicable(f"{where(d)}: no exact path match")
    new = replace(route, path="", prefix=route.path)
    return replace(model, routes=_swapped(model.routes, route, new)), f"{where(d)}: path -> prefix"


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


EDITS: dict[str, ModelEdit] = {
    "token-budget-removed": _tokens_removed,
    "settlement-skipped": _unsettled,
    "upstream-errors-passed": _errors_passed,
    "cert-revoked-mapped": _cert_revoked,
    "principal-header-from-client": _principal_from_client,
    "rate-zone-by-address": _rate_by_address,
    "parameter-any": _parameter_any,
    "case-insensitive": _case_insensitive,
    "exact-to-prefix": _exact_to_prefix,
    "upgrade-on-plain-route": _upgrade,
    "raw-target-forwarded": _switched("normalize_path off", raw_target=True),
    "client-key-forwarded": _key_forwarded,
    "vllm-header-forwarded": _kept("x-vllm-priority", "x-vllm-priority kept"),
}
core.register_definitions(core.Applier(KIND, render, _switch, GUARDS, _rules, EDITS))


# --- only Envoy ----------------------------------------------------------------------------------

_model_op("xff-hops-raised", "source", "the listener",
          "X-Forwarded-For's trusted hop count raised to 1: the client's own X-Forwarded-For names the "
          "address vLLM is told", ("upstream",), _switched("xff_num_trusted_hops 1", xff_trusted_hops=1))
_model_op("anchor-dropped", "loosen", "a template route's match",
          "a template route's end anchor dropped (longer paths match)", ("matrix", "bypass", "sweep"),
          _anchor_dropped)
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
