"""Hand weakenings a reviewer or an SRE might make to the generated configs (issue 18, done when:
a hidden set of realistic weakenings of both proxies makes ``probe`` exit non-zero with default
flags). Each is an edit of the generated text, not one of scanner/mutate's operators, in every
area the plan decides: routes and methods, keys, roles, networks, bodies, headers, the
upstream request, protocols, timeouts, error pages, limits. Each edited config must still be
accepted by the proxy (verify validates it before starting it); probed through the real proxy in
front of the stand-in and its witness, with the checks of its area, the probe must exit 1."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from scanner.generate.nginx_model import LUA, RULES
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.inputs import load_policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import Edit, but_rates, proxy_named, sub, unpaced

pytestmark = [pytest.mark.nginx, pytest.mark.envoy]

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300)
HTTP, PROXY, PRINCIPALS, ENVOY = "perimeter-http.conf", "perimeter-proxy.conf", "perimeter-principals.conf", \
    "envoy.yaml"

# the checks of each area (the witness is always there)
AREAS: dict[str, tuple[str, ...]] = {
    "access": ("matrix", "bypass", "sweep", "mounts"), "matrix": ("matrix",), "bypass": ("bypass",),
    "spoof": ("spoof",), "limits": ("limits",), "media": ("media",),
    "upstream": ("upstream",), "protocol": ("protocol",), "timeout": ("timeout",),
    "rate": ("rate", "concurrency"), "tokens": ("token-budget",),
}


# --- edits ------------------------------------------------------------------------------------------

def text(name: str, old: str, new: str, count: int = -1) -> Edit:
    """The literal ``old`` replaced by ``new`` (``count`` times, all by default) in ``name``."""
    def edit(conf: Path) -> None:
        f = conf / name
        before = f.read_text()
        assert old in before, (name, old)
        f.write_text(before.replace(old, new, count))
    return edit


def block(name: str, head: str, old: str, new: str, end: str = "\n    }\n") -> Edit:
    """``old`` (a regex) replaced by ``new`` only inside the block that starts with the literal
    ``head`` and ends at the next ``end`` (an NGINX location, an Envoy route or Lua group)."""
    def edit(conf: Path) -> None:
        f = conf / name
        full = f.read_text()
        start = full.index(head)
        stop = full.index(end, start + len(head))
        part = full[start:stop]
        changed = re.sub(old, new, part)
        assert changed != part, (name, head, old)
        f.write_text(full[:start] + changed + full[stop:])
    return edit


def both(*edits: Edit) -> Edit:
    def edit(conf: Path) -> None:
        for e in edits:
            e(conf)
    return edit


def plain_cluster(method: str, path: str) -> Edit:
    """The routes of the Lua group of ``method path`` sent to the plain cluster instead of the
    principal's (the group's concurrency clusters dropped: what makes a group edit work in Envoy)."""
    def edit(conf: Path) -> None:
        full = (conf / ENVOY).read_text()
        start = full.index(eroute(method, path))
        group = re.compile(r'"perimeter\.lua": \{g: "(g\d+)"\}').search(full, start).group(1)  # type: ignore[union-attr]
        sub(ENVOY, rf'(\{{g: "{group}"\}}\n +route:\n +)cluster_header: "x-perimeter-upstream"',
            r'\1cluster: "vllm"')(conf)
        egroup(method, path, r'\["upstream"\] = \{[^{}]*\}', '["upstream"] = nil')(conf)
    return edit


LUA_OFF = ('"perimeter.lua":\n    "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute\n'
           '    disabled: true')


def _location_sets(text: str, path: str, var: str) -> str:
    """What the NGINX location of ``path`` sets ``$perimeter_<var>`` to (its check id, its named
    upstream location)."""
    start = text.index(nloc(path))
    m = re.compile(rf"set \$perimeter_{var} (\S+);").search(text, start, text.index("\n    }\n", start))
    assert m, (path, var)
    return m.group(1)


Steps = list[dict[str, Any]]


def program(path: str, change: Callable[[Steps], Steps]) -> Edit:
    """The rule program of the NGINX route ``path``'s body check (its id looked up, never assumed)
    replaced by ``change`` of it, as a new program of that check alone (perimeter-rules.json)."""
    def edit(conf: Path) -> None:
        f = conf / RULES
        doc = json.loads(f.read_text())
        cid = _location_sets((conf / HTTP).read_text(), path, "check")
        old = doc["programs"][doc["checks"][cid]]
        new = change(copy.deepcopy(old))
        assert new != old, path
        pid = f"r{len(doc['programs']) + 1}"
        doc["programs"][pid], doc["checks"][cid] = new, pid
        f.write_text(json.dumps(doc))
    return edit


def step(op: str, key: str, old: object, new: object, **match: object) -> Callable[[Steps], Steps]:
    """Each ``op`` step (whose fields include ``match``) with ``key`` = ``new`` (it was ``old``)."""
    def change(steps: Steps) -> Steps:
        for s in steps:
            if s["op"] == op and all(s.get(k) == v for k, v in match.items()):
                assert s[key] == old, (op, key, s[key])
                s[key] = new
        return steps
    return change


def mode(field: str, new: str) -> Callable[[Steps], Steps]:
    def change(steps: Steps) -> Steps:
        for s in steps:
            if s["op"] == "keys":
                s["modes"] = {**s["modes"], field: new}
        return steps
    return change


def lprogram(path: str, old: str, new: str) -> Edit:
    """``old`` (a regex) replaced by ``new`` in the rule program that perimeter.lua (the NGINX Lua
    runtime) runs for the route ``path``'s body check (its line of the Lua table PROGRAMS; the
    check id looked up in the location, never assumed), as a new program of that check alone."""
    def edit(conf: Path) -> None:
        http = (conf / HTTP).read_text()
        start = http.index(nloc(path))
        assert "content_by_lua_block" in http[start:http.index("\n    }\n", start)], f"{path}: not Lua's"
        cid = _location_sets(http, path, "check")
        f = conf / LUA
        full = f.read_text()
        checks = re.compile(r'\nlocal CHECKS = \{[^\n]*\}\n').search(full)
        assert checks, "CHECKS"
        pid = re.compile(r'\["' + cid + r'"\] = "(r\d+)"').search(checks.group(0))
        assert pid, cid
        line = re.compile(r'\n( +)\["' + pid.group(1) + r'"\] = (\{[^\n]*\}),\n').search(full)
        assert line, pid.group(1)
        changed = re.sub(old, new, line.group(2))
        assert changed != line.group(2), (path, old)
        added = f'{line.group(1)}["{pid.group(1)}x"] = {changed},\n'
        full = full[:line.end()] + added + full[line.end():]
        table = checks.group(0).replace(f'["{cid}"] = "{pid.group(1)}"', f'["{cid}"] = "{pid.group(1)}x"')
        f.write_text(full.replace(checks.group(0), table))
    return edit


def named(path: str, old: str, new: str) -> Edit:
    """``old`` replaced by ``new`` in the named location the route ``path`` hands its body to."""
    def edit(conf: Path) -> None:
        up = _location_sets((conf / HTTP).read_text(), path, "up")
        block(HTTP, f"    location {up} {{\n", old, new)(conf)
    return edit


def egroup(method: str, path: str, old: str, new: str) -> Edit:
    """``old`` replaced by ``new`` in the Lua group of the Envoy route ``method path``."""
    def edit(conf: Path) -> None:
        full = (conf / ENVOY).read_text()
        start = full.index(eroute(method, path))
        m = re.compile(r'"perimeter\.lua": \{g: "(g\d+)"\}').search(full, start, full.index(EROUTE_END, start + 1))
        assert m, (method, path)
        block(ENVOY, f'["{m.group(1)}"] = {{', old, new, EGROUP_END)(conf)
    return edit


def eprogram(method: str, path: str, old: str, new: str) -> Edit:
    """``old`` (a regex) replaced by ``new`` in the rule program of the Envoy route ``method path``'s
    Lua group (its line of the Lua table PROGRAMS), as a new program of that group alone."""
    def edit(conf: Path) -> None:
        full = (conf / ENVOY).read_text()
        start = full.index(eroute(method, path))
        g = re.compile(r'"perimeter\.lua": \{g: "(g\d+)"\}').search(full, start, full.index(EROUTE_END, start + 1))
        assert g, (method, path)
        head = full.index(f'["{g.group(1)}"] = {{')
        pid = re.compile(r'\["program"\] = "(r\d+)"').search(full, head, full.index(EGROUP_END, head))
        assert pid, (method, path)
        line = re.compile(r'\n( +)\["' + pid.group(1) + r'"\] = (\{[^\n]*\}),\n').search(full)
        assert line, pid.group(1)
        changed = re.sub(old, new, line.group(2))
        assert changed != line.group(2), (method, path, old)
        added = f'{line.group(1)}["{pid.group(1)}x"] = {changed},\n'
        (conf / ENVOY).write_text(full[:line.end()] + added + full[line.end():])
        egroup(method, path, re.escape(f'["program"] = "{pid.group(1)}"'), f'["program"] = "{pid.group(1)}x"')(conf)
    return edit


def nloc(path: str) -> str:
    """The head of the NGINX exact location of ``path``."""
    return f"    location = {path} {{\n"


def eroute(method: str, path: str) -> str:
    """The head of the Envoy allow route of ``method path``."""
    return f'- name: "allow:{method} {path}"\n'


EROUTE_END = "\n              - name: "          # the next route of the virtual host
EGROUP_END = "},\n"                              # the end of a Lua group (its line of GROUPS)
TEMPLATE_LOC = '    location ~ "^/v1/responses/(?:[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255})\\z" {\n'
TEMPLATE_RE = "[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255}"
VLLM_LOCATION = """
    location @vllm_errors {
        proxy_pass http://vllm_upstream;
        proxy_set_header Host "127.0.0.1";
        include "perimeter-proxy.conf";
    }
