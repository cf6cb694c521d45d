"""NGINX mutation operators, each rendered by the NGINX generator: the plan's weakenings
(scanner.mutate.core), or the generator's model changed in one marked place (a location's match, a
zone's key, a body check's rule program without one of its steps) or by a switch of
nginx_model.Weakening / BlockWeakening that the templates (perimeter-http.conf, perimeter-proxy.conf,
the principals map, perimeter.js) honour. No operator edits rendered text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import scanner.mutate.core as core
from scanner.generate import nginx as generator
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx_model import MAIN, PRINCIPALS, Block, Location, NginxModel, build_model
from scanner.mutate.core import NotApplicable, Operator, register, where
from scanner.output import write_text
from scanner.plan.model import Decision, Plan
from scanner.rules import Keys, Program, Step
from scanner.runtime.nginx import built_in_njs, static_build

KIND = "nginx"
ModelEdit = Callable[[NginxModel, Plan], tuple[NginxModel, str]]


# --- rendering: the weakened plan or model, written over the generated files -----------------

def _options(directory: Path) -> GenerateOptions:
    """The options ``scanner.runtime.nginx.write`` rendered ``directory`` (its ``conf``) with: the
    njs module it loads, else the static build's built-in njs version."""
    run = directory.parent / "run"
    lines = (directory / MAIN).read_text(encoding="utf-8").splitlines()
    module = next((line.split('"')[1] for line in lines if line.startswith('load_module "')), "")
    extra = {"njs_module": module} if module else {}
    build = None if module else static_build()     # njs built in: the static build's (its version)
    njs = built_in_njs(build.binary) if build else ""
    if njs:
        extra["njs"] = njs
    return GenerateOptions(runtime_dir=str(run), access_log=str(run / "access.log"),
                           error_log=str(run / "error.log"), extra=extra)


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


core.register_plan_operators(KIND, render)


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


def _program(pick: core.Pick, change: Callable[[list[Step]], list[Step]], what: str) -> ModelEdit:
    """The body check of the route ``pick`` chooses runs its rule program changed by ``change``
    (a new program; the other checks keep theirs)."""
    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        d = pick(plan)
        loc = next((loc for loc in model.locations if loc.route == d.path), None)
        check = next((b.check for b in (loc.blocks if loc else ()) if d.method in b.methods), None)
        if check is None:
            raise NotApplicable(f"no body check on {where(d)}")
        old = list(model.programs[check.program].steps)
        steps = change(old)
        if steps == old:
            raise NotApplicable(f"{where(d)}: nothing to change in its rule program")
        pid = f"r{len(model.programs) + 1}"
        return replace(model, programs={**model.programs, pid: Program(steps=steps)},
                       checks=tuple(replace(c, program=pid) if c.id == check.id else c for c in model.checks)
                       ), f"{where(d)}: {what}"
    return edit


def _without(op: str) -> Callable[[list[Step]], list[Step]]:
    return lambda steps: [s for s in steps if s.op != op]


def _written_x10(steps: list[Step]) -> list[Step]:
    return [core.written_x10(s) if s.op == "budget" else s for s in steps]


def _unsalted(steps: list[Step]) -> list[Step]:
    """No salt step, and the client's cache_salt allowed through the field rules."""
    return [s.model_copy(update={"modes": {**s.modes, "cache_salt": "allow"}}) if isinstance(s, Keys) else s
            for s in _without("salt")(steps)]


_model_op("anchor-dollar", "loosen", "a template route's location",
          "a template location ends in $ instead of \\z (a final newline matches)", ("bypass", "upstream"),
          _anchor_dollar)
_model_op("parameter-any", "loosen", "a template route's location",
          "a template parameter matches .+ (any characters, slashes too)",
          ("bypass", "upstream"), _parameter_any)
_model_op("case-insensitive", "loosen", "a template route's location", "a template location matches any case",
          ("bypass", "matrix"), _case_insensitive)
_model_op("exact-to-prefix", "loosen", "an exact GET route's location",
          "an exact location made a prefix location", ("bypass", "sweep"), _exact_to_prefix)
_model_op("rate-zone-by-address", "source", "a rate zone counted per principal",
          "a rate zone keyed by client address instead of principal", ("rate",),
          _zone_by_address("rate_zones", _key_route))
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


