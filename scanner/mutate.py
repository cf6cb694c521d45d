"""Mutation operators for generated configs: the prober proves its own sensitivity.

Each operator is a realistic weakening someone could make by hand, or a generator bug could
cause, applied to a fresh copy of the generated NGINX or Envoy config: one route's key, role,
network or method check removed, a body limit raised, a JSON cap or forbidden-field check
removed, a rate, concurrency or token budget removed, the network decision taken from a forwarding
header, a prefix, regex or catch-all location added, a denied route proxied, the raw target
forwarded, the client's key or hop-by-hop headers forwarded, a WebSocket upgrade allowed on a
plain route, any key accepted. ``verify --mutate`` runs the real proxy on each mutant and the
probe against it: a mutant is caught when the probe reports at least one finding.

    for op in operators("nginx"):
        what = op.apply(directory, plan)    # edits the files; raises NotApplicable
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scanner.plan.model import Decision, Plan


class NotApplicable(Exception):
    """The plan has nothing this operator could weaken (e.g. no rate limit at all)."""


Apply = Callable[[Path, Plan], str]


@dataclass(frozen=True)
class Operator:
    id: str
    kind: str                      # "nginx" or "envoy"
    title: str
    apply: Apply


OPERATORS: dict[str, Operator] = {}


def operator(kind: str, op_id: str, title: str) -> Callable[[Apply], Apply]:
    """Register ``fn(directory, plan) -> what changed`` as the operator ``kind.op_id``."""
    def register(fn: Apply) -> Apply:
        full = f"{kind}.{op_id}"
        if full in OPERATORS:
            raise ValueError(f"mutation operator {full} registered twice")
        OPERATORS[full] = Operator(full, kind, title, fn)
        return fn
    return register


def operators(kind: str) -> tuple[Operator, ...]:
    return tuple(op for op in OPERATORS.values() if op.kind == kind)


# --- targets: which route of the plan an operator weakens ------------------------------------


def _pick(plan: Plan, what: str, test: Callable[[Decision], bool]) -> Decision:
    """The first allowed HTTP decision (by path, method) that ``test`` accepts."""
    for d in sorted(plan.allowed, key=lambda d: (d.path, d.method)):
        if d.kind == "http" and test(d):
            return d
    raise NotApplicable(f"no allowed route {what}")


def keyed(plan: Plan) -> Decision:
    return _pick(plan, "that needs a key", lambda d: d.auth == "key" and not d.state_changing)


def roled(plan: Plan) -> Decision:
    roles = {p.role for p in plan.principals}
    return _pick(plan, "limited to some roles",
                 lambda d: d.auth == "key" and bool(d.roles) and bool(roles - set(d.roles)))


def networked(plan: Plan) -> Decision:
    everywhere = {"0.0.0.0/0", "::/0"}
    return _pick(plan, "limited to some networks", lambda d: not set(d.networks) & everywhere)


def bodied(plan: Plan) -> Decision:
    return _pick(plan, "with a body limit", lambda d: d.method == "POST" and d.limits.body_bytes is not None)


def capped(plan: Plan) -> Decision:
    return _pick(plan, "with JSON caps", lambda d: d.method == "POST" and bool(d.limits.json_caps))


def budgeted(plan: Plan) -> Decision:
    return _pick(plan, "with an output budget", lambda d: d.enforced_budget is not None)


def salted(plan: Plan) -> Decision:
    return _pick(plan, "with a cache salt (cache_salt: per-principal / per-audience)", lambda d: bool(d.salt))


def rated(plan: Plan) -> Decision:
    return _pick(plan, "with a rate limit", lambda d: d.limits.rate is not None)


def token_budgeted(plan: Plan) -> Decision:
    return _pick(plan, "with a token budget", lambda d: bool(d.token_zone))


def limited(plan: Plan) -> Decision:
    return _pick(plan, "with a concurrency limit", lambda d: d.limits.concurrency is not None)


def plain_get(plan: Plan) -> Decision:
    return _pick(plan, "with GET", lambda d: d.method == "GET" and "{" not in d.path)


def denied_path(plan: Plan) -> str:
    """A path every method of which is denied (the proxy answers it itself)."""
    allowed = {d.path for d in plan.allowed}
    for d in sorted(plan.decisions, key=lambda d: d.path):
        if d.kind == "http" and d.path not in allowed and "{" not in d.path:
            return d.path
    raise NotApplicable("no denied route")


def field_checked(plan: Plan) -> Decision:
    """A route whose field rules act on bodies (and with JSON caps: its body is always read)."""
    return _pick(plan, "with field rules and JSON caps",
                 lambda d: d.fields.decided and bool(d.limits.json_caps))


def media_checked(plan: Plan) -> Decision:
    """A route whose media rules act on bodies."""
    return _pick(plan, "with media rules", lambda d: d.media.active)


# --- NGINX: text edits of perimeter-http.conf, perimeter-proxy.conf, the principals map ------

HTTP = "perimeter-http.conf"
PROXY = "perimeter-proxy.conf"


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


@operator("nginx", "key-check-removed", "one route's key check removed (no key needed)")
def _n_key(directory: Path, plan: Plan) -> str:
    d = keyed(plan)
    _edit_route(directory, d.path, _drop_lines(r"if \(\$perimeter_(bearer|principal|roles_\d+) = "))
    return f"{d.method} {d.path}"


@operator("nginx", "role-check-removed", "one route's role check removed (any principal)")
def _n_role(directory: Path, plan: Plan) -> str:
    d = roled(plan)
    _edit_route(directory, d.path, _drop_lines(r"if \(\$perimeter_roles_\d+ = 0\)"))
    return f"{d.method} {d.path}"


@operator("nginx", "network-check-removed", "one route's network check removed")
def _n_net(directory: Path, plan: Plan) -> str:
    d = networked(plan)
    _edit_route(directory, d.path, _drop_lines(r"if \(\$perimeter_net_\d+ = 0\)"))
    return f"{d.method} {d.path}"


@operator("nginx", "method-check-removed", "one route's method check removed")
def _n_method(directory: Path, plan: Plan) -> str:
    d = plain_get(plan)
    _edit_route(directory, d.path, _drop_lines(r"if \(\$request_method !?[=~]"))
    return f"{d.method} {d.path}"


@operator("nginx", "body-limit-raised", "one route's body limit raised to 100 MB")
def _n_body(directory: Path, plan: Plan) -> str:
    d = bodied(plan)
    _edit_route(directory, d.path, lambda b: re.sub(r"client_(max_body|body_buffer)_size \d+;",
                                                    r"client_\1_size 100m;", b))
    return f"{d.method} {d.path}"


@operator("nginx", "json-cap-removed", "one route's JSON caps removed")
def _n_caps(directory: Path, plan: Plan) -> str:
    d = capped(plan)
    _edit_route(directory, d.path, lambda b: re.sub(r"set \$perimeter_check c\d+;",
                                                    "set $perimeter_check none;", b))
    return f"{d.method} {d.path}"


@operator("nginx", "forbidden-field-check-removed", "one route passes the fields the policy forbids")
def _n_fields(directory: Path, plan: Plan) -> str:
    d = field_checked(plan)
    _blank_check_entry(directory, d, "$perimeter_fields")
    return f"{d.method} {d.path}"


@operator("nginx", "media-check-removed", "one route passes any media URL, data and embeddings")
def _n_media(directory: Path, plan: Plan) -> str:
    d = media_checked(plan)
    _blank_check_entry(directory, d, "$perimeter_media")
    return f"{d.method} {d.path}"


@operator("nginx", "budget-not-enforced", "one route forwards bodies without an output budget as sent")
def _n_budget(directory: Path, plan: Plan) -> str:
    d = budgeted(plan)
    _blank_check_entry(directory, d, "$perimeter_budget")
    return f"{d.method} {d.path}"


@operator("nginx", "salt-not-rewritten", "one route forwards the client's cache_salt (no tenant salt)")
def _n_salt(directory: Path, plan: Plan) -> str:
    d = salted(plan)
    _blank_check_entry(directory, d, "$perimeter_salt_subject")
    text = _read(directory, HTTP)
    a, b = _route_span(text, d.path)
    m = re.search(r"set \$perimeter_check (c\d+);", text[a:b])
    assert m is not None   # _blank_check_entry found it
    at = text.index("map $perimeter_check $perimeter_fields {")
    entry = re.compile(r'(\n    ' + m.group(1) + r' "[^"\n]*)";')
    # njs reads the lists in order, the last one naming a field wins: the client's cache_salt passes
    _write(directory, HTTP, text, text[:at] + entry.sub(r'\1 allow=cache_salt";', text[at:], count=1))
    return f"{d.method} {d.path}"


def _blank_check_entry(directory: Path, d: Decision, variable: str) -> None:
    """Empty the entry of ``d``'s body check in the map that sets ``variable`` (njs then skips
    that part of the check)."""
    text = _read(directory, HTTP)
    a, b = _route_span(text, d.path)
    m = re.search(r"set \$perimeter_check (c\d+);", text[a:b])
    if m is None:
        raise NotApplicable(f"no body check on {d.path}")
    at = text.index(f"map $perimeter_check {variable} {{")
    line = re.compile(r'(\n    ' + m.group(1) + r' )"[^"\n]*";')
    _write(directory, HTTP, text, text[:at] + line.sub(r'\1"";', text[at:], count=1))


@operator("nginx", "rate-limit-removed", "one route's rate limit removed")
def _n_rate(directory: Path, plan: Plan) -> str:
    d = rated(plan)
    _edit_route(directory, d.path, _drop_lines(r"limit_req zone="))
    return f"{d.method} {d.path}"


@operator("nginx", "token-budget-removed", "one token zone's budget removed (njs charges nothing)")
def _n_tokens(directory: Path, plan: Plan) -> str:
    d = token_budgeted(plan)
    text = _read(directory, HTTP)
    at = text.find("map $perimeter_check $perimeter_tokens {")
    if at < 0:
        raise NotApplicable("no token budget in the config")
    end = text.index("\n}", at)
    _write(directory, HTTP, text, text[:at] + re.sub(r'(\n    c\d+ )"[^"\n]*";', r'\1"";', text[at:end])
           + text[end:])
    return f"{d.token_zone} ({d.method} {d.path})"


@operator("nginx", "concurrency-limit-removed", "one route's concurrency limit removed")
def _n_conn(directory: Path, plan: Plan) -> str:
    d = limited(plan)
    _edit_route(directory, d.path, _drop_lines(r"limit_conn perimeter_conn_"))
    return f"{d.method} {d.path}"


@operator("nginx", "network-from-forwarding-header", "client address taken from X-Forwarded-For")
def _n_xff(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    new = text.replace("    server_name _;\n", "    server_name _;\n    set_real_ip_from 0.0.0.0/0;\n"
                       "    set_real_ip_from ::/0;\n    real_ip_header X-Forwarded-For;\n", 1)
    _write(directory, HTTP, text, new)
    return "set_real_ip_from everywhere"


@operator("nginx", "prefix-location-added", "a prefix location proxies everything under /v1/")
def _n_prefix(directory: Path, plan: Plan) -> str:
    _insert_location(directory, "    location /v1/ {\n" + _proxying("http://vllm_upstream") + "    }\n")
    return "location /v1/"


@operator("nginx", "regex-location-added", "a regex location proxies a denied route")
def _n_regex(directory: Path, plan: Plan) -> str:
    path = denied_path(plan)
    _insert_location(directory, f'    location ~ "^{re.escape(path)}" {{\n'
                     + _proxying("http://vllm_upstream") + "    }\n")
    return f"location ~ ^{path}"


@operator("nginx", "catch-all-proxied", "the catch-all location proxies instead of refusing")
def _n_catch_all(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    old = "    location / {\n        set $perimeter_reason not-allowlisted;\n        return 404;\n    }\n"
    _write(directory, HTTP, text, text.replace(old, "    location / {\n" + _proxying("http://vllm_upstream")
                                               + "    }\n", 1))
    return "location / proxied"


@operator("nginx", "denied-route-proxied", "a denied route gets a proxying location")
def _n_denied(directory: Path, plan: Plan) -> str:
    path = denied_path(plan)
    _insert_location(directory, f"    location = {path} {{\n" + _proxying("http://vllm_upstream") + "    }\n")
    return f"location = {path}"


@operator("nginx", "raw-target-forwarded", "one route forwards the raw request target")
def _n_raw(directory: Path, plan: Plan) -> str:
    d = plain_get(plan)
    # a URI-less proxy_pass, without the rewrite to the normalised path that may precede it
    normalise = re.compile(r"\n[ \t]*(?:rewrite \^ [^\n]* break;|if \(\$perimeter_path !~ [^\n]*)")
    _edit_route(directory, d.path, lambda b: re.sub(r"proxy_pass http://vllm_upstream[^;]*;",
                                                    "proxy_pass http://vllm_upstream;", normalise.sub("", b)))
    return f"{d.method} {d.path}"


@operator("nginx", "client-key-forwarded", "the client's Authorization forwarded upstream")
def _n_key_fwd(directory: Path, plan: Plan) -> str:
    text = _read(directory, PROXY)
    _write(directory, PROXY, text, text + "proxy_set_header Authorization $http_authorization;\n")
    return "proxy_set_header Authorization"


@operator("nginx", "upstream-key-not-presented", "vLLM's own key no longer sent upstream")
def _n_upstream_key(directory: Path, plan: Plan) -> str:
    if not plan.upstream.api_key_file:
        raise NotApplicable("the policy sets no upstream.api_key_file")
    text = _read(directory, PROXY)
    _write(directory, PROXY, text, re.sub(r'\ninclude "[^"]*perimeter-upstream-key\.conf";', "", text))
    return "the upstream key include dropped"


@operator("nginx", "client-headers-forwarded", "every client header forwarded (hop-by-hop, spoofable)")
def _n_headers(directory: Path, plan: Plan) -> str:
    text = _read(directory, PROXY)
    _write(directory, PROXY, text, text.replace("proxy_pass_request_headers off;",
                                                "proxy_pass_request_headers on;"))
    return "proxy_pass_request_headers on"


@operator("nginx", "vllm-header-forwarded", "X-Vllm-Priority from the client forwarded (queue jumping)")
def _n_priority(directory: Path, plan: Plan) -> str:
    text = _read(directory, PROXY)
    _write(directory, PROXY, text, text + "proxy_set_header X-Vllm-Priority $http_x_vllm_priority;\n")
    return "proxy_set_header X-Vllm-Priority"


@operator("nginx", "principal-header-from-client", "one route takes the principal header from the client")
def _n_principal(directory: Path, plan: Plan) -> str:
    d = plain_get(plan)
    _edit_route(directory, d.path, lambda b: b.replace(
        "proxy_set_header X-Perimeter-Principal $perimeter_principal;",
        "proxy_set_header X-Perimeter-Principal $http_x_perimeter_principal;").replace(
        'proxy_set_header X-Perimeter-Principal "";',
        "proxy_set_header X-Perimeter-Principal $http_x_perimeter_principal;"))
    return f"{d.method} {d.path}"


@operator("nginx", "upgrade-on-plain-route", "one plain route passes WebSocket upgrades")
def _n_upgrade(directory: Path, plan: Plan) -> str:
    d = plain_get(plan)
    _edit_route(directory, d.path, lambda b: b.replace(
        '        proxy_set_header Connection "";\n',
        "        proxy_set_header Upgrade $http_upgrade;\n"
        "        proxy_set_header Connection \"upgrade\";\n"))
    return f"{d.method} {d.path}"


@operator("nginx", "h2c-accepted", "the listener also speaks HTTP/2 in clear text (prior knowledge)")
def _n_h2c(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    m = re.search(r"\n    listen ([^;\n]+);", text)
    if m is None or " ssl" in m.group(1):
        raise NotApplicable("no plain listener")
    _write(directory, HTTP, text, text[:m.end() - 1] + " http2" + text[m.end() - 1:])
    return f"listen {m.group(1)} http2"


GRPC_REFUSAL = re.compile(r'\n    if \(\$content_type ~\* "\^application/grpc"\) \{[^}\n]*\}')


@operator("nginx", "grpc-accepted", "gRPC-shaped requests (content-type application/grpc) no longer refused")
def _n_grpc(directory: Path, plan: Plan) -> str:
    text = _read(directory, HTTP)
    _write(directory, HTTP, text, GRPC_REFUSAL.sub("", text, count=1))
    return "the application/grpc refusal dropped"


@operator("nginx", "any-key-accepted", "an unknown key is taken for a principal")
def _n_any_key(directory: Path, plan: Plan) -> str:
    name = "perimeter-principals.conf"
    text = _read(directory, name)
    first = sorted(plan.principals, key=lambda p: p.name)
    if not first:
        raise NotApplicable("no principals")
    new = text.replace('map $perimeter_key_hash $perimeter_principal {\n    default "";',
                       f'map $perimeter_key_hash $perimeter_principal {{\n    default "{first[0].name}";', 1)
    new = new.replace('map $perimeter_key_hash $perimeter_role {\n    default "";',
                      f'map $perimeter_key_hash $perimeter_role {{\n    default "{first[0].role}";', 1)
    _write(directory, name, text, new)
    return f"unknown keys -> {first[0].name}"


# --- Envoy: edits of envoy.yaml (parsed) and of its inline Lua -------------------------------

ENVOY = "envoy.yaml"


class _Envoy:
    """envoy.yaml as data: the HTTP connection manager, its routes and the Lua source."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / ENVOY
        self.doc: dict[str, Any] = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        listener = self.doc["static_resources"]["listeners"][0]
        self.hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
        self.routes: list[dict[str, Any]] = self.hcm["route_config"]["virtual_hosts"][0]["routes"]
        self.lua_filter = next(f for f in self.hcm["http_filters"] if f["name"] == "perimeter.lua")

    @property
    def lua(self) -> str:
        return str(self.lua_filter["typed_config"]["default_source_code"]["inline_string"])

    @lua.setter
    def lua(self, text: str) -> None:
        self.lua_filter["typed_config"]["default_source_code"]["inline_string"] = text

    def route(self, name: str) -> dict[str, Any]:
        for r in self.routes:
            if r["name"] == name:
                return r
        raise NotApplicable(f"no route {name}")

    def allowed(self, d: Decision) -> dict[str, Any]:
        return self.route(f"allow:{d.method} {d.path}")

    def save(self) -> None:
        self.path.write_text(yaml.safe_dump(self.doc, sort_keys=False), encoding="utf-8")


