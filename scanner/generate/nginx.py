"""Plan -> NGINX configuration (default deny), rendered through ``templates/nginx*.j2``.

Output files (names relative to the output directory):

``nginx.conf``
    A standalone main file: process settings, runtime paths under
    ``options.runtime_dir``, and ``http { include perimeter-http.conf; }``.
``perimeter-http.conf``
    Everything that belongs in an ``http {}`` block: maps, zones, the upstream and
    the server. Include it in your own ``http {}`` to embed the perimeter; your main
    config then needs the njs module loaded and should set ``pcre_jit on;`` (the JSON
    fast path is a PCRE match over each inspected body; without JIT it costs several
    times more CPU).
``perimeter-proxy.conf``
    The request headers every proxying location sends upstream (included per location).
``perimeter-principals.conf`` (mode 0600)
    ``map``s from the sha256 of a key to the principal's name and role. Read by the master
    when NGINX starts and on ``nginx -s reload`` (after ``keys rotate``/``revoke``: regenerate,
    reload; requests in flight finish on the old workers). ``generate`` prints where it is read.
``perimeter.js``
    The njs module: key hashing, the interpreter of the rule programs (the exact JSON body
    check) and token budgets.
``perimeter-rules.json``
    The plan's rule programs (scanner/plan/program.py), which NGINX loads once at configure time
    (``js_preload_object``) into an immutable object every njs VM shares: not parsed per request.
``perimeter.lua`` (only with ``lua_module``)
    The Lua runtime's module: the key hash and the body checks of the routes it takes (see
    ``lua_module``), with Envoy's rule-program interpreter and the programs as Lua tables.
``perimeter-identity.json``
    Who a verified client certificate names and each ``auth: jwt`` audience's token rules (no
    secret: names, roles, issuers), preloaded the same way (``perimeter_identity``); regenerate
    and reload with the principals.

Generator options (``GenerateOptions.extra``):

``njs_module``
    Path of ``ngx_http_js_module.so``. When given, ``nginx.conf`` starts with
    ``load_module`` for it (Debian's ``libnginx-mod-http-js``:
    ``/usr/lib/nginx/modules/ngx_http_js_module.so``). Leave it out for builds with
    njs built in, or when your own main config already loads the module.
``lua_module``
    Directory holding Debian's ``ndk_http_module.so`` and ``ngx_http_lua_module.so``
    (``/usr/lib/nginx/modules``: ``libnginx-mod-http-ndk``, ``libnginx-mod-http-lua``, with
    ``lua-resty-core``): the Lua runtime, OpenResty style (LuaJIT, its VM kept across requests).
    ``nginx.conf`` loads both after njs's; ``perimeter-http.conf`` sets ``lua_package_path`` to the
    config directory (``config_dir``, else the output directory: one must be known) and loads
    ``perimeter.lua`` once (``init_by_lua_block``). The key hash is then ``set_by_lua`` (Lua's
    sha256, cached per bearer per worker, bounded), and a route whose every body is parsed runs
    its check by ``content_by_lua`` with Envoy's interpreter, unless it needs what only njs does
    (a token budget, the fleet's limiter, auth jwt, owned response ids, asking for usage): each
    such location says which runtime checks it in a comment. Needs ``njs_module`` (a build that
    loads dynamic modules; the static pip build does not); the same verdicts, reasons, rewritten
    bodies and access-log fields as njs.
``config_dir``
    Absolute directory the files will live in; includes and ``js_import`` then use
    absolute paths (needed when ``perimeter-http.conf`` is included from a main
    config elsewhere). Default: paths relative to NGINX's configuration prefix, i.e.
    the directory of the file given to ``nginx -c``: the output directory
    (``options.output_dir``), or wherever the whole directory is copied.
``upstream_keepalive``
    Idle keep-alive connections to vLLM per worker (default 32; ``0``: a new
    connection per request, e.g. for an upstream that closes connections after errors).
``njs``
    The target's njs version (``0.7.9``); default: read from ``njs_module`` when given, else
    assumed >= 0.8 (the static build's 0.9). Token budgets (``limits.tokens_per_minute``) need
    ``js_shared_dict_zone`` (njs >= 0.8): a plan with them is refused for an older njs.
``worker_processes`` (default ``auto``), ``user`` (default: none emitted),
``ca_bundle`` (CA file for an upstream TLS leg without ``ca``; default
``/etc/ssl/certs/ca-certificates.crt``).

See :mod:`scanner.generate.nginx_model` for how a plan becomes locations.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import jinja2

from scanner import resources
from scanner.errors import GenerateError, InternalError
from scanner.generate import envoy
from scanner.generate.common import OWNER_HOLDS, config_dir, owner_secret
from scanner.generate.interface import GeneratedConfig, GeneratedFile, GenerateOptions, RuntimeFile
from scanner.generate.nginx_model import (
    HTTP,
    IDENTITY,
    INCLUDED,
    LUA,
    MAIN,
    NJS,
    PRINCIPALS,
    PROXY,
    RULES,
    UPSTREAM_KEY,
    NginxModel,
    Weakening,
    build_model,
    identity_json,
    lua_programs,
    rules_json,
)
from scanner.generate.shared import files as shared_files
from scanner.plan.model import Plan
from scanner.plan.vllm_json import js_whitespace_class, utf8_whitespace
from scanner.policy.keys import read_upstream_key
from scanner.policy.media import KEY_KINDS
from scanner.rules import BODY_DEPTH


def _environment() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(str(resources.data_dir("templates")))
    env = jinja2.Environment(
        loader=loader, autoescape=False, undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["regex_escape"] = re.escape
    env.filters["chomp"] = lambda text: str(text).rstrip("\n")
    return env


# The files the plan decides (nginx.conf holds process settings; the njs module is fixed text), and
# the rule programs and identity tables (RULES, IDENTITY: rendered by plan_files from the model).
PLAN_TEMPLATES = ((HTTP, "nginx-http.conf.j2", 0o644), (PRINCIPALS, "nginx-principals.conf.j2", 0o600),
                  (PROXY, "nginx-proxy.conf.j2", 0o644))


def plan_files(env: jinja2.Environment, model: NginxModel, plan: Plan) -> tuple[GeneratedFile, ...]:
    """The plan's files rendered from ``model`` (the generator's, or a mutant's)."""
    secret = owner_secret(plan)
    try:
        files = tuple(GeneratedFile(name, env.get_template(t).render(m=model, owner_secret=secret), mode)
                      for name, t, mode in PLAN_TEMPLATES)
    except jinja2.TemplateError as exc:  # a bug in a template, not in the plan
        raise GenerateError(f"nginx generator: template error: {exc}") from exc
    return (*files, GeneratedFile(RULES, rules_json(model)),
            GeneratedFile(IDENTITY, identity_json(model)), *lua_files(model))


