"""Serve the stand-in (catalog/inventory) or the real engine-less vLLM app until interrupted."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from scanner.errors import UsageError
from scanner.inventory.model import Inventory
from scanner.inventory.vllm_app import VllmExtraction
from scanner.standin.app import build_app
from scanner.standin.real import RealVllmServer


def serve_inventory(inventory: Inventory, host: str, port: int, api_keys: tuple[str, ...],
                    announce: Callable[[str], None]) -> None:
    try:
        import uvicorn
    except ImportError:
        raise UsageError("the stand-in needs uvicorn: pip install 'vllm-perimeter[standin]'") from None
    app, _ = build_app(inventory, api_keys)
    announce(f"stand-in for {inventory.source.target or inventory.source.kind}: "
             f"{len(inventory.routes)} routes on http://{host}:{port} "
             f"(api key: {'on' if api_keys else 'off'}; stats at /__standin__/stats)")
    uvicorn.run(app, host=host, port=port, lifespan="off", log_level="warning", access_log=False)


def serve_real(spec: VllmExtraction, host: str, port: int, announce: Callable[[str], None]) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with RealVllmServer(spec, host=host, port=port) as server:
        announce(f"real vLLM {server.facts.get('version', '?')} app (engine-less) on {server.url}")
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