def _group_copy(env: _Envoy, route: dict[str, Any], **changes: str) -> str:
    """Give ``route`` a copy of its Lua group with some fields replaced (Lua source text)."""
    gid = route["metadata"]["filter_metadata"]["perimeter.lua"]["g"]
    lua = env.lua
    m = re.search(r'\n  \["' + re.escape(gid) + r'"\] = \{\n(.*?)\n  \},', lua, re.S)
    if m is None:
        raise NotApplicable(f"no Lua group {gid}")
    body = m.group(1)
    for key, value in changes.items():
        body = re.sub(r"(\n|^)(    " + key + r" = )[^\n]*,",
                      lambda x, v=value: f"{x.group(1)}{x.group(2)}{v},", body)
    new_id = f"{gid}x"
    env.lua = lua.replace("local GROUPS = {\n", f'local GROUPS = {{\n  ["{new_id}"] = {{\n{body}\n  }},\n', 1)
    route["metadata"]["filter_metadata"]["perimeter.lua"]["g"] = new_id
    return new_id


def _fixed_cluster(route: dict[str, Any]) -> None:
    """Route to the base cluster (what an edit dropping the per-principal routing leaves)."""
    route["route"].pop("cluster_header", None)
    route["route"]["cluster"] = "vllm"


def _envoy_edit(fn: Callable[[_Envoy, Plan], str]) -> Apply:
    def apply(directory: Path, plan: Plan) -> str:
        env = _Envoy(directory)
        what = fn(env, plan)
        env.save()
        return what
    return apply