# source: a fact the perimeter decides taken from the client

_model_op("network-from-forwarding-header", "source", "the server",
          "client address taken from X-Forwarded-For", ("spoof", "matrix"),
          _weaken("set_real_ip_from everywhere", real_ip_from_anyone=True))
_model_op("host-from-client", "source", "every proxying location", "the client's Host forwarded upstream",
          ("upstream",), _weaken("proxy_set_header Host $http_host", host_from_client=True))


def _xff_appended(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    if model.trusted_proxies:
        raise NotApplicable("X-Forwarded-For is passed on from the plan's trusted proxies only")
    what = "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for"
    return _weaken(what, xff_appended=True)(model, plan)


_model_op("xff-appended", "source", "every proxying location",
          "X-Forwarded-For: the client's own with its address appended ($proxy_add_x_forwarded_for), not the "
          "address alone", ("upstream",), _xff_appended)
_model_op("request-id-from-client", "forward", "every proxying location",
          "the client's X-Request-Id reaches vLLM ($http_x_request_id, not NGINX's $request_id)",
          ("upstream",),
          _weaken("proxy_set_header X-Request-Id $http_x_request_id", request_id_from_client=True))
_model_op("principal-header-from-client", "source", "a GET route",
          "one route takes the principal header from the client", ("upstream",),
          _weaken_route(core.plain_get, "", principal_from_client=True))


# remove: a check the plan has no separate word for (the method test, the njs module)

_model_op("method-check-removed", "remove", "a GET route", "one route's method check removed", ("matrix",),
          _weaken_route(core.plain_get, "", method_unchecked=True))


_model_op("forbidden-field-check-removed", "remove", "a route with field rules and JSON caps",
          "one route passes the fields the policy forbids", ("limits",),
          _program(core.field_checked, _without("keys"), "rule program without keys"))
_model_op("media-check-removed", "remove", "a route with media rules",
          "one route passes any media URL, data and embeddings", ("media",),
          _program(core.media_checked, _without("media"), "rule program without media"))
_model_op("written-budget-raised", "raise", "a route with an output budget written in",
          "one route writes its output budget x10 into the bodies without one (its caps unchanged)",
          ("limits",), _program(core.budget_written, _written_x10, "its budget step writes x10"))
_model_op("budget-not-enforced", "remove", "a route with an output budget",
          "one route forwards bodies without an output budget as sent", ("limits",),
          _program(core.budgeted, _without("budget"), "rule program without budget"))


def _tokens_uncharged(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    d = core.token_budgeted(plan)
    if not model.token_zones:
        raise NotApplicable("no token budget in the config")
    return _weaken(f"{d.token_zone} ({where(d)})", tokens_uncharged=True)(model, plan)


_model_op("token-budget-removed", "remove", "a token zone",
          "one token zone's budget removed (njs charges nothing)", ("token-budget",), _tokens_uncharged,
          needs="limits.tokens_per_minute")


def _unsettled(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    d = core.token_budgeted(plan)
    if not any(b.check is not None and b.check.tokens for loc in model.locations for b in loc.blocks):
        raise NotApplicable("no location settles a token budget")
    return _weaken(f"{d.token_zone} ({where(d)}): js_body_filter removed", unsettled=True)(model, plan)


_model_op("settlement-skipped", "remove", "the token-budget locations",
          "no answer settles its charge (the njs body filter removed: every request keeps its admitted "
          "envelope)", ("token-budget",), _unsettled, needs="limits.tokens_per_minute")


def _owner_unbound(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    core.owned(plan)
    return _weaken("ownerTag computed without the principal", owner_unbound=True)(model, plan)


_model_op("ownership-unbound", "remove", "the njs module's response seal",
          "stored responses' seals not bound to the principal (any principal's seal is every principal's)",
          ("ownership",), _owner_unbound, needs="body.responses")


def _any_key(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    first = sorted(plan.principals, key=lambda p: p.name)
    if not first:
        raise NotApplicable("no principals")
    return _weaken(f"unknown keys -> {first[0].name}", any_key=(first[0].name, first[0].role))(model, plan)


_model_op("any-key-accepted", "remove", "the principals map", "an unknown key is taken for a principal",
          ("matrix",), _any_key)


# expose: something outside the allowlist reachable

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
_model_op("upgrade-on-plain-route", "expose", "a GET route", "one plain route passes WebSocket upgrades",
          ("upstream", "matrix"), _weaken_route(core.plain_get, "", upgrade=True))


def _h2c(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    if model.tls_cert:
        raise NotApplicable("no plain listener")
    return _weaken(f"listen {model.listen} http2", h2c=True)(model, plan)


# NGINX 1.22's port then speaks HTTP/2 only (unreachable)
_model_op("h2c-accepted", "expose", "the listener",
          "the listener also speaks HTTP/2 in clear text (prior knowledge)", ("protocol", "unreachable"),
          _h2c)
_model_op("grpc-accepted", "expose", "the server",
          "gRPC-shaped requests (content-type application/grpc) no longer refused", ("protocol",),
          _weaken("the application/grpc refusal dropped", grpc_accepted=True))


# forward: what reaches vLLM

_model_op("raw-target-forwarded", "forward", "a GET route", "one route forwards the raw request target",
          ("upstream", "bypass"), _weaken_route(core.plain_get, "", raw_target=True))
_model_op("client-key-forwarded", "forward", "every proxying location",
          "the client's Authorization forwarded upstream", ("upstream",),
          _weaken("proxy_set_header Authorization", from_client=("Authorization",)))
_model_op("upstream-errors-passed", "remove", "a route's location forwarding checked bodies as sent",
          "vLLM's 5xx bodies reach the client on one of a route's ways of forwarding (proxy_intercept_errors "
          "off in its <up>_checked location)", ("upstream",),
          _weaken_route(core.budgeted, "proxy_intercept_errors off where bodies are forwarded as sent",
                        checked=True, checked_errors_passed=True))


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


def _upstream_keyed(plan: Plan) -> None:
    if not plan.upstream.api_key_file:
        raise NotApplicable("the policy sets no upstream.api_key_file")


def _upstream_key(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    _upstream_keyed(plan)
    return _weaken("the upstream key include dropped", upstream_key_dropped=True)(model, plan)


_model_op("upstream-key-not-presented", "forward", "every proxying location",
          "vLLM's own key no longer sent upstream", ("upstream",), _upstream_key,
          needs="upstream.api_key_file", applies=_upstream_keyed)
_model_op("client-headers-forwarded", "forward", "every proxying location",
          "every client header forwarded (hop-by-hop, spoofable)", ("upstream",),
          _weaken("proxy_pass_request_headers on", client_headers=True))
_model_op("vllm-header-forwarded", "forward", "every proxying location",
          "X-Vllm-Priority from the client forwarded (queue jumping)", ("upstream",),
          _weaken("proxy_set_header X-Vllm-Priority", from_client=("X-Vllm-Priority",)))


_model_op("salt-not-rewritten", "forward", "a salted route",
          "one route forwards the client's cache_salt (no tenant salt)", ("limits",),
          _program(core.salted, _unsalted, "rule program without salt"), needs="body.cache_salt")


# --- bearer tokens (auth: jwt): the njs verification weakened (Weakening's jwt switches) -------

JWT_NEEDS = "auth: jwt"


def _jwt(what: str, **switches: object) -> ModelEdit:
    """Every auth: jwt route's token verification with the given switches of the njs module."""
    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        d = core.token_checked(plan)
        return _weaken(f"{where(d)} (every auth: jwt route): {what}", **switches)(model, plan)
    return edit


_model_op("jwt-signature-unchecked", "remove", "the token verification",
          "a token whose signature does not verify is admitted", ("identity",),
          _jwt("the signature's verdict ignored", jwt_signature_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-audience-unchecked", "remove", "the token's audience",
          "a token for another audience is admitted", ("identity",),
          _jwt("the audience check removed", jwt_audience_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-expiry-unchecked", "remove", "the token's expiry",
          "an expired token is admitted", ("identity",),
          _jwt("the exp check removed", jwt_expiry_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-issuer-unchecked", "remove", "the token's issuer",
          "a token from another issuer is admitted", ("identity",),
          _jwt("the issuer check removed", jwt_issuer_unchecked=True), needs=JWT_NEEDS)
_model_op("jwt-issuer-prefix", "remove", "the token's issuer",
          "a token whose issuer merely starts with an allowed one is admitted (the exact match loosened to "
          "a prefix: https://idp.example/realms/llm2 passes for .../llm)", ("identity",),
          _jwt("the issuer compared as a prefix", jwt_issuer_prefix=True), needs=JWT_NEEDS)
_model_op("jwt-duplicates-read", "remove", "the token's strict JSON reading",
          "a member named twice in a token's claims or header is read (the last copy, as JSON.parse "
          "does) instead of refused", ("identity",),
          _jwt("the duplicate-member scan removed", jwt_duplicates_read=True), needs=JWT_NEEDS)
_model_op("jwt-crit-ignored", "remove", "the token's crit header",
          "a token naming an extension nobody understands in crit is admitted", ("identity",),
          _jwt("the crit check removed", jwt_crit_ignored=True), needs=JWT_NEEDS)
_model_op("jwt-trailing-accepted", "remove", "the token's form",
          "a token followed by '.', '..' or '==' is admitted (the trailing characters stripped before its "
          "form is checked, as lax JWT libraries do)", ("identity",),
          _jwt("trailing dots and padding stripped from the token", jwt_trailing_accepted=True),
          needs=JWT_NEEDS)
_model_op("principal-namespace-collision", "source", "the token principal's kind",
          "a token principal named by its claim alone (no jwt:ID: prefix): a subject equal to a key "
          "principal's name is that principal (its header, log name, seals)", ("identity",),
          _jwt("the token principal's jwt:ID: prefix dropped", jwt_unprefixed=True), needs=JWT_NEEDS)


# --- client certificates (auth: cert): the listener's verification and the njs name check -----

CERT_NEEDS = "auth: cert"


def _cert_any_ca(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    d = core.cert_checked(plan)
    if not model.tls_client_ca:
        raise NotApplicable("the listener asks for no client certificate")
    return _weaken(f"{where(d)} (every auth: cert route): client certificates not verified",
                   cert_any_ca=True)(model, plan)


_model_op("cert-any-ca", "remove", "the client certificate's verification",
          "any CA accepted: ssl_verify_client optional_no_ca, and the verification result unread (a "
          "certificate from another CA, or expired, names its principal)", ("mtls",), _cert_any_ca,
          needs=CERT_NEEDS)


def _cert_anyone(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    d = core.cert_checked(plan)
    return _weaken(f"{where(d)} (every auth: cert route): an unknown certificate names 'anyone'",
                   cert_anyone=core.cert_role(plan, d))(model, plan)


_model_op("cert-san-unchecked", "remove", "the client certificate's name",
          "any verified certificate is a principal (its URI SAN and subject not looked up)", ("mtls",),
          _cert_anyone, needs=CERT_NEEDS)


def _cert_fallback(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    d = core.cert_checked(plan)
    return _weaken(f"{where(d)} (every auth: cert route): an unlisted URI SAN falls back to the subject",
                   cert_subject_fallback=True)(model, plan)


_model_op("cert-san-fallback", "remove", "the client certificate's name",
          "a certificate whose URI SAN names nobody (a revoked SPIFFE ID) is named by its subject instead "
          "(the fallback SPIFFE semantics forbid)", ("mtls",), _cert_fallback, needs=CERT_NEEDS)


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


_model_op("cert-revoked-mapped", "remove", "a revoked certificate principal",
          "a principal the plan no longer lists is still mapped (the principals file not regenerated): "
          "the probe's unknown name stands for it", ("mtls",), _cert_revoked, needs=CERT_NEEDS)


# --- the listener's TLS: legacy versions and every suite of the library ---------------------------

TLS_NEEDS = "listen.tls"


def _tls_legacy(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
    if plan.listen.tls is None:
        raise NotApplicable("the listener speaks plain HTTP (no listen.tls)")
    return _weaken("listener: ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3, ssl_ciphers ALL:@SECLEVEL=0",
                   tls_legacy=True)(model, plan)


_model_op("tls-legacy-versions", "add", "the listener's TLS versions and suites",
          "TLS 1.0 and 1.1 admitted on the listener, with every cipher suite at security level 0",
          ("tls",), _tls_legacy, needs=TLS_NEEDS)
