"""``vllm-rs render`` on loopback, engine-free, for tests and the catalog build script.

The model directory is built by ``scripts/build_tiny_model.py`` in vLLM's own Python; the
server starts in about a second with ``HF_HUB_OFFLINE=1`` and is stopped by process group.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from scanner.inventory import live, rust
from scanner.inventory.model import Inventory, Source
from scanner.net import free_port
from scanner.runtime.process import ManagedProcess

HERE = Path(__file__).resolve().parent
BUILD_MODEL = HERE / "scripts" / "build_tiny_model.py"
HOST = "127.0.0.1"
# Render routes as vllm_server::routes::render::build_router registers them (0.28 - 0.33),
# with the methods axum answers for them (HEAD comes with GET).
RENDER_SERVED = {
    ("/health", "GET"), ("/health", "HEAD"),
    ("/ping", "GET"), ("/ping", "HEAD"), ("/ping", "POST"),
    ("/v1/models", "GET"), ("/v1/models", "HEAD"),
    ("/v1/chat/completions/render", "POST"), ("/v1/completions/render", "POST"),
}


def vllm_version(python: str) -> str:
    proc = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                          capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.strip()


def tiny_model(python: str, out: Path) -> Path:
    proc = subprocess.run([python, str(BUILD_MODEL), str(out)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def render_server(python: str, workdir: Path) -> tuple[ManagedProcess, Path]:
    """A not yet started ``vllm-rs render`` of a fresh tiny model, and the binary's path."""
    binary = rust.locate(python)
    model = tiny_model(python, workdir / "model")
    port = free_port(HOST)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    argv = [str(binary), "render", str(model), "--host", HOST, "--port", str(port),
            "--max-model-len", "128"]
    return ManagedProcess("vllm-rs render", argv, HOST, port, workdir / "render.log",
                          start_timeout=60, env=env), binary


def build_catalog(python: str) -> Inventory:
    """``inventory live`` of that vLLM's render server, with a stable source target (see
    ``scripts/build_rust_render_catalog.py``)."""
    with tempfile.TemporaryDirectory(prefix="vllm-perimeter-render-") as tmp:
        server, binary = render_server(python, Path(tmp))
        with server:
            result = live.run(live.LiveInventory(f"http://{server.host}:{server.port}",
                                                 binaries=(str(binary),), timeout=10))
    unknown = result.of("unknown")
    if unknown:
        raise AssertionError(f"{len(unknown)} candidates unknown: {unknown[:3]}")
    target = f"vllm-rs render (vllm=={vllm_version(python)}, tiny local model, no key)"
    return replace(result.inventory, source=Source(kind="live", target=target))