def _forwarding(name: str, match: dict[str, Any], cluster: str = "vllm") -> dict[str, Any]:
    return {"name": name, "match": match, "route": {"cluster": cluster, "timeout": "0s"},
            "typed_per_filter_config": {"perimeter.lua": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute",
                "disabled": True}}}


def _e(op_id: str, title: str) -> Callable[[Callable[[_Envoy, Plan], str]], Callable[[_Envoy, Plan], str]]:
    def register(fn: Callable[[_Envoy, Plan], str]) -> Callable[[_Envoy, Plan], str]:
        operator("envoy", op_id, title)(_envoy_edit(fn))
        return fn
    return register


@_e("key-check-removed", "one route's key check removed (no key needed)")
def _e_key(env: _Envoy, plan: Plan) -> str:
    d = keyed(plan)
    r = env.allowed(d)
    _group_copy(env, r, key="false", roles="nil", upstream="nil")
    _fixed_cluster(r)
    return f"{d.method} {d.path}"


@_e("lua-disabled-on-route", "the Lua filter turned off on one route (no key, role or body check)")
def _e_lua_off(env: _Envoy, plan: Plan) -> str:
    d = capped(plan)
    r = env.allowed(d)
    r["typed_per_filter_config"]["perimeter.lua"] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute", "disabled": True}
    return f"{d.method} {d.path}"


