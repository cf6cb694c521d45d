"""Benchmark (not a test): route extraction time vs a bare import of vLLM's app module.

    .venv/bin/python examples/bench_inventory.py [--python PY] [--runs 5] [--profile default]

Runs, alternately so machine load hits both alike, (a) the bare import
``python -c "import vllm.entrypoints.launchers.app"`` in vLLM's venv, (b) the
extraction through the library (``inventory vllm`` minus CLI start-up: worker
start, vLLM import, serve-argument parsing, build_app, route walk, result file)
and (c) the whole ``vllm-perimeter inventory vllm`` command as a user runs it.
Same environment for all three (the profile's isolated env). Prints medians
and the ratios to the bare import; the target is at most 1.2x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scanner.inventory import catalog, vllm_app

DEFAULT_PYTHON = os.environ.get("VLLM_PERIMETER_VLLM_PYTHON") or str(
    Path.home() / ".cache/vllm-perimeter/venvs/vllm-0.29.0/bin/python")
CLI = Path(sys.executable).with_name("vllm-perimeter")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=DEFAULT_PYTHON)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", default="default", choices=sorted(catalog.PROFILES))
    ap.add_argument("--module", default="vllm.entrypoints.launchers.app",
                    help="module of the bare import (0.28: vllm.entrypoints.openai.api_server)")
    opts = ap.parse_args()

    profile = catalog.profile(opts.profile)
    spec = profile.extraction(opts.python)
    env = spec.effective_env()
    bare_cmd = [opts.python, "-c", f"import {opts.module}"]
    cli_cmd = [str(CLI), "inventory", "vllm", "--python", opts.python, "--isolated-env",
               "--model-config", profile.model_config, "--format", "json", "-o", os.devnull,
               *(f"--env={k}={v}" for k, v in profile.env.items()),
               *(f"--task={t}" for t in profile.tasks), "--", *profile.serve_args]

    def bare() -> None:
        subprocess.run(bare_cmd, env=env, stdout=subprocess.DEVNULL, check=True)

    def extraction() -> None:
        vllm_app.extract(spec)

    def cli() -> None:
        subprocess.run(cli_cmd, stdout=subprocess.DEVNULL, check=True)

    cases = {"bare import": bare, "extraction": extraction, "CLI command": cli}
    for fn in cases.values():  # warm the page cache; not counted
        fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(opts.runs):
        for name, fn in cases.items():
            samples[name].append(timed(fn))
        print(f"run {i + 1}/{opts.runs}: " + "  ".join(
            f"{n}={s[-1]:.2f}s" for n, s in samples.items()), file=sys.stderr)

    base = statistics.median(samples["bare import"])
    print(f"vLLM python: {opts.python}  profile: {opts.profile}  runs: {opts.runs}  "
          f"cpus: {os.cpu_count()}")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"{name:12s} median {med:6.2f}s  min {min(values):6.2f}s  "
              f"ratio {med / base:4.2f}x")


if __name__ == "__main__":
    main()
