"""Render an inventory as a table (rich) or JSON."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from scanner.inventory.model import Inventory


def to_table(inv: Inventory, width: int = 120) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    title = f"{len(inv.routes)} routes from {inv.source.kind} {inv.source.target}".strip()
    table = Table(title=title, show_lines=False)
    table.add_column("path", overflow="fold")
    table.add_column("methods")
    table.add_column("kind")
    table.add_column("api-key guard")
    table.add_column("endpoint", overflow="fold")
    for r in inv.routes:
        guard = "guarded" if r.guarded else "OPEN"
        table.add_row(r.path, ",".join(r.methods), r.kind, guard, r.endpoint)
    console.print(table)
    if inv.vllm is not None:
        v = inv.vllm
        open_count = sum(1 for r in inv.routes if not r.guarded)
        console.print(
            f"vLLM {v.version}  tasks={','.join(v.tasks)}  model_config={v.model_config}  "
            f"api_key_configured={v.api_key_configured}\n"
            f"{open_count} of {len(inv.routes)} routes are outside vLLM's --api-key guard "
            f"({', '.join(v.guarded_prefixes)})"
        )
    console.print(f"content_hash {inv.content_hash}")
    return buf.getvalue()


def render(inv: Inventory, fmt: str) -> str:
    return inv.to_json() if fmt == "json" else to_table(inv)
