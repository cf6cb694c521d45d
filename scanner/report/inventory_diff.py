"""Render an inventory diff as a table (routes outside vLLM's --api-key guard first) or JSON."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from scanner import canonical
from scanner.inventory.diff import BodyChange, DiffSide, FieldChange, InventoryDiff, PathSurface, RouteChange
from scanner.inventory.model import NestedField, RequestBody
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


def _facts(f: NestedField | None) -> str:
    """A field position in a few words: types, required, default, enum."""
    if f is None:
        return ""
    words = [",".join(f.types)]
    if f.required:
        words.append("required")
    if f.default_json is not None:
        words.append(f"default {f.default_json}")
    if f.enum:
        words.append("one of " + ",".join(f.enum))
    if f.truncated:
        words.append(f"(not expanded: {f.truncated})")
    return "  ".join(words)


def _aspect_change(old: NestedField, new: NestedField, aspect: str) -> str:
    if aspect == "types":
        return f"types {','.join(old.types)} -> {','.join(new.types)}"
    if aspect == "required":
        return "optional -> required" if new.required else "required -> optional"
    if aspect == "default":
        return f"default {old.default_json or '(none)'} -> {new.default_json or '(none)'}"
    if aspect == "enum":
        if not old.enum or not new.enum:
            return f"one of {','.join(old.enum) or '(any)'} -> {','.join(new.enum) or '(any)'}"
        plus = [v for v in new.enum if v not in old.enum]
        minus = [v for v in old.enum if v not in new.enum]
        return "enum " + " ".join([*(f"+{v}" for v in plus), *(f"-{v}" for v in minus)])
    return f"not expanded: {old.truncated or '-'} -> {new.truncated or '-'}"


def _field_detail(c: FieldChange) -> str:
    if c.change == "changed" and c.old is not None and c.new is not None:
        return "; ".join(_aspect_change(c.old, c.new, a) for a in c.aspects)
    return _facts(c.new if c.change == "added" else c.old)


def _field_name(c: FieldChange) -> str:
    return c.path + (f" (+{c.nested} nested)" if c.nested else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _body_words(b: RequestBody) -> str:
    models = ",".join(m.rsplit(".", 1)[-1] for m in b.models[:3]) + (
        f" +{len(b.models) - 3}" if len(b.models) > 3 else "")
    count = _plural(len(b.fields), "field") if b.known and b.types else ""
    return " ".join(x for x in (b.source, b.media_type, models, f"extra={b.extra}" if b.extra else "",
                                count) if x)


def _body_title(b: BodyChange) -> str:
    guard = "OPEN" if b.outside_guard else "guarded"
    names = [m.rsplit(".", 1)[-1] for m in b.new.models]
    models = (names[0] + (f" +{len(names) - 1} more" if len(names) > 1 else "")) if names else b.new.source
    if not b.fields:
        return f"{b.method} {b.path} ({guard}; {models}): the body changed"
    counts = ", ".join(f"{b.count(k)} {k}" for k in ("added", "removed", "changed"))
    return f"{b.method} {b.path} ({guard}; {models}): {counts}"


def _fields_section(console: Console, d: InventoryDiff) -> None:
    if not d.fields_compared:
        console.print("request fields: not compared (an inventory records no request bodies)",
                      highlight=False)
        return
    if not d.bodies:
        console.print("request fields: no differences on the routes both sides serve", highlight=False)
        return
    s = d.field_summary()
    console.print(f"Request fields, routes on both sides: {s['routes']} routes differ; "
                  f"{s['fields_added']} fields added, {s['fields_removed']} removed, "
                  f"{s['fields_changed']} changed", highlight=False)
    for b in d.bodies:
        console.print(_body_title(b), highlight=False, markup=False)
        table = Table(show_lines=False)
        table.add_column("change", no_wrap=True)
        table.add_column("field", overflow="fold", max_width=48)
        table.add_column("detail", overflow="fold")
        if b.aspects:
            table.add_row("~ body", "(the body)", f"{_body_words(b.old)} -> {_body_words(b.new)}")
        for c in b.fields:
            table.add_row(_MARK[c.change], _field_name(c), _field_detail(c))
        console.print(table, highlight=False)


def to_table(d: InventoryDiff, width: int = 120, fields: bool = True) -> str:
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
    if fields:
        _fields_section(console, d)
    return _rstrip(buf.getvalue())


def render(d: InventoryDiff, fmt: str, fields: bool = True) -> str:
    if fmt == "json":
        data = d.to_dict()
        if not fields:
            data.pop("request_fields")
        return canonical.dumps(data)
    return to_table(d, fields=fields)


def _rstrip(text: str) -> str:
    """rich pads titles and rows to the console width; drop the trailing blanks."""
    return "".join(line.rstrip() + "\n" for line in text.splitlines())
