"""Render an inventory diff as a table (routes outside vLLM's --api-key guard first) or JSON."""

from __future__ import annotations

import io

from rich.table import Table

from scanner import canonical
from scanner.inventory.diff import DiffSide, InventoryDiff, PathSurface, RouteChange
from scanner.output import text_console

_MARK = {"added": "+ added", "removed": "- removed", "changed": "~ changed"}


def _side(s: DiffSide) -> str:
    version = f"vLLM {s.version}, " if s.version else ""
    return f"{s.label} ({version}{s.routes} routes, {s.outside_guard} outside the guard)"


def _guard(s: PathSurface | None) -> str:
    if s is None:
        return ""
    return "guarded" if s.guarded else "OPEN"


def _methods(s: PathSurface | None) -> str:
    return ",".join(s.methods) if s else ""


def _kinds(s: PathSurface | None) -> str:
    return ",".join(s.kinds) if s else ""


_FIELDS = {"methods": _methods, "guard": _guard, "kind": _kinds}


def _cell(c: RouteChange, field: str) -> str:
    fn = _FIELDS[field]
    if c.change == "changed" and field in c.fields:
        return f"{fn(c.old)} -> {fn(c.new)}"
    return fn(c.new if c.new is not None else c.old)


def _table(title: str, changes: tuple[RouteChange, ...]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for col in ("change", "path", "methods", "kind", "api-key guard"):
        table.add_column(col, overflow="fold")
    for c in changes:
        table.add_row(_MARK[c.change], c.path, _cell(c, "methods"), _cell(c, "kind"),
                      _cell(c, "guard"))
    return table


def _summary(d: InventoryDiff) -> str:
    s = d.summary()
    parts = [f"{s[k]} {k} ({s[k + '_outside_guard']} outside the guard)"
             for k in ("added", "removed", "changed")]
    return ", ".join(parts)


def to_table(d: InventoryDiff, width: int = 120) -> str:
    buf = io.StringIO()
    console = text_console(buf, width)
    console.print(f"old: {_side(d.old)}\nnew: {_side(d.new)}")
    if d.guard_prefixes_changed:
        console.print(f"NOTE: vLLM's guarded prefixes changed: "
                      f"{', '.join(d.old.guarded_prefixes or ())} -> "
                      f"{', '.join(d.new.guarded_prefixes or ())}")
    if not d.changes:
        console.print("no route differences")
    else:
        console.print(_summary(d))
    if d.outside_guard:
        console.print(_table("Outside vLLM's --api-key guard (answer without a key):",
                             d.outside_guard))
    if d.inside_guard:
        console.print(_table("Inside the guard:", d.inside_guard))
    for label, items in (("added", d.middleware_added), ("removed", d.middleware_removed)):
        for m in items:
            console.print(f"middleware {label}: {m}")
    return _rstrip(buf.getvalue())


def render(d: InventoryDiff, fmt: str) -> str:
    return canonical.dumps(d.to_dict()) if fmt == "json" else to_table(d)


def _rstrip(text: str) -> str:
    """rich pads titles and rows to the console width; drop the trailing blanks."""
    return "".join(line.rstrip() + "\n" for line in text.splitlines())