@_e("role-check-removed", "one route's role check removed (any principal)")
def _e_role(env: _Envoy, plan: Plan) -> str:
    d = roled(plan)
    r = env.allowed(d)
    _group_copy(env, r, roles="nil", upstream="nil")
    _fixed_cluster(r)
    return f"{d.method} {d.path}"


@_e("network-check-removed", "one route's network check removed")
def _e_net(env: _Envoy, plan: Plan) -> str:
    d = networked(plan)
    if env.allowed(d)["typed_per_filter_config"].pop("perimeter.network", None) is None:
        raise NotApplicable("no network check on that route")
    return f"{d.method} {d.path}"


@_e("method-match-removed", "one route matches every method")
def _e_method(env: _Envoy, plan: Plan) -> str:
    d = plain_get(plan)
    r = env.allowed(d)
    r["match"].pop("headers", None)
    return f"{d.method} {d.path}"


@_e("body-limit-raised", "one route's body limit raised to 100 MB")
def _e_body(env: _Envoy, plan: Plan) -> str:
    d = bodied(plan)
    r = env.allowed(d)
    r["typed_per_filter_config"].setdefault("perimeter.buffer", {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
        "buffer": {}})["buffer"]["max_request_bytes"] = 100_000_000
    r["request_body_buffer_limit"] = 100_000_000
    _group_copy(env, r, limit="100000000")
    return f"{d.method} {d.path}"


