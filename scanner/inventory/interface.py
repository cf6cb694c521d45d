"""The inventory seam: every source of route knowledge yields an :class:`Inventory`.

Sources: the real vLLM app built in vLLM's own Python (:mod:`.vllm_app`), any ASGI
app (:mod:`.asgi`), a live ``/openapi.json`` (:mod:`.openapi`), and the bundled
catalogs (:mod:`.catalog`); :mod:`.diff` compares two inventories. Base error:
:class:`scanner.errors.InventoryError` (an invalid inventory file is
:class:`scanner.errors.InventoryFormatError`; an unreachable URL is
:class:`scanner.errors.TargetUnreachableError`).
"""

from __future__ import annotations

from typing import Protocol

from scanner.errors import (
    AppLoadError,
    InventoryError,
    InventoryFormatError,
    ServeArgsError,
    UnsupportedVllmError,
    VllmNotFoundError,
)
from scanner.inventory.model import Inventory, Route, Source, VllmFacts

__all__ = [
    "AppLoadError",
    "Inventory",
    "InventoryError",
    "InventoryFormatError",
    "InventorySource",
    "Route",
    "ServeArgsError",
    "Source",
    "UnsupportedVllmError",
    "VllmFacts",
    "VllmNotFoundError",
]


class InventorySource(Protocol):
    """Anything that can produce an inventory: :class:`~scanner.inventory.vllm_app.VllmExtraction`,
    :class:`~scanner.inventory.asgi.AsgiExtraction`, :class:`~scanner.inventory.openapi.OpenApiFetch`."""

    def inventory(self) -> Inventory: ...