"""


@dataclass(frozen=True)
class Weakening:
    proxy: str            # "nginx" (static 1.31), "nginx-debian" (1.22), "nginx-lua" (1.22 and its Lua
                          # runtime) or "envoy" (1.40)
    area: str             # a key of AREAS: the checks that must catch it
    edit: Edit
    paced: bool = False   # under the policy's own rate limits (rate-limit weakenings)
    exit: int = 1         # 3: the listener no longer answers HTTP/1.1 (the run cannot start)
    slow: bool = False    # left out of CI for its time (-m 'not slow'): another of its kind runs there


W = Weakening
NGINX_HTTP_ANY = ("nginx", "nginx-debian")

WEAKENINGS: dict[str, Weakening] = {
    # --- routes and methods: NGINX
    "nginx: exact location made a prefix (/v1/models)": W(
        "nginx", "bypass", text(HTTP, "location = /v1/models {", "location /v1/models {")),
    "nginx: exact location made a case-insensitive regex without \\z (/v1/chat/completions)": W(
        "nginx", "bypass", text(HTTP, "location = /v1/chat/completions {", 'location ~* "^/v1/chat/completions$" {')),
    "nginx: the template location made case-insensitive": W(
        "nginx", "bypass", both(text(HTTP, 'location ~ "^/v1/responses/', 'location ~* "^/v1/responses/'),
                                text(HTTP, 'if ($perimeter_path !~ "^(?<perimeter_fwd>/v1/responses/',
                                     'if ($perimeter_path !~* "^(?<perimeter_fwd>/v1/responses/'))),
    "nginx: the catch-all location proxies to vLLM": W(
        "nginx", "matrix", sub(HTTP, r"(    location / \{\n)        set \$perimeter_reason not-allowlisted;\n"
                               r"        return 404;\n", r"\1        proxy_pass http://vllm_upstream;\n")),
    "nginx: catch-all try_files falls back to vLLM": W(
        "nginx", "matrix", both(sub(HTTP, r"(    location / \{\n)        set \$perimeter_reason not-allowlisted;\n"
                                    r"        return 404;\n", r"\1        try_files $uri @vllm_errors;\n"),
                               text(HTTP, "    # Replies made by the proxy itself.\n",
                                    VLLM_LOCATION + "    # Replies made by the proxy itself.\n"))),
    "nginx: a denied path (/openapi.json) proxied for the developers": W(
        "nginx", "matrix", text(HTTP, "    # /detokenize: POST\n",
                                "    location = /openapi.json { proxy_pass http://vllm_upstream; }\n"
                                "    # /detokenize: POST\n")),
    "nginx: a method added (GET on /v1/chat/completions)": W(
        "nginx", "matrix", block(HTTP, nloc("/v1/chat/completions"), r"if \(\$request_method != POST\)",
                                 'if ($request_method !~ "^(POST|GET)$")')),
    "nginx: the method check removed on /version": W(
        "nginx", "matrix", block(HTTP, nloc("/version"), r"        if \(\$request_method != GET\) \{ return 405; \}\n", "")),
    "nginx: the method check replaced by limit_except GET (/v1/models)": W(
        "nginx", "matrix", block(HTTP, nloc("/v1/models"), r"        if \(\$request_method != GET\) \{ return 405; \}\n",
                                 "        limit_except GET { deny all; }\n")),
    "nginx: the template location regex loosened to [^/]+": W(
        "nginx", "upstream", text(HTTP, TEMPLATE_RE + ")", "[^/]+)")),
    "nginx-debian: a method added (POST on /v1/models)": W(
        "nginx-debian", "matrix", block(HTTP, nloc("/v1/models"), r"if \(\$request_method != GET\)",
                                        'if ($request_method !~ "^(GET|POST)$")')),
    # --- keys and roles: NGINX
    "nginx: the key checks removed on /v1/models": W(
        "nginx", "matrix", block(HTTP, nloc("/v1/models"),
                                 r"        set \$perimeter_reason missing-key;\n[\s\S]*?if \(\$perimeter_roles_3 = 0\) \{ return 403; \}\n",
                                 "")),
    "nginx: the principal and role maps default to a guest user": W(
        "nginx", "matrix", both(text(PRINCIPALS, 'map $perimeter_key_hash $perimeter_principal {\n    default "";',
                                     'map $perimeter_key_hash $perimeter_principal {\n    default "guest";'),
                                text(PRINCIPALS, 'map $perimeter_key_hash $perimeter_role {\n    default "";',
                                     'map $perimeter_key_hash $perimeter_role {\n    default "user";'))),
    "nginx: any bearer token is a principal (map default = the token)": W(
        "nginx", "matrix", both(text(PRINCIPALS, 'map $perimeter_key_hash $perimeter_principal {\n    default "";',
                                     'map $perimeter_key_hash $perimeter_principal {\n    default $perimeter_bearer;'),
                                text(PRINCIPALS, 'map $perimeter_key_hash $perimeter_role {\n    default "";',
                                     'map $perimeter_key_hash $perimeter_role {\n    default "service";'))),
    "nginx: a role added to the service audience (user)": W(
        "nginx", "matrix", text(HTTP, '"~^(?:service)$" 1;', '"~^(?:service|user)$" 1;')),
    "nginx: the role regex unanchored (operator)": W(
        "nginx", "matrix", text(HTTP, '"~^(?:operator)$" 1;', '"~(?:operator|service)" 1;')),
    "nginx: the role check removed on /scale_elastic_ep": W(
        "nginx", "matrix", block(HTTP, nloc("/scale_elastic_ep"), r"        if \(\$perimeter_roles_2 = 0\) \{ return 403; \}\n", "")),
    "nginx: the principal header taken from the client": W(
        "nginx", "upstream", text(HTTP, "proxy_set_header X-Perimeter-Principal $perimeter_principal;",
                                  "proxy_set_header X-Perimeter-Principal $http_x_perimeter_principal;")),
    "nginx-debian: a role added to the operator audience": W(
        "nginx-debian", "matrix", text(HTTP, '"~^(?:operator)$" 1;', '"~^(?:operator|service)$" 1;')),
    # --- networks: NGINX
    "nginx: geo default 1 (admin network open)": W(
        "nginx", "matrix", sub(HTTP, r"(geo \$perimeter_net_3 \{\n    default )0;", r"\g<1>1;")),
    "nginx: a CIDR widened (admin /32 -> /24)": W(
        "nginx", "matrix", text(HTTP, "127.0.0.10/32 1;", "127.0.0.0/24 1;")),
    "nginx: the network check removed on /metrics": W(
        "nginx", "matrix", block(HTTP, nloc("/metrics"), r"        if \(\$perimeter_net_2 = 0\) \{ return 403; \}\n", "")),
    "nginx: the network check replaced by allow/deny in the wrong order (/scale_elastic_ep)": W(
        "nginx", "matrix", block(HTTP, nloc("/scale_elastic_ep"), r"        if \(\$perimeter_net_3 = 0\) \{ return 403; \}\n",
                                 "        allow all;\n        deny 127.0.0.0/8;\n")),
    "nginx: real_ip from X-Forwarded-For, every peer trusted": W(
        "nginx", "spoof", text(HTTP, "    server_name _;\n", "    server_name _;\n    set_real_ip_from 0.0.0.0/0;\n"
                               "    real_ip_header X-Forwarded-For;\n    real_ip_recursive on;\n", 1)),
    "nginx-debian: geo default 1 (monitoring network open)": W(
        "nginx-debian", "matrix", sub(HTTP, r"(geo \$perimeter_net_2 \{\n    default )0;", r"\g<1>1;")),
    # --- bodies: NGINX
    "nginx: client_max_body_size x10 on /v1/chat/completions": W(
        "nginx", "limits", block(HTTP, nloc("/v1/chat/completions"), r"client_max_body_size 1048576;",
                                 "client_max_body_size 10485760;")),
    "nginx: client_max_body_size 0 on /tokenize": W(
        "nginx", "limits", block(HTTP, nloc("/tokenize"), r"client_max_body_size \d+;", "client_max_body_size 0;")),
    "nginx: a denied field allowed on /v1/chat/completions (kv_transfer_params)": W(
        "nginx", "limits", program("/v1/chat/completions", mode("kv_transfer_params", "allow"))),
    "nginx: unknown fields passed on /v1/messages": W(
        "nginx", "limits", program("/v1/messages", step("keys", "unknown", "reject", "pass"))),
    "nginx: a JSON cap raised x10 (/v1/chat/completions max_tokens)": W(
        "nginx", "limits", program("/v1/chat/completions", step("cap", "max", 4096, 40960, path="max_tokens"))),
    "nginx: a count raised x10 (/v1/completions stop)": W(
        "nginx", "limits", program("/v1/completions", step("count", "max", 16, 160, field="stop"))),
    "nginx: the body fast path sends bodies straight upstream on /is_scaling_elastic_ep": W(
        "nginx", "limits", named("/is_scaling_elastic_ep", r'        if \(\$perimeter_json_body ~ "\\x22[^\n]*\n', "")),
    "nginx: the output budget raised x10 (/v1/chat/completions)": W(
        "nginx", "limits", program("/v1/chat/completions", step("budget", "cap", 4096, 40960))),
    "nginx: the output budget removed for /v1/responses": W(
        "nginx", "limits", program("/v1/responses", lambda steps: [s for s in steps if s["op"] != "budget"])),
    "nginx: media URLs allowed (/v1/chat/completions)": W(
        "nginx", "media", program("/v1/chat/completions", step("media", "urls", "deny", "allow"))),
    "nginx: media items x10 (/v1/messages)": W(
        "nginx", "media", program("/v1/messages", step("media", "items", 8, 80))),
    "nginx: media data size x10 (/v1/responses)": W(
        "nginx", "media", program("/v1/responses", step("media", "data", 524288, 5242880))),
    "nginx: image_url left out of the media fast-path regex": W(
        "nginx", "media", text(HTTP, "|\\x22(?:i|\\x5cu0069)(?:m|\\x5cu006[dD])(?:a|\\x5cu0061)(?:g|\\x5cu0067)"
                               "(?:e|\\x5cu0065)(?:_|\\x5cu005[fF])(?:u|\\x5cu0075)(?:r|\\x5cu0072)(?:l|\\x5cu006[cC])"
                               "\\x22\\s*:", "")),
    # --- headers: NGINX
    "nginx: Authorization forwarded": W(
        "nginx", "upstream", text(PROXY, "proxy_pass_request_headers off;\n",
                                  "proxy_pass_request_headers off;\nproxy_set_header Authorization $http_authorization;\n")),
    "nginx: every client header passed (proxy_pass_request_headers on)": W(
        "nginx", "upstream", text(PROXY, "proxy_pass_request_headers off;", "proxy_pass_request_headers on;")),
    "nginx: X-Vllm-Priority passed for the schedulers": W(
        "nginx", "upstream", text(PROXY, "proxy_pass_request_headers off;\n",
                                  "proxy_pass_request_headers off;\nproxy_set_header X-Vllm-Priority $http_x_vllm_priority;\n")),
    "nginx: X-Forwarded-Proto taken from the client": W(
        "nginx", "upstream", text(PROXY, "X-Forwarded-Proto $scheme;", "X-Forwarded-Proto $http_x_forwarded_proto;")),
    "nginx: X-Real-IP taken from the client": W(
        "nginx", "upstream", text(PROXY, "X-Real-IP $remote_addr;", "X-Real-IP $http_x_real_ip;")),
    "nginx: WebSocket upgrade headers passed everywhere": W(
        "nginx", "upstream", text(HTTP, 'proxy_set_header Connection "";',
                                  'proxy_set_header Upgrade $http_upgrade;\n        proxy_set_header Connection "upgrade";')),
    "nginx-debian: every client header passed": W(
        "nginx-debian", "upstream", text(PROXY, "proxy_pass_request_headers off;", "proxy_pass_request_headers on;")),
    # --- the upstream request: NGINX
    "nginx: the raw target forwarded on /v1/models (proxy_pass without a URI)": W(
        "nginx", "upstream", text(HTTP, "proxy_pass http://vllm_upstream/v1/models;", "proxy_pass http://vllm_upstream;")),
    "nginx: the raw target forwarded on the template route ($request_uri)": W(
        "nginx", "upstream", block(HTTP, TEMPLATE_LOC, r"        rewrite \^ \$perimeter_fwd break;\n        proxy_pass http://vllm_upstream;",
                                   "        proxy_pass http://vllm_upstream$request_uri;")),
    "nginx: /version proxied to another path": W(
        "nginx", "upstream", text(HTTP, "proxy_pass http://vllm_upstream/version;", "proxy_pass http://vllm_upstream/v1/models;")),
    # --- protocol: NGINX
    "nginx: http2 on the listener (h2c)": W(
        "nginx", "protocol", text(HTTP, "    server_name _;\n", "    server_name _;\n    http2 on;\n", 1)),
    "nginx: the gRPC refusal removed": W(
        "nginx", "protocol", sub(HTTP, r'    if \(\$content_type ~\* "\^application/grpc"\) [^\n]*\n', "")),
    "nginx-debian: http2 on the listen directive (h2c)": W(
        "nginx-debian", "protocol", sub(HTTP, r"(    listen 127\.0\.0\.1:\d+);", r"\1 http2;"), exit=3),
    # --- timeouts: NGINX
    "nginx: proxy_read_timeout raised on /health (10s -> 60s)": W(
        "nginx", "timeout", block(HTTP, nloc("/health"), r"proxy_read_timeout 10s;", "proxy_read_timeout 60s;")),
    # --- error handling: NGINX
    "nginx: error_page 403 handed to vLLM": W(
        "nginx", "matrix", both(text(HTTP, "error_page 403 = @perimeter_403;", "error_page 403 = @vllm_errors;"),
                                text(HTTP, "    # Replies made by the proxy itself.\n",
                                     VLLM_LOCATION + "    # Replies made by the proxy itself.\n"))),
    "nginx: error_page 404 handed to vLLM": W(
        "nginx", "matrix", both(text(HTTP, "error_page 404 = @perimeter_404;", "error_page 404 = @vllm_errors;"),
                                text(HTTP, "    # Replies made by the proxy itself.\n",
                                     VLLM_LOCATION + "    # Replies made by the proxy itself.\n"))),
    # --- limits: NGINX (rate and concurrency: helper B's checks)
    "nginx: limit_req removed on /v1/models": W(
        "nginx", "rate", block(HTTP, nloc("/v1/models"), r"        limit_req zone=\w+ burst=\d+ nodelay;\n", ""), paced=True),
    "nginx: limit_req_dry_run on": W(
        "nginx", "rate", text(HTTP, "    limit_req_status 429;", "    limit_req_status 429;\n    limit_req_dry_run on;"),
        paced=True),

    # --- bodies: NGINX's Lua runtime (perimeter.lua runs the rule programs of the bundled policy's
    # JSON routes; the njs edits of perimeter-rules.json above would not reach them). The slow ones'
    # steps are weakened on nginx-lua in CI too: a key mode here, a cap in test_nested_caps.py, the
    # budget step in test_budget.py (budget-not-enforced)
    "nginx-lua: a denied field allowed on /v1/chat/completions (kv_transfer_params)": W(
        "nginx-lua", "limits", lprogram("/v1/chat/completions", r'\["kv_transfer_params"\] = "reject"',
                                        '["kv_transfer_params"] = "allow"')),
    "nginx-lua: unknown fields passed on /v1/messages": W(
        "nginx-lua", "limits", lprogram("/v1/messages", r'\["unknown"\] = "reject"', '["unknown"] = "pass"'),
        slow=True),
    "nginx-lua: a JSON cap raised x10 (/v1/chat/completions max_tokens)": W(
        "nginx-lua", "limits", lprogram("/v1/chat/completions", r'(\["path"\] = "max_tokens", \["max"\] = )4096\b',
                                        r"\g<1>40960"), slow=True),
    "nginx-lua: a count raised x10 (/v1/completions stop)": W(
        "nginx-lua", "limits", lprogram("/v1/completions", r'(\["field"\] = "stop", \["max"\] = )16\b', r"\g<1>160"),
        slow=True),
    "nginx-lua: the output budget raised x10 (/v1/chat/completions)": W(
        "nginx-lua", "limits", lprogram("/v1/chat/completions",
                                        r'(\["field"\] = "max_completion_tokens", \["absent"\] = "inject", '
                                        r'\["cap"\] = )4096\b', r"\g<1>40960"), slow=True),
    "nginx-lua: the output budget removed for /v1/responses": W(
        "nginx-lua", "limits", lprogram("/v1/responses", r', \{\["op"\] = "budget", (?:[^{}]|\{[^{}]*\})*\}', ""),
        slow=True),
    "nginx-lua: the prompt-list multiplier ignored (the envelope counts n and best_of only)": W(
        "nginx-lua", "limits", text(LUA, "r.seq, r.out, r.from = math.max(1, items) * per,", "r.seq, r.out, r.from = per,")),
    "nginx-lua: the body check skipped on /tokenize (its body sent on unread)": W(
        "nginx-lua", "limits", block(HTTP, nloc("/tokenize"), r'content_by_lua_block \{ return require\("perimeter"\)'
                                     r'\.body\(\) \}', 'content_by_lua_block { return ngx.exec(ngx.var.perimeter_up .. '
                                     '"_checked") }')),
    "nginx-lua: media URLs allowed (/v1/chat/completions)": W(
        "nginx-lua", "media", lprogram("/v1/chat/completions", r'\["urls"\] = "deny"', '["urls"] = "allow"')),
    "nginx-lua: media items x10 (/v1/messages)": W(
        "nginx-lua", "media", lprogram("/v1/messages", r'\["items"\] = 8\b', '["items"] = 80')),
    "nginx-lua: media data size x10 (/v1/responses)": W(
        "nginx-lua", "media", lprogram("/v1/responses", r'\["data"\] = 524288\b', '["data"] = 5242880')),
    "nginx-lua: image_url left out of the media-key regex (Lua then walks no media)": W(
        "nginx-lua", "media", text(HTTP, "|\\x22(?:i|\\x5cu0069)(?:m|\\x5cu006[dD])(?:a|\\x5cu0061)(?:g|\\x5cu0067)"
                                   "(?:e|\\x5cu0065)(?:_|\\x5cu005[fF])(?:u|\\x5cu0075)(?:r|\\x5cu0072)(?:l|\\x5cu006[cC])"
                                   "\\x22\\s*:", "")),

    # --- routes and methods: Envoy
    "envoy: an exact path made a prefix (/v1/models)": W(
        "envoy", "bypass", block(ENVOY, eroute("GET", "/v1/models"), r'path: "/v1/models"', 'prefix: "/v1/models"',
                                 EROUTE_END)),
    "envoy: a path match made case-insensitive (/v1/models)": W(
        "envoy", "bypass", block(ENVOY, eroute("GET", "/v1/models"), r'(\n( +)path: "/v1/models")',
                                 r"\1\n\2case_sensitive: false", EROUTE_END)),
    "envoy: an extra prefix route /v1/ to vLLM": W(
        "envoy", "bypass", text(ENVOY, '              - name: "deny:unknown"\n',
                                '              - name: "dev:v1"\n                match: {prefix: "/v1/"}\n'
                                '                route: {cluster: "vllm"}\n                typed_per_filter_config:\n'
                                + "".join(f"                  {line}\n" for line in LUA_OFF.split("\n"))
                                + '              - name: "deny:unknown"\n')),
    "envoy: a denied route (/openapi.json) routed to vLLM": W(
        "envoy", "matrix", block(ENVOY, '- name: "deny:/openapi.json"\n',
                                 r'direct_response:\n\s+status: 404\n\s+body: \{inline_string: "not found"\}',
                                 'route: {cluster: "vllm"}', EROUTE_END)),
    "envoy: the template regex loosened to .*": W(
        "envoy", "matrix", text(ENVOY, "^/v1/responses/(?:" + TEMPLATE_RE + ")$", "^/v1/responses/.*$")),
    "envoy: the template regex loosened to [^/]+": W(
        "envoy", "upstream", text(ENVOY, "^/v1/responses/(?:" + TEMPLATE_RE + ")$", "^/v1/responses/[^/]+$")),
    "envoy: a method added (GET on /v1/chat/completions)": W(
        "envoy", "matrix", block(ENVOY, eroute("POST", "/v1/chat/completions"), r'string_match: \{exact: "POST"\}',
                                 'string_match: {safe_regex: {regex: "POST|GET"}}', EROUTE_END)),
    "envoy: the method match removed (/v1/models)": W(
        "envoy", "matrix", block(ENVOY, eroute("GET", "/v1/models"),
                                 r'\n +headers:\n +- name: ":method"\n +string_match: \{exact: "GET"\}', "",
                                 EROUTE_END)),
    # --- keys and roles: Envoy
    "envoy: the Lua key check disabled on /v1/models": W(
        "envoy", "matrix", both(block(ENVOY, eroute("GET", "/v1/models"), r"(\n( +)typed_per_filter_config:\n)",
                                      r'\1\2  "perimeter.lua":\n\2    "@type": type.googleapis.com/envoy.extensions.'
                                      r"filters.http.lua.v3.LuaPerRoute\n\2    disabled: true\n", EROUTE_END),
                                block(ENVOY, eroute("GET", "/v1/models"), r'cluster_header: "x-perimeter-upstream"',
                                      'cluster: "vllm"', EROUTE_END))),
    "envoy: missing key allowed (/v1/chat/completions: key = false, plain cluster)": W(
        "envoy", "matrix", both(egroup("POST", "/v1/chat/completions", r'\["key"\] = true', '["key"] = false'),
                                plain_cluster("POST", "/v1/chat/completions"))),
    "envoy: roles unchecked for the operator routes (roles = nil, plain cluster)": W(
        "envoy", "matrix", both(egroup("POST", "/scale_elastic_ep", r'\["roles"\] = \{\["operator"\] = true\}', '["roles"] = nil'), plain_cluster("POST", "/scale_elastic_ep"))),
    "envoy: a role added to the service routes (user, plain cluster)": W(
        "envoy", "matrix", both(egroup("POST", "/tokenize", r'\["roles"\] = \{\["service"\] = true\}',
                                      '["roles"] = {["service"] = true, ["user"] = true}'),
                                plain_cluster("POST", "/tokenize"))),
    "envoy: a key scheme check loosened (any Authorization hashed)": W(
        "envoy", "matrix", text(ENVOY, "found = PRINCIPALS[sha256_hex(key)] or false",
                                'found = PRINCIPALS[sha256_hex(key)] or {name = "guest", role = "user"}')),
    "envoy: the principal header kept from the client": W(
        "envoy", "upstream", both(sub(ENVOY, r'\n +- "x-perimeter-principal"', ""),
                                  sub(ENVOY, r'(key: "x-perimeter-principal", [^\n]+\n +append_action: )\w+',
                                      r"\1ADD_IF_ABSENT"),
                                  text(ENVOY, '["x-perimeter-upstream"] = true,',
                                       '["x-perimeter-upstream"] = true, ["x-perimeter-principal"] = true,'))),
    # --- networks: Envoy
    "envoy: an RBAC CIDR widened (/32 -> /24)": W(
        "envoy", "matrix", sub(ENVOY, r'(address_prefix: "127\.0\.0\.10", prefix_len: )32', r"\g<1>24")),
    "envoy: RBAC principals any on /metrics": W(
        "envoy", "matrix", block(ENVOY, eroute("GET", "/metrics"), r"- direct_remote_ip: \{[^}]*\}", "- any: true",
                                 EROUTE_END)),
    "envoy: RBAC rules moved to shadow_rules on /scale_elastic_ep": W(
        "envoy", "matrix", block(ENVOY, eroute("POST", "/scale_elastic_ep"), r"(\n +)rules:\n", r"\1shadow_rules:\n",
                                 EROUTE_END)),
    "envoy: the network filter left off on /metrics": W(
        "envoy", "matrix", block(ENVOY, eroute("GET", "/metrics"),
                                 r"\n +perimeter\.network:\n(?: {20}.*\n)+?(?= {18}\S)", "\n", EROUTE_END)),
    "envoy: xff_num_trusted_hops 1": W(
        "envoy", "upstream", text(ENVOY, "xff_num_trusted_hops: 0", "xff_num_trusted_hops: 1")),
    "envoy: use_remote_address false": W(
        "envoy", "upstream", text(ENVOY, "use_remote_address: true", "use_remote_address: false")),
    # --- bodies: Envoy
    "envoy: the body limit x10 (/v1/chat/completions: Lua and buffer)": W(
        "envoy", "limits", both(egroup("POST", "/v1/chat/completions", r'\["limit"\] = 1048576\b', '["limit"] = 10485760'),
                                text(ENVOY, "max_request_bytes: 1048605}", "max_request_bytes: 10485760}"),
                                text(ENVOY, "request_body_buffer_limit: 1048605", "request_body_buffer_limit: 10485760"))),
    "envoy: a denied field allowed on /v1/completions (kv_transfer_params)": W(
        "envoy", "limits", eprogram("POST", "/v1/completions", r'\["kv_transfer_params"\] = "reject"',
                                   '["kv_transfer_params"] = "allow"')),
    "envoy: unknown fields allowed (/v1/chat/completions)": W(
        "envoy", "limits", eprogram("POST", "/v1/chat/completions", r'\["unknown"\] = "reject"',
                                   '["unknown"] = "pass"')),
    "envoy: a JSON cap raised x10 (/v1/chat/completions max_tokens)": W(
        "envoy", "limits", eprogram("POST", "/v1/chat/completions", r'(\["path"\] = "max_tokens", \["max"\] = )4096\b',
                                   r"\g<1>40960")),
    "envoy: a count raised x10 (/v1/chat/completions stop)": W(
        "envoy", "limits", eprogram("POST", "/v1/chat/completions", r'(\["field"\] = "stop", \["max"\] = )16\b',
                                   r"\g<1>160")),
    "envoy: the output budget raised x10 (/v1/chat/completions)": W(
        "envoy", "limits", eprogram("POST", "/v1/chat/completions",
                                   r'(\["field"\] = "max_completion_tokens", \["absent"\] = "inject", \["cap"\] = )4096\b',
                                   r"\g<1>40960")),
    "envoy: the body check off for /tokenize's group (check = false)": W(
        "envoy", "limits", egroup("POST", "/tokenize", r'\["check"\] = true', '["check"] = false')),
    "envoy: media URLs allowed (/v1/chat/completions)": W(
        "envoy", "media", eprogram("POST", "/v1/chat/completions", r'\["urls"\] = "deny"', '["urls"] = "allow"')),
    "envoy: media items x10 (/v1/chat/completions)": W(
        "envoy", "media", eprogram("POST", "/v1/chat/completions", r'\["items"\] = 8\b', '["items"] = 80')),
    # --- headers: Envoy
    "envoy: Authorization forwarded": W(
        "envoy", "upstream", sub(ENVOY, r'\n +- "authorization"', "")),
    "envoy: X-Vllm-Priority kept by the header filter": W(
        "envoy", "upstream", text(ENVOY, '["x-request-id"] = true}, ["websocket"]', '["x-request-id"] = true, ["x-vllm-priority"] = true}, ["websocket"]')),
    "envoy: X-Real-IP kept": W(
        "envoy", "upstream", both(sub(ENVOY, r'\n +- "x-real-ip"', ""),
                                  text(ENVOY, '["x-request-id"] = true}, ["websocket"]', '["x-request-id"] = true, ["x-real-ip"] = true}, ["websocket"]'))),
    "envoy: normalize_path off": W(
        "envoy", "upstream", text(ENVOY, "normalize_path: true", "normalize_path: false")),
    "envoy: codec AUTO (h2c prior knowledge)": W(
        "envoy", "protocol", text(ENVOY, "codec_type: HTTP1", "codec_type: AUTO")),
    "envoy: the gRPC refusal route removed": W(
        "envoy", "protocol", sub(ENVOY, r'              - name: "deny:grpc"\n(?:                .*\n)+?(?=              - name)',
                                 "")),
    "envoy: a prefix rewrite on /v1/models": W(
        "envoy", "upstream", block(ENVOY, eroute("GET", "/v1/models"), r'(\n( +)host_rewrite_literal: [^\n]+)',
                                   r'\1\n\2prefix_rewrite: "/v1/models/"', EROUTE_END)),
    # --- timeouts: Envoy
    "envoy: the route timeout disabled on /health (0s)": W(
        "envoy", "timeout", block(ENVOY, eroute("GET", "/health"), r"idle_timeout: 10s", "idle_timeout: 0s",
                                  EROUTE_END)),
    # --- limits: Envoy (rate and concurrency: helper B's checks)
    "envoy: the rate filter left off on /v1/models": W(
        "envoy", "rate", block(ENVOY, eroute("GET", "/v1/models"),
                               r'\n +"perimeter\.rate\.inference":\n.*\n +config: \{\}', "", EROUTE_END), paced=True),
    "envoy: rate limit in shadow mode (filter_enforced 0)": W(
        "envoy", "rate", text(ENVOY, "filter_enforced: {default_value: {numerator: 100,",
                              "filter_enforced: {default_value: {numerator: 0,"), paced=True),
}


def probe_weakened(tmp_path: Path, w: Weakening, checks: tuple[str, ...] | None = None) -> ProbeResult:
    """The bundled policy's config for ``w.proxy``, edited by ``w.edit``, validated, started in
    front of the stand-in and probed with the checks of ``w.area`` (or ``checks``) and the witness."""
    proxy, inventory, port = proxy_named(w.proxy), load_ref(CATALOG), free_port()
    policy = load_policy(None)
    s = loop.setup(inventory, policy if w.paced else unpaced(policy), tmp_path, port)
    written = proxy.write(s.plan, tmp_path / "proxy")
    w.edit(written)
    options = replace(OPTIONS, checks=AREAS[w.area] if checks is None else checks)
    if w.exit == 1 and checks is None:   # as verify's mutants: the first failure decides (exit 1)
        options = replace(options, stop_on_failure=True, lead_check=options.checks[0])
    with StandinThread(inventory, "127.0.0.1", port) as standin:
        return loop.proxy_run(s, proxy, tmp_path / "proxy", options, standin.url).result


@pytest.mark.parametrize("proxy", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_the_unmodified_configs_give_no_finding(tmp_path: Path, proxy: str) -> None:
    """Every check but the paced ones (tests/probe/test_load_values.py, test_timeouts.py): the
    neighbours of allowed routes and the later-check refusals find nothing in the generated configs."""
    res = probe_weakened(tmp_path, W(proxy, "access", lambda _conf: None), but_rates(OPTIONS).checks)
    assert res.deviations == (), [(f.rule, f.title, f.detail) for f in res.deviations]
    assert res.exit_code() == 0
    neighbours = [c for c in res.coverage if c.subject.startswith("neighbours ")]
    assert neighbours and {c.status for c in neighbours} == {"proved"}, neighbours


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if WEAKENINGS[n].slow else n
                                  for n in sorted(WEAKENINGS)])
def test_a_hand_weakening_fails_the_probe(tmp_path: Path, name: str) -> None:
    w = WEAKENINGS[name]
    res = probe_weakened(tmp_path, w)
    gaps = [(c.subject, c.status, c.why) for c in res.coverage if c.status != "proved"][:20]
    if w.exit == 1:   # caught as verify's mutants are: a deviation, the run stopped there (exit 1 or 3)
        assert res.deviations and res.exit_code() != 0, gaps
    else:
        assert res.exit_code() == w.exit, gaps