@_e("json-cap-removed", "one route's JSON caps removed")
def _e_caps(env: _Envoy, plan: Plan) -> str:
    d = capped(plan)
    _group_copy(env, env.allowed(d), caps="{ }")
    return f"{d.method} {d.path}"


@_e("forbidden-field-check-removed", "one route passes the fields the policy forbids")
def _e_fields(env: _Envoy, plan: Plan) -> str:
    d = field_checked(plan)
    _group_copy(env, env.allowed(d), fields="false")
    return f"{d.method} {d.path}"


@_e("media-check-removed", "one route passes any media URL, data and embeddings")
def _e_media(env: _Envoy, plan: Plan) -> str:
    d = media_checked(plan)
    _group_copy(env, env.allowed(d), media="nil")
    return f"{d.method} {d.path}"


@_e("budget-not-enforced", "one route forwards bodies without an output budget as sent")
def _e_budget(env: _Envoy, plan: Plan) -> str:
    d = budgeted(plan)
    _group_copy(env, env.allowed(d), budget="nil")
    return f"{d.method} {d.path}"


@_e("salt-not-rewritten", "one route forwards the client's cache_salt (no tenant salt)")
def _e_salt(env: _Envoy, plan: Plan) -> str:
    d = salted(plan)
    gid = _group_copy(env, env.allowed(d), salt="nil")
    lua = env.lua
    a = lua.index(f'\n  ["{gid}"] = {{\n')
    b = lua.index("\n  },", a)
    env.lua = lua[:a] + lua[a:b].replace('["cache_salt"] = "strip"', '["cache_salt"] = "allow"') + lua[b:]
    return f"{d.method} {d.path}"


