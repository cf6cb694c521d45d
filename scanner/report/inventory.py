"""Render an inventory as a table (rich) or JSON."""

from __future__ import annotations

import io
import shlex
from collections.abc import Iterable, Sequence

from rich.table import Table

from scanner import canonical
from scanner.inventory.catalog import CatalogEntry, Profile
from scanner.inventory.model import VLLM_GUARDED_PREFIXES, Inventory, RequestBody
from scanner.output import text_console


def to_table(inv: Inventory, width: int = 120) -> str:
    buf = io.StringIO()
    console = text_console(buf, width)
    title = f"{len(inv.routes)} routes from {inv.source.kind} {inv.source.target}".strip()
    table = Table(title=title, show_lines=False)
    table.add_column("path", overflow="fold")
    for col in ("methods", "kind", "api-key guard"):
        table.add_column(col, no_wrap=True)
    bodies = any(r.request is not None for r in inv.routes)
    table.add_column("endpoint", overflow="ellipsis", no_wrap=True, max_width=30 if bodies else 44)
    if bodies:
        table.add_column("fields", no_wrap=True)
    for r in inv.routes:
        guard = "guarded" if r.guarded else "OPEN"
        row = [r.path, ",".join(r.methods), r.kind, guard, r.endpoint]
        table.add_row(*row, *([body_cell(r.request)] if bodies else []))
    console.print(table)
    for line in _provenance(inv):
        console.print(line, highlight=False, markup=False)
    console.print(f"content_hash {inv.content_hash}")
    return _rstrip(buf.getvalue())


def body_cell(body: RequestBody | None) -> str:
    """A route's request body in a few characters: the number of top-level fields of the
    model it is validated against (``*``: validated by the handler itself), ``?`` (the
    handler parses the raw request) or ``none`` (nothing reads the body)."""
    if body is None:
        return ""
    if not body.known:
        return "none" if body.source == "none" else "?"
    count = str(len(body.fields)) if body.types else "?"
    return count + (" *" if body.source == "handler" else "")


_MODEL_CONFIG = {
    "none": "none (no pooling task)",
    "standin": "offline stand-in (no model files read)",
    "local": "local model directory",
}


def _provenance(inv: Inventory) -> list[str]:
    """Footer lines: where the routes came from (secrets are already redacted in the model)."""
    open_count = sum(1 for r in inv.routes if not r.guarded)
    lines: list[str] = []
    if inv.vllm is not None:
        v = inv.vllm
        env = " ".join(f"{k}={val}" for k, val in sorted(v.env.items()))
        lines += [
            f"vLLM {v.version}  tasks={','.join(v.tasks)}  "
            f"model_config={_MODEL_CONFIG.get(v.model_config, v.model_config)}",
            f"serve args: {' '.join(v.serve_args) or '(none)'}",
            f"env: {env or '(none)'}",
            f"plugins: {len(v.plugins)}  api_key_configured={v.api_key_configured}"
            + (f"  root_path={v.root_path}" if v.root_path else ""),
        ]
    prefixes = inv.vllm.guarded_prefixes if inv.vllm else VLLM_GUARDED_PREFIXES
    if inv.middleware:
        lines.append("middleware (outermost first): " + ", ".join(inv.middleware))
    lines.append(f"{open_count} of {len(inv.routes)} routes are outside vLLM's --api-key guard "
                 f"({', '.join(prefixes)})")
    known = [r for r in inv.routes if r.request is not None and r.request.known]
    if known:
        raw = sum(1 for r in inv.routes if r.request is not None and r.request.source == "unknown")
        lines.append(f"fields: top-level request fields of the body model ({len(known)} routes; * the "
                     f"handler validates the body itself; field lists in --format json); "
                     f"? the handler parses the raw request ({raw} routes); none: nothing reads the body")
    return lines


def render(inv: Inventory, fmt: str) -> str:
    return inv.to_json() if fmt == "json" else to_table(inv)


def catalog_list(entries: Sequence[CatalogEntry], fmt: str, width: int = 120) -> str:
    """The bundled catalogs: name, vLLM version, route counts, tasks."""
    if fmt == "json":
        return canonical.dumps([
            {"name": e.name, "version": e.version, "routes": len(e.inventory.routes),
             "outside_guard": e.outside_guard, "content_hash": e.inventory.content_hash}
            for e in entries
        ])
    buf = io.StringIO()
    console = text_console(buf, width)
    table = Table(title=f"{len(entries)} bundled catalogs", show_lines=False)
    for col in ("name", "vLLM", "routes", "outside guard", "tasks"):
        table.add_column(col, overflow="fold")
    for e in entries:
        tasks = ",".join(e.inventory.vllm.tasks) if e.inventory.vllm else ""
        table.add_row(e.name, e.version, str(len(e.inventory.routes)), str(e.outside_guard), tasks)
    console.print(table)
    return _rstrip(buf.getvalue())


def profiles(items: Iterable[Profile]) -> str:
    """The catalog build profiles, as the exact inputs they give ``inventory vllm``."""
    out: list[str] = []
    for p in items:
        words = ["inventory vllm --isolated-env", f"--model-config {p.model_config}",
                 *(f"--env {k}={v}" for k, v in sorted(p.env.items())),
                 *(f"--task {t}" for t in p.tasks), "--", shlex.join(p.serve_args)]
        optional = (f"\n    plus {' '.join(p.optional_flags)} where the release has it"
                    if p.optional_flags else "")
        out.append(f"{p.name}: {p.summary}\n  {' '.join(words)}{optional}\n")
    return "\n".join(out)


def _rstrip(text: str) -> str:
    """rich pads titles and rows to the console width; drop the trailing blanks."""
    return "".join(line.rstrip() + "\n" for line in text.splitlines())
