"""NGINX mutation operators: the plan's weakenings rendered by the NGINX generator, the
generator's model changed in one marked place (a location's match, a zone's key, a body check's
rule program without one of its steps), and edits of one directive of the rendered
perimeter-http.conf / perimeter-proxy.conf / principals map."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import scanner.mutate.core as core
from scanner.generate import nginx as generator
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx_model import HTTP, MAIN, PRINCIPALS, PROXY, Location, NginxModel, build_model
from scanner.mutate.core import Apply, NotApplicable, Operator, register, where
from scanner.output import write_text
from scanner.plan.model import Decision, Plan
from scanner.rules import Keys, Program, Step

KIND = "nginx"
ModelEdit = Callable[[NginxModel, Plan], tuple[NginxModel, str]]


# --- rendering: the weakened plan or model, written over the generated files -----------------

def _options(directory: Path) -> GenerateOptions:
    """The options ``scanner.runtime.nginx.write`` rendered ``directory`` (its ``conf``) with."""
    run = directory.parent / "run"
    m = re.search(r'^load_module "([^"]+)";', (directory / MAIN).read_text(encoding="utf-8"), re.M)
    return GenerateOptions(runtime_dir=str(run), access_log=str(run / "access.log"),
                           error_log=str(run / "error.log"), extra={"njs_module": m.group(1)} if m else {})


def render(directory: Path, plan: Plan, edit: ModelEdit | None = None) -> str:
    """Render ``plan`` (its model changed by ``edit``) over the files in ``directory``; nginx.conf
    (process settings, not the plan's) and the njs module stay as written."""
    model = build_model(plan, _options(directory))
    what = ""
    if edit is not None:
        model, what = edit(model, plan)
    for f in generator.plan_files(generator._environment(), model, plan):
        write_text(directory / f.name, f.content, mode=f.mode)
    return what


core.register_plan_operators(KIND, render)


def _op(op_id: str, family: str, target: str, title: str, catches: tuple[str, ...],
        needs: str = "") -> Callable[[Apply], Apply]:
    def add(fn: Apply) -> Apply:
        register(Operator(f"{KIND}.{op_id}", KIND, family, target, title, catches, fn, needs))
        return fn
    return add


def _model_op(op_id: str, family: str, target: str, title: str, catches: tuple[str, ...],
              edit: ModelEdit, needs: str = "") -> None:
    register(Operator(f"{KIND}.{op_id}", KIND, family, target, title, catches,
                      lambda directory, plan: render(directory, plan, edit), needs))


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


# --- text edits of the rendered files --------------------------------------------------------

def _read(directory: Path, name: str) -> str:
    return (directory / name).read_text(encoding="utf-8")


def _write(directory: Path, name: str, old: str, new: str) -> None:
    if old == new:
        raise NotApplicable(f"{name}: nothing to change")
    (directory / name).write_text(new, encoding="utf-8")


def _route_span(text: str, route: str) -> tuple[int, int]:
    """The part of perimeter-http.conf that serves ``route``: from its comment to the next."""
    start = text.find(f"\n    # {route}: ")
    if start < 0:
        raise NotApplicable(f"no location for {route}")
    end = text.find("\n    # ", start + 1)
    return start, end if end > 0 else len(text)


def _edit_route(directory: Path, route: str, edit: Callable[[str], str]) -> None:
    text = _read(directory, HTTP)
    a, b = _route_span(text, route)
    _write(directory, HTTP, text, text[:a] + edit(text[a:b]) + text[b:])


def _drop_lines(pattern: str) -> Callable[[str], str]:
    rx = re.compile(r"\n[ \t]*" + pattern + r"[^\n]*")
    return lambda block: rx.sub("", block)


def _after_lines(pattern: str, line: str) -> Callable[[str], str]:
    """``line`` after each line matching ``pattern`` (same indentation)."""
    rx = re.compile(r"(\n([ \t]*)" + pattern + r"[^\n]*)")
    return lambda block: rx.sub(lambda m: f"{m.group(1)}\n{m.group(2)}{line}", block)


def _insert_location(directory: Path, location: str) -> None:
    """Add a location just before the generated ones (after ``location /``)."""
    text = _read(directory, HTTP)
    anchor = "        return 404;\n    }\n"
    at = text.index("    location / {")
    at = text.index(anchor, at) + len(anchor)
    _write(directory, HTTP, text, text[:at] + location + text[at:])


def _proxying(target: str) -> str:
    return (f"        proxy_pass {target};\n        proxy_set_header Host $proxy_host;\n"
            "        proxy_set_header Connection \"\";\n        include \"perimeter-proxy.conf\";\n")


# switch: the limit stays written, NGINX only logs what it would refuse

@_op("rate-dry-run", "switch", "a rate-limited route (per principal)",
     "limit_req_dry_run on in one route's location", ("rate",))
def _rate_dry_run(directory: Path, plan: Plan) -> str:
    d = core.rated_by_principal(plan)
    _edit_route(directory, d.path, _after_lines(r"limit_req zone=", "limit_req_dry_run on;"))
    return f"{where(d)}: limit_req_dry_run on"


@_op("rate-dry-run-address", "switch", "a rate-limited route (per client address)",
     "limit_req_dry_run on in one auth-none route's location", ("rate",))
def _rate_dry_run_address(directory: Path, plan: Plan) -> str:
    d = core.rated_by_address(plan)
    _edit_route(directory, d.path, _after_lines(r"limit_req zone=", "limit_req_dry_run on;"))
    return f"{where(d)}: limit_req_dry_run on"


@_op("conn-dry-run", "switch", "a route with a concurrency limit",
     "limit_conn_dry_run on in one route's location", ("concurrency",))
def _conn_dry_run(directory: Path, plan: Plan) -> str:
    d = core.limited(plan)
    _edit_route(directory, d.path, _after_lines(r"limit_conn perimeter_conn_", "limit_conn_dry_run on;"))
    return f"{where(d)}: limit_conn_dry_run on"


@_op("rate-dry-run-server", "switch", "the server", "limit_req_dry_run on for the whole server", ("rate",))
def _rate_dry_run_server(directory: Path, plan: Plan) -> str:
    core.rated(plan)
    text = _read(directory, HTTP)
    _write(directory, HTTP, text, text.replace("    limit_req_status 429;\n",
                                               "    limit_req_status 429;\n    limit_req_dry_run on;\n", 1))
    return "limit_req_dry_run on (server)"


# source: a fact the perimeter decides taken from the client

@_op("network-from-forwarding-header", "source", "the server", "client address taken from X-Forwarded-For",
     ("spoof", "matrix"))
def _n_xff(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    new = text.replace("    server_name _;\n", "    server_name _;\n    set_real_ip_from 0.0.0.0/0;\n"
                       "    set_real_ip_from ::/0;\n    real_ip_header X-Forwarded-For;\n", 1)
    _write(directory, HTTP, text, new)
    return "set_real_ip_from everywhere"


@_op("host-from-client", "source", "every proxying location", "the client's Host forwarded upstream",
     ("upstream",))
def _n_host(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    new = re.sub(r"proxy_set_header Host [^;\n]+;", "proxy_set_header Host $http_host;", text)
    _write(directory, HTTP, text, new)
    return "proxy_set_header Host $http_host"


@_op("principal-header-from-client", "source", "a GET route",
     "one route takes the principal header from the client", ("upstream",))
def _n_principal(directory: Path, plan: Plan) -> str:
    d = core.plain_get(plan)
    _edit_route(directory, d.path, lambda b: b.replace(
        "proxy_set_header X-Perimeter-Principal $perimeter_principal;",
        "proxy_set_header X-Perimeter-Principal $http_x_perimeter_principal;").replace(
        'proxy_set_header X-Perimeter-Principal "";',
        "proxy_set_header X-Perimeter-Principal $http_x_perimeter_principal;"))
    return where(d)


# remove: a check the plan has no separate word for (the method test, the njs module)

@_op("method-check-removed", "remove", "a GET route", "one route's method check removed", ("matrix",))
def _n_method(directory: Path, plan: Plan) -> str:
    d = core.plain_get(plan)
    _edit_route(directory, d.path, _drop_lines(r"if \(\$request_method !?[=~]"))
    return where(d)


_model_op("forbidden-field-check-removed", "remove", "a route with field rules and JSON caps",
          "one route passes the fields the policy forbids", ("limits",),
          _program(core.field_checked, _without("keys"), "rule program without keys"))
_model_op("media-check-removed", "remove", "a route with media rules",
          "one route passes any media URL, data and embeddings", ("media",),
          _program(core.media_checked, _without("media"), "rule program without media"))
_model_op("budget-not-enforced", "remove", "a route with an output budget",
          "one route forwards bodies without an output budget as sent", ("limits",),
          _program(core.budgeted, _without("budget"), "rule program without budget"))


@_op("token-budget-removed", "remove", "a token zone",
     "one token zone's budget removed (njs charges nothing)", ("token-budget",),
     needs="limits.tokens_per_minute")
def _n_tokens(directory: Path, plan: Plan) -> str:
    d = core.token_budgeted(plan)
    text = _read(directory, HTTP)
    at = text.find("map $perimeter_check $perimeter_tokens {")
    if at < 0:
        raise NotApplicable("no token budget in the config")
    end = text.index("\n}", at)
    _write(directory, HTTP, text, text[:at] + re.sub(r'(\n    c\d+ )"[^"\n]*";', r'\1"";', text[at:end])
           + text[end:])
    return f"{d.token_zone} ({where(d)})"


@_op("settlement-skipped", "remove", "the token-budget locations",
     "no answer settles its charge (the njs body filter removed: every request keeps its admitted "
     "envelope)", ("token-budget",), needs="limits.tokens_per_minute")
def _n_settle(directory: Path, plan: Plan) -> str:
    d = core.token_budgeted(plan)
    text = _read(directory, HTTP)
    _write(directory, HTTP, text, re.sub(r"\n *js_body_filter perimeter\.settle[^;\n]*;", "", text))
    return f"{d.token_zone} ({where(d)}): js_body_filter removed"


@_op("ownership-unbound", "remove", "the njs module's response seal",
     "stored responses' seals not bound to the principal (any principal's seal is every principal's)",
     ("ownership",), needs="body.responses")
def _n_unbound(directory: Path, plan: Plan) -> str:
    core.owned(plan)
    text = _read(directory, NJS)
    _write(directory, NJS, text, text.replace("update('response:' + principal + '\\n' + rid)",
                                              "update('response:' + '\\n' + rid)"))
    return "ownerTag computed without the principal"


@_op("any-key-accepted", "remove", "the principals map",
     "an unknown key is taken for a principal", ("matrix",))
def _n_any_key(directory: Path, plan: Plan) -> str:
    text = _read(directory, PRINCIPALS)
    first = sorted(plan.principals, key=lambda p: p.name)
    if not first:
        raise NotApplicable("no principals")
    new = text.replace('map $perimeter_key_hash $perimeter_principal {\n    default "";',
                       f'map $perimeter_key_hash $perimeter_principal {{\n    default "{first[0].name}";', 1)
    new = new.replace('map $perimeter_key_hash $perimeter_role {\n    default "";',
                      f'map $perimeter_key_hash $perimeter_role {{\n    default "{first[0].role}";', 1)
    _write(directory, PRINCIPALS, text, new)
    return f"unknown keys -> {first[0].name}"


# expose: something outside the allowlist reachable

@_op("prefix-location-added", "expose", "the routes under /v1/",
     "a prefix location proxies everything under /v1/", ("bypass", "sweep"))
def _n_prefix(directory: Path, plan: Plan) -> str:
    _insert_location(directory, "    location /v1/ {\n" + _proxying("http://vllm_upstream") + "    }\n")
    return "location /v1/"


@_op("regex-location-added", "expose", "a denied route",
     "a regex location proxies a denied route", ("matrix",))
def _n_regex(directory: Path, plan: Plan) -> str:
    path = core.denied_path(plan)
    _insert_location(directory, f'    location ~ "^{re.escape(path)}" {{\n'
                     + _proxying("http://vllm_upstream") + "    }\n")
    return f"location ~ ^{path}"


@_op("catch-all-proxied", "expose", "the catch-all location",
     "the catch-all location proxies instead of refusing", ("matrix", "sweep"))
def _n_catch_all(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    old = "    location / {\n        set $perimeter_reason not-allowlisted;\n        return 404;\n    }\n"
    _write(directory, HTTP, text, text.replace(old, "    location / {\n" + _proxying("http://vllm_upstream")
                                               + "    }\n", 1))
    return "location / proxied"


@_op("denied-route-proxied", "expose", "a denied route",
     "a denied route gets a proxying location", ("matrix",))
def _n_denied(directory: Path, plan: Plan) -> str:
    path = core.denied_path(plan)
    _insert_location(directory, f"    location = {path} {{\n" + _proxying("http://vllm_upstream") + "    }\n")
    return f"location = {path}"


@_op("upgrade-on-plain-route", "expose", "a GET route", "one plain route passes WebSocket upgrades",
     ("upstream", "matrix"))
def _n_upgrade(directory: Path, plan: Plan) -> str:
    d = core.plain_get(plan)
    _edit_route(directory, d.path, lambda b: b.replace(
        '        proxy_set_header Connection "";\n',
        "        proxy_set_header Upgrade $http_upgrade;\n"
        "        proxy_set_header Connection \"upgrade\";\n"))
    return where(d)


@_op("h2c-accepted", "expose", "the listener",   # NGINX 1.22's port then speaks HTTP/2 only (unreachable)
     "the listener also speaks HTTP/2 in clear text (prior knowledge)", ("protocol", "unreachable"))
def _n_h2c(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    m = re.search(r"\n    listen ([^;\n]+);", text)
    if m is None or " ssl" in m.group(1):
        raise NotApplicable("no plain listener")
    _write(directory, HTTP, text, text[:m.end() - 1] + " http2" + text[m.end() - 1:])
    return f"listen {m.group(1)} http2"


GRPC_REFUSAL = re.compile(r'\n    if \(\$content_type ~\* "\^application/grpc"\) \{[^}\n]*\}')


@_op("grpc-accepted", "expose", "the server",
     "gRPC-shaped requests (content-type application/grpc) no longer refused", ("protocol",))
def _n_grpc(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    _write(directory, HTTP, text, GRPC_REFUSAL.sub("", text, count=1))
    return "the application/grpc refusal dropped"


# forward: what reaches vLLM

@_op("raw-target-forwarded", "forward", "a GET route", "one route forwards the raw request target",
     ("upstream", "bypass"))
def _n_raw(directory: Path, plan: Plan) -> str:
    d = core.plain_get(plan)
    # a URI-less proxy_pass, without the rewrite to the normalised path that may precede it
    normalise = re.compile(r"\n[ \t]*(?:rewrite \^ [^\n]* break;|if \(\$perimeter_path !~ [^\n]*)")
    _edit_route(directory, d.path, lambda b: re.sub(r"proxy_pass http://vllm_upstream[^;]*;",
                                                    "proxy_pass http://vllm_upstream;", normalise.sub("", b)))
    return where(d)


@_op("client-key-forwarded", "forward", "every proxying location",
     "the client's Authorization forwarded upstream", ("upstream",))
def _n_key_fwd(directory: Path, plan: Plan) -> str:
    text = _read(directory, PROXY)
    _write(directory, PROXY, text, text + "proxy_set_header Authorization $http_authorization;\n")
    return "proxy_set_header Authorization"


def _edit_checked(directory: Path, d: Decision, edit: Callable[[str], str]) -> None:
    """``edit`` the named location that forwards ``d``'s bodies as sent (``<up>_checked``) and
    nothing else: its other ways of forwarding (the route's own location, ``<up>_rewrite``) keep
    what the plan says."""
    text = _read(directory, HTTP)
    a, b = _route_span(text, d.path)
    m = re.search(r"\n    location (@perimeter_up_\w+_checked) \{\n.*?\n    \}", text[a:b], re.S)
    if m is None:
        raise NotApplicable(f"{where(d)}: no location forwarding checked bodies as sent")
    start, end = a + m.start(), a + m.end()
    _write(directory, HTTP, text, text[:start] + edit(text[start:end]) + text[end:])


@_op("upstream-errors-passed", "remove", "a route's location forwarding checked bodies as sent",
     "vLLM's 5xx bodies reach the client on one of a route's ways of forwarding (proxy_intercept_errors "
     "off in its <up>_checked location)", ("upstream",))
def _n_errors_passed(directory: Path, plan: Plan) -> str:
    d = core.budgeted(plan)
    _edit_checked(directory, d,
                  lambda b: b.replace("proxy_intercept_errors on;", "proxy_intercept_errors off;"))
    return f"{where(d)}: proxy_intercept_errors off where bodies are forwarded as sent"


@_op("timeout-raised-on-one-path", "raise", "a route's location forwarding checked bodies as sent",
     "one route's upstream timeout x10 on one of its ways of forwarding (its <up>_checked location)",
     ("timeout",), needs="limits.timeout_s the witness can outlast (27.5 s at most) on a route with an "
     "output budget")
def _n_timeout_one_path(directory: Path, plan: Plan) -> str:
    d = core.pick(plan, "with an output budget and an upstream timeout the witness can outlast",
                  lambda x: x.enforced_budget is not None and core.outlastable(x))

    def raise_x10(block: str) -> str:
        return re.sub(r"(proxy_read_timeout|proxy_send_timeout) (\d+)(ms|s);",
                      lambda m: f"{m.group(1)} {int(m.group(2)) * 10}{m.group(3)};", block)
    _edit_checked(directory, d, raise_x10)
    return f"{where(d)}: proxy_read_timeout x10 where bodies are forwarded as sent"


@_op("upstream-key-not-presented", "forward", "every proxying location",
     "vLLM's own key no longer sent upstream", ("upstream",), needs="upstream.api_key_file")
def _n_upstream_key(directory: Path, plan: Plan) -> str:
    if not plan.upstream.api_key_file:
        raise NotApplicable("the policy sets no upstream.api_key_file")
    text = _read(directory, PROXY)
    _write(directory, PROXY, text, re.sub(r'\ninclude "[^"]*perimeter-upstream-key\.conf";', "", text))
    return "the upstream key include dropped"


@_op("client-headers-forwarded", "forward", "every proxying location",
     "every client header forwarded (hop-by-hop, spoofable)", ("upstream",))
def _n_headers(directory: Path, plan: Plan) -> str:
    text = _read(directory, PROXY)
    new = text.replace("proxy_pass_request_headers off;", "proxy_pass_request_headers on;")
    _write(directory, PROXY, text, new)
    return "proxy_pass_request_headers on"


@_op("vllm-header-forwarded", "forward", "every proxying location",
     "X-Vllm-Priority from the client forwarded (queue jumping)", ("upstream",))
def _n_priority(directory: Path, plan: Plan) -> str:
    text = _read(directory, PROXY)
    _write(directory, PROXY, text, text + "proxy_set_header X-Vllm-Priority $http_x_vllm_priority;\n")
    return "proxy_set_header X-Vllm-Priority"


_model_op("salt-not-rewritten", "forward", "a salted route",
          "one route forwards the client's cache_salt (no tenant salt)", ("limits",),
          _program(core.salted, _unsalted, "rule program without salt"), needs="body.cache_salt")


# --- bearer tokens (auth: jwt): the njs verification weakened ---------------------------------

NJS = "perimeter.js"
JWT_NEEDS = "auth: jwt"


def _njs(directory: Path, plan: Plan, old: str, new: str, what: str) -> str:
    d = core.token_checked(plan)
    text = _read(directory, NJS)
    if old not in text:
        raise NotApplicable(f"{NJS}: no {old!r}")
    _write(directory, NJS, text, text.replace(old, new, 1))
    return f"{where(d)} (every auth: jwt route): {what}"


@_op("jwt-signature-unchecked", "remove", "the token verification",
     "a token whose signature does not verify is admitted", ("identity",), needs=JWT_NEEDS)
def _n_jwt_signature(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan,
                "var refused = ok ? jwtClaims(v, cfg, payload) : [401, 'jwt-invalid:signature'];",
                "var refused = jwtClaims(v, cfg, payload);", "the signature's verdict ignored")


@_op("jwt-audience-unchecked", "remove", "the token's audience",
     "a token for another audience is admitted", ("identity",), needs=JWT_NEEDS)
def _n_jwt_audience(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, "if (i === aud.length) {", "if (false) {", "the audience check removed")


@_op("jwt-expiry-unchecked", "remove", "the token's expiry",
     "an expired token is admitted", ("identity",), needs=JWT_NEEDS)
def _n_jwt_expiry(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, "if (now > p.exp + cfg.skew) {", "if (false) {", "the exp check removed")


@_op("jwt-issuer-unchecked", "remove", "the token's issuer",
     "a token from another issuer is admitted", ("identity",), needs=JWT_NEEDS)
def _n_jwt_issuer(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, "if (typeof p.iss !== 'string' || cfg.iss.indexOf(p.iss) < 0) {",
                "if (false) {", "the issuer check removed")


@_op("jwt-issuer-prefix", "remove", "the token's issuer",
     "a token whose issuer merely starts with an allowed one is admitted (the exact match loosened to "
     "a prefix: https://idp.example/realms/llm2 passes for .../llm)", ("identity",), needs=JWT_NEEDS)
def _n_jwt_issuer_prefix(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, """    if (typeof p.iss !== 'string' || cfg.iss.indexOf(p.iss) < 0) {
        return [401, 'jwt-issuer'];
    }
""", """    for (i = 0; i < cfg.iss.length; i++) {
        if (typeof p.iss === 'string' && p.iss.indexOf(cfg.iss[i]) === 0) {
            break;
        }
    }
    if (i === cfg.iss.length) {
        return [401, 'jwt-issuer'];
    }
    p.iss = cfg.iss[i];     // the allowed issuer it starts with names its principals
""", "the issuer compared as a prefix")


@_op("jwt-duplicates-read", "remove", "the token's strict JSON reading",
     "a member named twice in a token's claims or header is read (the last copy, as JSON.parse "
     "does) instead of refused", ("identity",), needs=JWT_NEEDS)
def _n_jwt_duplicates(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, " || !jwtUnique(s) ||", " ||", "the duplicate-member scan removed")


@_op("jwt-crit-ignored", "remove", "the token's crit header",
     "a token naming an extension nobody understands in crit is admitted", ("identity",), needs=JWT_NEEDS)
def _n_jwt_crit(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, "return has(h, 'crit') ? 'jwt-invalid:crit' : '';", "return '';",
                "the crit check removed")


@_op("jwt-trailing-accepted", "remove", "the token's form",
     "a token followed by '.', '..' or '==' is admitted (the trailing characters stripped before its "
     "form is checked, as lax JWT libraries do)", ("identity",), needs=JWT_NEEDS)
def _n_jwt_trailing(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, "        token = m[1];\n", "        token = m[1].replace(/[.=]+$/, '');\n",
                "trailing dots and padding stripped from the token")


@_op("principal-namespace-collision", "source", "the token principal's kind",
     "a token principal named by its claim alone (no jwt:ID: prefix): a subject equal to a key "
     "principal's name is that principal (its header, log name, seals)", ("identity",), needs=JWT_NEEDS)
def _n_principal_namespace(directory: Path, plan: Plan) -> str:
    return _njs(directory, plan, "    who = cfg.pfx[cfg.iss.indexOf(p.iss)] + who;", "",
                "the token principal's jwt:ID: prefix dropped")


# --- client certificates (auth: cert): the listener's verification and the njs name check -----

CERT_NEEDS = "auth: cert"


@_op("cert-any-ca", "remove", "the client certificate's verification",
     "any CA accepted: ssl_verify_client optional_no_ca, and the verification result unread (a "
     "certificate from another CA, or expired, names its principal)", ("mtls",), needs=CERT_NEEDS)
def _n_cert_any_ca(directory: Path, plan: Plan) -> str:
    d = core.cert_checked(plan)
    text = _read(directory, HTTP)
    new = text.replace("    ssl_verify_client optional;", "    ssl_verify_client optional_no_ca;", 1)
    new = new.replace('    default "";\n    SUCCESS $perimeter_cert_who;',
                      "    default $perimeter_cert_who;", 1)
    _write(directory, HTTP, text, new)
    return f"{where(d)} (every auth: cert route): client certificates not verified"


@_op("cert-san-unchecked", "remove", "the client certificate's name",
     "any verified certificate is a principal (its URI SAN and subject not looked up)", ("mtls",),
     needs=CERT_NEEDS)
def _n_cert_san(directory: Path, plan: Plan) -> str:
    d = core.cert_checked(plan)
    text = _read(directory, NJS)
    old = "    return p === null ? '' : p[0] + ' ' + p[1];"
    if old not in text:
        raise NotApplicable(f"{NJS}: no {old!r}")
    _write(directory, NJS, text, text.replace(
        old, f"    return p === null ? 'anyone {core.cert_role(plan, d)}' : p[0] + ' ' + p[1];", 1))
    return f"{where(d)} (every auth: cert route): an unknown certificate names 'anyone'"


@_op("cert-san-fallback", "remove", "the client certificate's name",
     "a certificate whose URI SAN names nobody (a revoked SPIFFE ID) is named by its subject instead "
     "(the fallback SPIFFE semantics forbid)", ("mtls",), needs=CERT_NEEDS)
def _n_cert_san_fallback(directory: Path, plan: Plan) -> str:
    d = core.cert_checked(plan)
    text = _read(directory, NJS)
    old = "    if (sans.length === 0 && has(table, dn)) {"
    if old not in text:
        raise NotApplicable(f"{NJS}: no {old!r}")
    _write(directory, NJS, text, text.replace(old, "    if (p === null && has(table, dn)) {", 1))
    return f"{where(d)} (every auth: cert route): an unlisted URI SAN falls back to the subject"


@_op("cert-revoked-mapped", "remove", "a revoked certificate principal",
     "a principal the plan no longer lists is still mapped (the principals file not regenerated): "
     "the probe's unknown name stands for it", ("mtls",), needs=CERT_NEEDS)
def _n_cert_revoked(directory: Path, plan: Plan) -> str:
    from scanner.probe.certs_cases import UNKNOWN_SAN

    d = core.cert_checked(plan)
    text = _read(directory, PRINCIPALS)
    old = "js_var $perimeter_certs '{"
    if old not in text:
        raise NotApplicable(f"{PRINCIPALS}: no certificate principals")
    _write(directory, PRINCIPALS, text, text.replace(
        old, old + f'"san:{UNKNOWN_SAN}":["revoked","{core.cert_role(plan, d)}"],', 1))
    return f"{where(d)} (every auth: cert route): a revoked principal still mapped"


# --- the listener's TLS: legacy versions and every suite of the library ---------------------------

TLS_NEEDS = "listen.tls"


@_op("tls-legacy-versions", "add", "the listener's TLS versions and suites",
     "TLS 1.0 and 1.1 admitted on the listener, with every cipher suite at security level 0",
     ("tls",), needs=TLS_NEEDS)
def _n_tls_legacy(directory: Path, plan: Plan) -> str:
    if plan.listen.tls is None:
        raise NotApplicable("the listener speaks plain HTTP (no listen.tls)")
    text = _read(directory, HTTP)
    old = "    ssl_protocols TLSv1.2 TLSv1.3;\n"
    if old not in text:
        raise NotApplicable(f"{HTTP}: no {old.strip()!r}")
    _write(directory, HTTP, text, text.replace(
        old, "    ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3;\n    ssl_ciphers ALL:@SECLEVEL=0;\n", 1))
    return "listener: ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3, ssl_ciphers ALL:@SECLEVEL=0"