@_e("rate-limit-removed", "one route's rate limit removed")
def _e_rate(env: _Envoy, plan: Plan) -> str:
    d = rated(plan)
    per = env.allowed(d)["typed_per_filter_config"]
    names = [k for k in per if k.startswith("perimeter.rate")]
    if not names:
        raise NotApplicable("no rate filter on that route")
    for k in names:
        per.pop(k)
    return f"{d.method} {d.path}"


@_e("token-budget-removed", "one token zone's budget removed (its filter off on every route)")
def _e_tokens(env: _Envoy, plan: Plan) -> str:
    d = token_budgeted(plan)
    per = env.allowed(d).get("typed_per_filter_config", {})
    name = next((k for k in per if k.startswith("perimeter.tokens")), None)
    if name is None:
        raise NotApplicable("no token filter on that route")
    for r in env.routes:
        r.get("typed_per_filter_config", {}).pop(name, None)
    return f"{d.token_zone} ({d.method} {d.path})"


@_e("concurrency-limit-removed", "the concurrency limits (circuit breakers) removed")
def _e_conn(env: _Envoy, plan: Plan) -> str:
    limited(plan)
    gone = [c for c in env.doc["static_resources"]["clusters"] if c.pop("circuit_breakers", None)]
    if not gone:
        raise NotApplicable("no circuit breaker")
    return f"{len(gone)} clusters"