LUA_TEMPLATE = "nginx-perimeter.lua.j2"


def lua_files(model: NginxModel) -> tuple[GeneratedFile, ...]:
    """perimeter.lua for the Lua runtime (``model.lua``; none without it): the rule programs as
    Lua tables, Envoy's sha256, JSON reader and interpreter (rendered through the Envoy generator's
    environment: its filters and the tables those templates read), the NGINX adapter."""
    if model.lua is None:
        return ()
    programs, checks = lua_programs(model)
    tables = {"programs": programs, "checks": checks, "key_cache": model.lua.key_cache,
              "whitespace": tuple(w.decode("utf-8") for w in utf8_whitespace()),
              "media_kinds": dict(KEY_KINDS), "body_depth": BODY_DEPTH, "weak": model.weak}
    try:
        text = envoy.environment().get_template(LUA_TEMPLATE).render(m=tables)
    except jinja2.TemplateError as exc:  # a bug in a template, not in the plan
        raise GenerateError(f"nginx generator: {LUA_TEMPLATE}: template error: {exc}") from exc
    return (GeneratedFile(LUA, text),)


NJS_TEMPLATE = "nginx-perimeter.js"
WS_LINE = "var INT_WS = null;   // generated: vllm_json.WHITESPACE (generate/nginx.py njs_module)"


def njs_module(text: str, weak: Weakening | None = None) -> str:
    """The njs module as NGINX loads it: the template rendered with ``weak`` (a mutation operator's
    switches; None: none), the tables it shares with Lua generated from Python (vLLM's whitespace
    around a numeric string: ``INT_WS``)."""
    try:
        text = _environment().from_string(text).render(w=weak or Weakening())
    except jinja2.TemplateError as exc:  # a bug in the template, not in the plan
        raise GenerateError(f"nginx generator: {NJS_TEMPLATE}: template error: {exc}") from exc
    if WS_LINE not in text:
        raise InternalError("templates/nginx-perimeter.js: the INT_WS line the generator fills is missing")
    ws = js_whitespace_class()
    return text.replace(WS_LINE, f"var INT_WS = /^{ws}+|{ws}+$/g;   // generated: vllm_json.WHITESPACE", 1)


def njs_file(model: NginxModel) -> GeneratedFile:
    """perimeter.js rendered for ``model`` (its switches: the generator's none, a mutant's some)."""
    return GeneratedFile(NJS, njs_module(Path(resources.data_file("templates", NJS_TEMPLATE))
                                         .read_text(encoding="utf-8"), model.weak))


class NginxGenerator:
    name = "nginx"

    def render(self, plan: Plan, options: GenerateOptions) -> GeneratedConfig:
        model = build_model(plan, options)
        env = _environment()
        try:
            main = env.get_template("nginx.conf.j2").render(m=model)
        except jinja2.TemplateError as exc:  # a bug in a template, not in the plan
            raise GenerateError(f"nginx generator: template error: {exc}") from exc
        files = [GeneratedFile(MAIN, main), *plan_files(env, model, plan), njs_file(model)]
        if plan.upstream.api_key_file:   # vLLM's key: 0600, included by the master
            key = read_upstream_key(plan.upstream.api_key_file)
            text = ("# vLLM's --api-key (generated, mode 0600)\n"
                    f'proxy_set_header Authorization "Bearer {key}";\n')
            files.append(GeneratedFile(UPSTREAM_KEY, text, mode=0o600))
        files.extend(shared_files(plan))
        return GeneratedConfig(generator=self.name, files=tuple(files), main=MAIN,
                               runtime_files=runtime_files(model, options, {f.name for f in files}))


_HOLDS = {PRINCIPALS: "key hashes", UPSTREAM_KEY: "vLLM's API key"}


def runtime_files(model: NginxModel, options: GenerateOptions, written: set[str]) -> tuple[RuntimeFile, ...]:
    """What NGINX opens by path (includes, ``js_import``): absolute under ``config_dir``, else
    relative to nginx.conf's directory, which is the output directory as written."""
    out_dir = config_dir("nginx", "", options.output_dir)
    out = []
    for key, name in INCLUDED.items():
        if name not in written:
            continue
        path, access = model.includes[key], "0600, read by NGINX's master at start and on reload"
        if not path.startswith("/"):
            access += "; relative to nginx.conf's directory"
            path = str(PurePosixPath(out_dir) / path) if out_dir else path
        holds = _HOLDS.get(name, "") + (OWNER_HOLDS if name == PRINCIPALS and model.owner_secret_file else "")
        out.append(RuntimeFile(path, name, holds, access if name in _HOLDS else ""))
    return tuple(out)
