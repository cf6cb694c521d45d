"""NGINX mutation operators, each rendered by the NGINX generator: how this proxy applies each of
scanner.mutate.core's definitions (a plan transform; a switch of nginx_model.Weakening, which the
templates perimeter-http.conf, perimeter-proxy.conf, the principals map, perimeter.js and the Lua
runtime's perimeter.lua honour; a body check's rule program changed; its own model edits: a
location's match or blocks (BlockWeakening), a zone's key, the header lists), then the operators
only NGINX has. No operator edits rendered text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import scanner.mutate.core as core
from scanner.generate import nginx as generator
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx_model import (
    LUA_MODULES,
    MAIN,
    PRINCIPALS,
    Block,
    Location,
    NginxModel,
    build_model,
)
from scanner.mutate.core import NotApplicable, Operator, register, where
from scanner.output import write_text
from scanner.plan.model import Decision, Plan
from scanner.rules import Program
from scanner.runtime.nginx import built_in_njs, static_build

KIND = "nginx"
ModelEdit = core.ModelEdit[NginxModel]


# --- rendering: the weakened plan or model, written over the generated files -----------------

def _options(directory: Path) -> GenerateOptions:
    """The options ``scanner.runtime.nginx.write`` rendered ``directory`` (its ``conf``) with: the
    njs module it loads (the first), else the static build's built-in njs version; the lua module's
    directory when it loads that too (the Lua runtime)."""
    run = directory.parent / "run"
    lines = (directory / MAIN).read_text(encoding="utf-8").splitlines()
    modules = [Path(line.split('"')[1]) for line in lines if line.startswith('load_module "')]
    module = str(modules[0]) if modules else ""
    extra = {"njs_module": module} if module else {}
    lua = next((m.parent for m in modules if m.name == LUA_MODULES[-1]), None)
    if lua is not None:
        extra["lua_module"] = str(lua)
    build = None if module else static_build()     # njs built in: the static build's (its version)
    njs = built_in_njs(build.binary) if build else ""
    if njs:
        extra["njs"] = njs
    return GenerateOptions(runtime_dir=str(run), access_log=str(run / "access.log"),
                           error_log=str(run / "error.log"), extra=extra,
                           output_dir=str(directory.absolute()))


def render(directory: Path, plan: Plan, edit: ModelEdit | None = None) -> str:
    """Render ``plan`` (its model changed by ``edit``) over the files in ``directory``: the plan's
    files and the njs module (its switches); nginx.conf (process settings) stays as written."""
    model = build_model(plan, _options(directory))
    what = ""
    if edit is not None:
        model, what = edit(model, plan)
    for f in (*generator.plan_files(generator._environment(), model, plan), generator.njs_file(model)):
        write_text(directory / f.name, f.content, mode=f.mode)
    return what


def _model_op(op_id: str, family: str, target: str, title: str, catches: tuple[str, ...],
              edit: ModelEdit, needs: str = "", applies: Callable[[Plan], object] | None = None) -> None:
    """An operator that renders the plan from the generator's model changed by ``edit``;
    ``applies`` (the plan alone) may say NotApplicable before anything is read."""
    def apply(directory: Path, plan: Plan) -> str:
        if applies is not None:
            applies(plan)
        return render(directory, plan, edit)
    register(Operator(f"{KIND}.{op_id}", KIND, family, target, title, catches, apply, needs))


# --- model edits: one location's match, one zone's key ---------------------------------------

def _location(model: NginxModel, d: Decision, change: Callable[[Location], Location],
              what: str) -> tuple[NginxModel, str]:
    locs = list(model.locations)
    i = next((i for i, loc in enumerate(locs) if loc.route == d.path), -1)
    if i < 0:
        raise NotApplicable(f"no location for {d.path}")
    new = change(locs[i])
    if new == locs[i]:
        raise NotApplicable(f"{d.path}: nothing to change")
    locs[i] = new
    return replace(model, locations=tuple(locs)), f"{where(d)}: {what}"


PARAMETER = "[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255}"


def _anchor_dollar(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    return _location(model, core.template(plan), lambda loc: replace(
        loc, match=loc.match.replace('\\z"', '$"'), capture=loc.capture.replace("\\z", "$")),
        "regex anchor \\z -> $")


def _parameter_any(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    return _location(model, core.template_last(plan), lambda loc: replace(
        loc, match=loc.match.replace(PARAMETER, ".+"), capture=loc.capture.replace(PARAMETER, ".+")),
        "path parameter -> .+")


def _case_insensitive(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    return _location(model, core.template(plan), lambda loc: replace(
        loc, match=loc.match.replace('~ "^', '~* "^'), capture="(?i)" + loc.capture),
        "case-insensitive match")


def _exact_to_prefix(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    return _location(model, core.exact_get(plan),
                     lambda loc: replace(loc, match=loc.match.removeprefix("= ")),
                     "exact location -> prefix location")


def _zone_by_address(attr: str, pick: core.Pick) -> ModelEdit:
    """The zone of the route ``pick`` chooses counts per client address, not per principal."""
    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        d = pick(plan)
        zones = list(getattr(model, attr))
        name = _zone_of(model, d, attr)
        i = next(i for i, z in enumerate(zones) if z.name == name)
        if zones[i].key == "$binary_remote_addr":
            raise NotApplicable(f"{name} already counts per address")
        zones[i] = replace(zones[i], key="$binary_remote_addr")
        new = (replace(model, rate_zones=tuple(zones)) if attr == "rate_zones"
               else replace(model, conn_zones=tuple(zones)))
        return new, f"{name} ({where(d)}) keyed by $binary_remote_addr"
    return edit


def _zone_of(model: NginxModel, d: Decision, attr: str) -> str:
    loc = next((loc for loc in model.locations if loc.route == d.path), None)
    block = next((b for b in (loc.blocks if loc else ()) if d.method in b.methods), None)
    name = block and (block.rate_zone if attr == "rate_zones" else block.conn_zone)
    if not name:
        raise NotApplicable(f"{where(d)}: no {attr[:-1].replace('_', ' ')}")
    return name


def _key_route(plan: Plan) -> Decision:
    return core.pick(plan, "limited per principal",
                     lambda d: d.auth == "key" and d.limits.concurrency is not None, last=True)


def _rules(r: core.RuleEdit) -> ModelEdit:
    """The body check of the route ``r.pick`` chooses runs its rule program changed by ``r.change``
    (a new program; the other checks keep theirs)."""
    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        d = r.pick(plan)
        loc = next((loc for loc in model.locations if loc.route == d.path), None)
        check = next((b.check for b in (loc.blocks if loc else ()) if d.method in b.methods), None)
        if check is None:
            raise NotApplicable(f"no body check on {where(d)}")
        old = list(model.programs[check.program].steps)
        steps = r.change(old)
        if steps == old:
            raise NotApplicable(f"{where(d)}: nothing to change in its rule program")
        pid = f"r{len(model.programs) + 1}"
        return replace(model, programs={**model.programs, pid: Program(steps=steps)},
                       checks=tuple(replace(c, program=pid) if c.id == check.id else c for c in model.checks)
                       ), f"{where(d)}: {r.what}"
    return edit


_model_op("anchor-dollar", "loosen", "a template route's location",
          "a template location ends in $ instead of \\z (a final newline matches)", ("bypass", "upstream"),
          _anchor_dollar)
_model_op("conn-zone-by-address", "source", "a concurrency zone counted per principal",
          "a concurrency zone keyed by client address instead of principal", ("concurrency",),
          _zone_by_address("conn_zones", _key_route))


# --- switches of the generator's model: Weakening (the config), BlockWeakening (a route's blocks) --

def switched(**switches: object) -> ModelEdit:
    """The model with the given :class:`Weakening` switches (a fleet operator's: scanner.mutate.fleet)."""
    return lambda model, plan: (replace(model, weak=replace(model.weak, **switches)), "")  # type: ignore[arg-type]


def _weaken(what: str, **switches: object) -> ModelEdit:
    """The whole config with the given :class:`Weakening` switches."""
    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        weak = replace(model.weak, **switches)  # type: ignore[arg-type]
        if weak == model.weak:
            raise NotApplicable(f"{what}: nothing to change")
        return replace(model, weak=weak), what
    return edit


def _weaken_route(pick: core.Pick, what: str, checked: bool = False,
                  switches: Callable[[Block], dict[str, object]] | None = None, **fixed: object) -> ModelEdit:
    """The blocks of the route ``pick`` chooses (``checked``: only the block forwarding its method's
    checked bodies, ``<up>_checked``) with the given :class:`BlockWeakening` switches."""
    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        d = pick(plan)

        def change(loc: Location) -> Location:
            blocks = []
            for b in loc.blocks:
                if not checked or (b.check is not None and d.method in b.methods):
                    more = switches(b) if switches is not None else {}
                    b = replace(b, weak=replace(b.weak, **fixed, **more))  # type: ignore[arg-type]
                blocks.append(b)
            return replace(loc, blocks=tuple(blocks))
        if checked and not any(b.check is not None and d.method in b.methods
                               for loc in model.locations if loc.route == d.path for b in loc.blocks):
            raise NotApplicable(f"{where(d)}: no location forwarding checked bodies as sent")
        new, _ = _location(model, d, change, what)
        return new, f"{where(d)}: {what}" if what else where(d)
    return edit


# switch: the limit stays written, NGINX only logs what it would refuse

_model_op("rate-dry-run", "switch", "a rate-limited route (per principal)",
          "limit_req_dry_run on in one route's location", ("rate",),
          _weaken_route(core.rated_by_principal, "limit_req_dry_run on", rate_dry_run=True))
_model_op("rate-dry-run-address", "switch", "a rate-limited route (per client address)",
          "limit_req_dry_run on in one auth-none route's location", ("rate",),
          _weaken_route(core.rated_by_address, "limit_req_dry_run on", rate_dry_run=True))
_model_op("conn-dry-run", "switch", "a route with a concurrency limit",
          "limit_conn_dry_run on in one route's location", ("concurrency",),
          _weaken_route(core.limited, "limit_conn_dry_run on", conn_dry_run=True))


def _rate_dry_run_server(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    core.rated(plan)
    return _weaken("limit_req_dry_run on (server)", rate_dry_run=True)(model, plan)


_model_op("rate-dry-run-server", "switch", "the server", "limit_req_dry_run on for the whole server",
          ("rate",), _rate_dry_run_server)


# --- the definitions both proxies share (scanner.mutate.core.DEFINITIONS), applied to this model --

JWT_DUPLICATES = core.Setting("jwt_duplicates_read", "(every auth: jwt route) the duplicate-member scan "
                              "removed", core.token_checked)
# why a switch cannot apply to this plan's config ("" it can)
GUARDS: dict[str, Callable[[NginxModel], str]] = {
    "h2c": lambda model: "no plain listener" if model.tls_cert else "",
    "cert_any_ca": lambda model: "" if model.tls_client_ca else "the listener asks for no client certificate",
}


def _switch(model: NginxModel, field: str, value: object) -> NginxModel:
    """The model with the :class:`Weakening` switch ``field`` set to ``value``."""
    return replace(model, weak=replace(model.weak, **{field: value}))  # type: ignore[arg-type]


def _tokens_uncharged(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    d = core.token_budgeted(plan)
    if not model.token_zones:
        raise NotApplicable("no token budget in the config")
    return _weaken(f"{d.token_zone} ({where(d)}): njs charges nothing", tokens_uncharged=True)(model, plan)


def _unsettled(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    d = core.token_budgeted(plan)
    if not any(b.check is not None and b.check.tokens for loc in model.locations for b in loc.blocks):
        raise NotApplicable("no location settles a token budget")
    return _weaken(f"{d.token_zone} ({where(d)}): js_body_filter removed", unsettled=True)(model, plan)


def _cert_revoked(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    """The probe's unknown name mapped as a principal the plan no longer lists (the model's
    certificate principals, not the plan's)."""
    from scanner.probe.certs_cases import UNKNOWN_SAN

    d = core.cert_checked(plan)
    if not model.certs_json:
        raise NotApplicable(f"{PRINCIPALS}: no certificate principals")
    certs = {f"san:{UNKNOWN_SAN}": ["revoked", core.cert_role(plan, d)], **json.loads(model.certs_json)}
    return replace(model, certs_json=json.dumps(certs, separators=(",", ":"))), \
        f"{where(d)} (every auth: cert route): a revoked principal still mapped"


EDITS: dict[str, ModelEdit] = {
    "token-budget-removed": _tokens_uncharged,
    "settlement-skipped": _unsettled,
    "upstream-errors-passed": _weaken_route(core.budgeted, "proxy_intercept_errors off where bodies are "
                                            "forwarded as sent", checked=True, checked_errors_passed=True),
    "cert-revoked-mapped": _cert_revoked,
    "principal-header-from-client": _weaken_route(core.plain_get, "the principal header from the client",
                                                  principal_from_client=True),
    "rate-zone-by-address": _zone_by_address("rate_zones", _key_route),
    "parameter-any": _parameter_any,
    "case-insensitive": _case_insensitive,
    "exact-to-prefix": _exact_to_prefix,
    "upgrade-on-plain-route": _weaken_route(core.plain_get, "", upgrade=True),
    "raw-target-forwarded": _weaken_route(core.plain_get, "", raw_target=True),
    "client-key-forwarded": _weaken("proxy_set_header Authorization", from_client=("Authorization",)),
    "vllm-header-forwarded": _weaken("proxy_set_header X-Vllm-Priority", from_client=("X-Vllm-Priority",)),
}
NGINX = core.Applier(KIND, render, _switch, GUARDS, _rules, EDITS)
core.register_definitions(NGINX)


# only NGINX: the client's own X-Forwarded-For appended, the method test, the proxying locations

def _xff_appended(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    if model.trusted_proxies:
        raise NotApplicable("X-Forwarded-For is passed on from the plan's trusted proxies only")
    what = "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for"
    return _weaken(what, xff_appended=True)(model, plan)


_model_op("xff-appended", "source", "every proxying location",
          "X-Forwarded-For: the client's own with its address appended ($proxy_add_x_forwarded_for), not the "
          "address alone", ("upstream",), _xff_appended)
_model_op("method-check-removed", "remove", "a GET route", "one route's method check removed", ("matrix",),
          _weaken_route(core.plain_get, "", method_unchecked=True))
_model_op("jwt-duplicates-read", "remove", "the token's strict JSON reading",
          "a member named twice in a token's claims or header is read (the last copy, as JSON.parse "
          "does) instead of refused", ("identity",),
          lambda model, plan: core.setting(NGINX, JWT_DUPLICATES, core.token_checked(plan))(model, plan),
          needs=core.JWT_NEEDS)


def _exposed(match: Callable[[Plan], str], what: Callable[[Plan], str]) -> ModelEdit:
    """A proxying location ``match`` after ``location /``."""
    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        return _weaken(what(plan), exposed=(*model.weak.exposed, match(plan)))(model, plan)
    return edit


_model_op("prefix-location-added", "expose", "the routes under /v1/",
          "a prefix location proxies everything under /v1/", ("bypass", "sweep"),
          _exposed(lambda plan: "/v1/", lambda plan: "location /v1/"))
_model_op("regex-location-added", "expose", "a denied route", "a regex location proxies a denied route",
          ("matrix",), _exposed(lambda plan: f'~ "^{re.escape(core.denied_path(plan))}"',
                                lambda plan: f"location ~ ^{core.denied_path(plan)}"))
_model_op("catch-all-proxied", "expose", "the catch-all location",
          "the catch-all location proxies instead of refusing", ("matrix", "sweep"),
          _weaken("location / proxied", catch_all_proxied=True))
_model_op("denied-route-proxied", "expose", "a denied route", "a denied route gets a proxying location",
          ("matrix",), _exposed(lambda plan: f"= {core.denied_path(plan)}",
                                lambda plan: f"location = {core.denied_path(plan)}"))


def _x10(timeout: str | None) -> str:
    """An NGINX duration ("600s", "1500ms") ten times longer."""
    if not timeout:
        raise NotApplicable("no upstream timeout")
    unit = "ms" if timeout.endswith("ms") else "s"
    return f"{int(timeout.removesuffix(unit)) * 10}{unit}"


_model_op("timeout-raised-on-one-path", "raise", "a route's location forwarding checked bodies as sent",
          "one route's upstream timeout x10 on one of its ways of forwarding (its <up>_checked location)",
          ("timeout",),
          _weaken_route(lambda plan: core.pick(
              plan, "with an output budget and an upstream timeout the witness can outlast",
              lambda x: x.enforced_budget is not None and core.outlastable(x)),
              "proxy_read_timeout x10 where bodies are forwarded as sent", checked=True,
              switches=lambda b: {"checked_timeout": _x10(b.timeout)}),
          needs="limits.timeout_s the witness can outlast (27.5 s at most) on a route with an output budget")