@_e("network-from-forwarding-header", "client address taken from X-Forwarded-For")
def _e_xff(env: _Envoy, plan: Plan) -> str:
    env.hcm["use_remote_address"] = False
    env.hcm["xff_num_trusted_hops"] = 1
    text = yaml.safe_dump(env.routes)
    env.hcm["route_config"]["virtual_hosts"][0]["routes"] = yaml.safe_load(
        text.replace("direct_remote_ip:", "remote_ip:"))
    return "RBAC on the X-Forwarded-For address"


@_e("prefix-route-added", "a prefix route forwards everything under /v1/")
def _e_prefix(env: _Envoy, plan: Plan) -> str:
    env.routes.insert(len(env.routes) - 1, _forwarding("mutant:prefix", {"prefix": "/v1/"}))
    return "prefix /v1/"


@_e("regex-route-added", "a regex route (first in the table) forwards a denied route")
def _e_regex(env: _Envoy, plan: Plan) -> str:
    path = denied_path(plan)
    env.routes.insert(0, _forwarding("mutant:regex", {"safe_regex": {"regex": f"^{re.escape(path)}.*"}}))
    return f"regex ^{path}"


@_e("catch-all-forwarded", "the catch-all route forwards instead of refusing")
def _e_catch_all(env: _Envoy, plan: Plan) -> str:
    r = env.route("deny:unknown")
    env.routes[env.routes.index(r)] = _forwarding("deny:unknown", r["match"])
    return "catch-all forwarded"


@_e("denied-route-forwarded", "a denied route is forwarded")
def _e_denied(env: _Envoy, plan: Plan) -> str:
    path = denied_path(plan)
    r = env.route(f"deny:{path}")
    env.routes[env.routes.index(r)] = _forwarding(f"deny:{path}", r["match"])
    return path


@_e("grpc-denied-method-forwarded", "a gRPC method the plan denies is forwarded to vLLM's gRPC server")
def _e_grpc_denied(env: _Envoy, plan: Plan) -> str:
    g = plan.grpc
    denied = next((d.path for d in (g.decisions if g else ()) if not d.allowed), "")
    listeners = env.doc["static_resources"]["listeners"]
    listener = next((x for x in listeners if x["name"] == "perimeter-grpc"), None)
    if not denied or listener is None:
        raise NotApplicable("no gRPC listener with a denied method")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    i = next(i for i, r in enumerate(routes) if r["name"] == f"deny:{denied}")
    routes[i] = _forwarding(f"deny:{denied}", routes[i]["match"], cluster="vllm_grpc")
    return denied


@_e("raw-target-forwarded", "paths are matched and forwarded raw (no normalisation)")
def _e_raw(env: _Envoy, plan: Plan) -> str:
    env.hcm["normalize_path"] = False
    env.hcm["merge_slashes"] = False
    env.hcm["path_with_escaped_slashes_action"] = "KEEP_UNCHANGED"
    return "normalize_path off"


