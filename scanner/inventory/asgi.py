"""Inventory of any Starlette/FastAPI app named ``module:attr``, loaded in a chosen Python.

The app is imported by the same worker that builds vLLM's app (``_worker.py``,
mode ``asgi``), in a subprocess, so the app's own imports never touch this
process. ``attr`` may be a dotted path, an app, an app wrapped in ASGI
middleware (unwrapped through ``.app``), or a zero-argument factory.

``guarded`` is computed as vLLM's own ``--api-key`` middleware would (its default
guarded prefixes), so an ASGI inventory compares directly with a vLLM one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scanner.errors import UsageError
from scanner.inventory._runner import run_worker
from scanner.inventory.model import VLLM_GUARDED_PREFIXES, Inventory, Source
from scanner.inventory.vllm_app import route_from_raw


@dataclass(frozen=True)
class AsgiExtraction:
    """What to load: ``module:attr`` in ``python``, with ``app_dir`` first on ``sys.path``."""

    target: str
    python: str = sys.executable
    app_dir: str = "."
    factory: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    guarded_prefixes: tuple[str, ...] = VLLM_GUARDED_PREFIXES
    timeout: float = 120.0

    def request(self) -> dict[str, Any]:
        return {
            "mode": "asgi",
            "target": self.target,
            "app_dir": str(Path(self.app_dir).resolve()),
            "factory": self.factory,
        }

    def inventory(self) -> Inventory:
        return extract(self)


def check_target(target: str) -> None:
    """Reject a malformed ``module:attr`` before starting a subprocess."""
    module, sep, attr = target.partition(":")
    if not sep or not module.strip() or not attr.strip():
        raise UsageError(f"{target!r} is not of the form module:attribute (e.g. myapp.main:app)")


def extract(spec: AsgiExtraction) -> Inventory:
    check_target(spec.target)
    if not Path(spec.app_dir).is_dir():
        raise UsageError(f"--app-dir {spec.app_dir} is not a directory")
    env = {**os.environ, **spec.env, "PYTHONDONTWRITEBYTECODE": "1"}
    data = run_worker(spec.python, spec.request(), env, timeout=spec.timeout)
    routes = tuple(route_from_raw(r, spec.guarded_prefixes) for r in data["routes"])
    return Inventory(
        source=Source(kind="asgi", target=spec.target),
        routes=routes,
        middleware=tuple(str(m) for m in data["middleware"]),
    )