@_e("client-key-forwarded", "the client's Authorization forwarded upstream")
def _e_key_fwd(env: _Envoy, plan: Plan) -> str:
    removed = env.hcm["route_config"]["request_headers_to_remove"]
    removed.remove("authorization")
    return "authorization kept"


@_e("upstream-key-not-presented", "vLLM's own key no longer sent upstream")
def _e_upstream_key(env: _Envoy, plan: Plan) -> str:
    if not plan.upstream.api_key_file:
        raise NotApplicable("the policy sets no upstream.api_key_file")
    added = env.hcm["route_config"]["request_headers_to_add"]
    kept = [h for h in added if h["header"]["key"] != "authorization"]
    if len(kept) == len(added):
        raise NotApplicable("no Authorization added upstream")
    env.hcm["route_config"]["request_headers_to_add"] = kept
    return "authorization not added"


@_e("client-headers-forwarded", "the header allowlist turned off (hop-by-hop, spoofable forwarded)")
def _e_headers(env: _Envoy, plan: Plan) -> str:
    lua = env.lua
    env.lua = re.sub(r"(?m)^  drop_headers\(headers, [^\n]*\)\n", "", lua, count=1)
    if env.lua == lua:
        raise NotApplicable("no header allowlist")
    return "drop_headers off"


@_e("vllm-header-forwarded", "X-Vllm-Priority from the client forwarded (queue jumping)")
def _e_priority(env: _Envoy, plan: Plan) -> str:
    lua = env.lua
    env.lua = lua.replace("local KEPT = { ", 'local KEPT = { ["x-vllm-priority"] = true, ', 1)
    return "x-vllm-priority kept"


@_e("principal-header-from-client", "the principal header from the client is kept")
def _e_principal(env: _Envoy, plan: Plan) -> str:
    removed = env.hcm["route_config"]["request_headers_to_remove"]
    removed.remove("x-perimeter-principal")
    for h in env.hcm["route_config"]["request_headers_to_add"]:
        if h["header"]["key"] == "x-perimeter-principal":
            h["append_action"] = "ADD_IF_ABSENT"
            h["keep_empty_value"] = False
    env.lua = env.lua.replace("local KEPT = { ", 'local KEPT = { ["x-perimeter-principal"] = true, ', 1)
    return "x-perimeter-principal kept"


@_e("upgrade-on-plain-route", "one plain route passes WebSocket upgrades")
def _e_upgrade(env: _Envoy, plan: Plan) -> str:
    d = plain_get(plan)
    r = env.allowed(d)
    r["route"]["upgrade_configs"] = [{"upgrade_type": "websocket", "enabled": True}]
    env.hcm.setdefault("upgrade_configs", [{"upgrade_type": "websocket", "enabled": False}])
    env.lua = env.lua.replace("local KEPT = { ", 'local KEPT = { ["upgrade"] = true, ["connection"] = true, '
                              '["sec-websocket-key"] = true, ["sec-websocket-version"] = true, ', 1)
    return f"{d.method} {d.path}"


@_e("h2c-accepted", "the listener also speaks HTTP/2 in clear text (codec_type AUTO)")
def _e_h2c(env: _Envoy, plan: Plan) -> str:
    env.hcm["codec_type"] = "AUTO"
    return "codec_type AUTO"


@_e("grpc-accepted", "gRPC-shaped requests (content-type application/grpc) no longer refused")
def _e_grpc(env: _Envoy, plan: Plan) -> str:
    env.routes.remove(env.route("deny:grpc"))
    return "route deny:grpc removed"


@_e("any-key-accepted", "an unknown key is taken for a principal")
def _e_any_key(env: _Envoy, plan: Plan) -> str:
    first = sorted(plan.principals, key=lambda p: p.name)
    if not first:
        raise NotApplicable("no principals")
    lua = env.lua
    env.lua = lua.replace("found = PRINCIPALS[sha256_hex(key)] or false",
                          f'found = PRINCIPALS[sha256_hex(key)] or {{name = "{first[0].name}", '
                          f'role = "{first[0].role}"}}')
    if env.lua == lua:
        raise NotApplicable("no key lookup")
    return f"unknown keys -> {first[0].name}"


def kinds() -> Iterator[str]:
    yield from sorted({op.kind for op in OPERATORS.values()})
