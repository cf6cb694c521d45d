"""Compare two inventories: the upgrade-review view (e.g. vLLM 0.28 -> 0.29 -> 0.33).

Routes are compared per path. A path may carry several routes (``/metrics`` is a
mount and a GET route, ``/ping`` is a GET and a POST route); its *surface* is the
union of their methods and kinds. A path present on one side only is ``added`` or
``removed``; a path on both sides is ``changed`` when its methods, its
``--api-key`` guard or its kinds differ (endpoint moves alone are not changes).
Changes to paths outside vLLM's guarded prefixes (on either side) come first:
those are the ones that answer without a key.

Request fields are compared per route (path and method) present on both sides when both
inventories record request bodies (``route.request``): field positions added, removed or
changed (types, required, default, enum, truncated), and body-level changes (how the body is
found, media type, model class names, body types, treatment of unknown fields). A position
added or removed under a parent that is itself added or removed is folded into the parent
(``nested`` counts them). A model that only moved module is not a change, like an endpoint.
Fields are listed only where both sides validate the body against a model; a route whose
body stops (or starts) being validated is one body change.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scanner.inventory.model import Inventory, NestedField, RequestBody, Route, RouteKind

ChangeKind = Literal["added", "removed", "changed"]
CHANGE_KINDS: tuple[ChangeKind, ...] = ("added", "removed", "changed")


@dataclass(frozen=True)
class PathSurface:
    """Everything one inventory serves at one path."""

    path: str
    kinds: tuple[RouteKind, ...]
    methods: tuple[str, ...]
    guarded: bool
    endpoints: tuple[str, ...]

    @classmethod
    def of(cls, path: str, routes: Iterable[Route]) -> PathSurface:
        rs = list(routes)
        return cls(
            path=path,
            kinds=tuple(sorted({r.kind for r in rs})),
            methods=tuple(sorted({m for r in rs for m in r.methods})),
            guarded=all(r.guarded for r in rs),
            endpoints=tuple(sorted({r.endpoint for r in rs if r.endpoint})),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"kinds": list(self.kinds), "methods": list(self.methods),
                "guarded": self.guarded, "endpoints": list(self.endpoints)}


@dataclass(frozen=True)
class RouteChange:
    path: str
    change: ChangeKind
    old: PathSurface | None = None
    new: PathSurface | None = None
    fields: tuple[str, ...] = ()  # for "changed": which of methods, guard, kind differ

    @property
    def outside_guard(self) -> bool:
        """True when either side answers without vLLM's API key."""
        return any(s is not None and not s.guarded for s in (self.old, self.new))

    @property
    def methods_added(self) -> tuple[str, ...]:
        return _minus(self.new, self.old)

    @property
    def methods_removed(self) -> tuple[str, ...]:
        return _minus(self.old, self.new)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "change": self.change,
            "outside_guard": self.outside_guard,
            "fields": list(self.fields),
            "old": self.old.to_dict() if self.old else None,
            "new": self.new.to_dict() if self.new else None,
        }


def _minus(a: PathSurface | None, b: PathSurface | None) -> tuple[str, ...]:
    return tuple(m for m in (a.methods if a else ()) if m not in (b.methods if b else ()))


@dataclass(frozen=True)
class DiffSide:
    """Which inventory one side is: the name the user gave, and its provenance."""

    label: str
    source: str
    version: str | None
    routes: int
    outside_guard: int
    guarded_prefixes: tuple[str, ...] | None
    content_hash: str

    @classmethod
    def of(cls, label: str, inv: Inventory) -> DiffSide:
        return cls(
            label=label,
            source=f"{inv.source.kind} {inv.source.target}".strip(),
            version=inv.vllm.version if inv.vllm else None,
            routes=len(inv.routes),
            outside_guard=sum(1 for r in inv.routes if not r.guarded),
            guarded_prefixes=inv.vllm.guarded_prefixes if inv.vllm else None,
            content_hash=inv.content_hash,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "source": self.source, "version": self.version,
            "routes": self.routes, "outside_guard": self.outside_guard,
            "guarded_prefixes": list(self.guarded_prefixes) if self.guarded_prefixes else None,
            "content_hash": self.content_hash,
        }


FIELD_ASPECTS = ("types", "required", "default", "enum", "truncated")
BODY_ASPECTS = ("source", "media_type", "models", "types", "extra")


@dataclass(frozen=True)
class FieldChange:
    """One request-field position added, removed or changed on one route."""

    path: str  # the field path: "max_tokens", "messages[].content[].type"
    change: ChangeKind
    old: NestedField | None = None
    new: NestedField | None = None
    aspects: tuple[str, ...] = ()  # for "changed": which of FIELD_ASPECTS differ
    nested: int = 0  # positions under this one, added or removed with it

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.path, "change": self.change, "aspects": list(self.aspects),
                "nested": self.nested,
                "old": self.old.to_dict() if self.old else None,
                "new": self.new.to_dict() if self.new else None}


@dataclass(frozen=True)
class BodyChange:
    """How one route's request body differs (a route present on both sides)."""

    path: str
    method: str
    outside_guard: bool
    old: RequestBody
    new: RequestBody
    aspects: tuple[str, ...] = ()  # which of BODY_ASPECTS differ
    fields: tuple[FieldChange, ...] = ()

    def count(self, change: ChangeKind) -> int:
        return sum(1 for f in self.fields if f.change == change)

    def to_dict(self) -> dict[str, Any]:
        def body(b: RequestBody) -> dict[str, Any]:
            return {"source": b.source, "media_type": b.media_type, "models": list(b.models),
                    "types": list(b.types), "extra": b.extra, "fields": len(b.fields)}

        return {"path": self.path, "method": self.method, "outside_guard": self.outside_guard,
                "aspects": list(self.aspects), "old": body(self.old), "new": body(self.new),
                "fields": [f.to_dict() for f in self.fields]}


@dataclass(frozen=True)
class InventoryDiff:
    old: DiffSide
    new: DiffSide
    changes: tuple[RouteChange, ...]
    middleware_added: tuple[str, ...] = ()
    middleware_removed: tuple[str, ...] = ()
    bodies: tuple[BodyChange, ...] = ()
    # False when either side records no request bodies (an older inventory, or openapi)
    fields_compared: bool = False

    def of_kind(self, change: ChangeKind) -> tuple[RouteChange, ...]:
        return tuple(c for c in self.changes if c.change == change)

    @property
    def outside_guard(self) -> tuple[RouteChange, ...]:
        return tuple(c for c in self.changes if c.outside_guard)

    @property
    def inside_guard(self) -> tuple[RouteChange, ...]:
        return tuple(c for c in self.changes if not c.outside_guard)

    @property
    def guard_prefixes_changed(self) -> bool:
        return (None not in (self.old.guarded_prefixes, self.new.guarded_prefixes)
                and self.old.guarded_prefixes != self.new.guarded_prefixes)

    @property
    def empty(self) -> bool:
        return not (self.changes or self.middleware_added or self.middleware_removed
                    or self.guard_prefixes_changed or self.bodies)

    def field_summary(self) -> dict[str, int]:
        return {"routes": len(self.bodies),
                **{f"fields_{k}": sum(b.count(k) for b in self.bodies) for k in CHANGE_KINDS}}

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind in CHANGE_KINDS:
            of_kind = self.of_kind(kind)
            out[kind] = len(of_kind)
            out[f"{kind}_outside_guard"] = sum(1 for c in of_kind if c.outside_guard)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "old": self.old.to_dict(),
            "new": self.new.to_dict(),
            "summary": self.summary(),
            "guarded_prefixes_changed": self.guard_prefixes_changed,
            "middleware": {"added": list(self.middleware_added),
                           "removed": list(self.middleware_removed)},
            "changes": [c.to_dict() for c in self.changes],
            "request_fields": {"compared": self.fields_compared, "summary": self.field_summary(),
                               "routes": [b.to_dict() for b in self.bodies]},
        }


def surfaces(inv: Inventory) -> dict[str, PathSurface]:
    by_path: dict[str, list[Route]] = defaultdict(list)
    for r in inv.routes:
        by_path[r.path].append(r)
    return {p: PathSurface.of(p, rs) for p, rs in by_path.items()}


def changed_fields(old: PathSurface, new: PathSurface) -> tuple[str, ...]:
    fields = []
    if old.methods != new.methods:
        fields.append("methods")
    if old.guarded != new.guarded:
        fields.append("guard")
    if old.kinds != new.kinds:
        fields.append("kind")
    return tuple(fields)


def route_changes(old: Mapping[str, PathSurface],
                  new: Mapping[str, PathSurface]) -> list[RouteChange]:
    changes = [RouteChange(p, "added", new=new[p]) for p in new.keys() - old.keys()]
    changes += [RouteChange(p, "removed", old=old[p]) for p in old.keys() - new.keys()]
    for p in old.keys() & new.keys():
        fields = changed_fields(old[p], new[p])
        if fields:
            changes.append(RouteChange(p, "changed", old=old[p], new=new[p], fields=fields))
    return sorted(changes, key=_order)


def _order(c: RouteChange) -> tuple[bool, int, str]:
    return (not c.outside_guard, CHANGE_KINDS.index(c.change), c.path)


def _parent(path: str) -> str:
    """The enclosing position of a field path ("" for a top-level field)."""
    if path.endswith("[]"):
        return path[:-2]
    if path.endswith(".*"):
        return path[:-2]
    head, dot, _ = path.rpartition(".")
    return head if dot else ""


def field_changes(old: RequestBody, new: RequestBody) -> tuple[FieldChange, ...]:
    """Positions added, removed or changed from ``old`` to ``new`` (nested ones folded into an
    added or removed parent), in the order of the new body's fields, then the old's."""
    a, b = old.positions(), new.positions()
    order = list(b) + [p for p in a if p not in b]
    added = {p for p in b if p not in a}
    removed = {p for p in a if p not in b}
    out: list[FieldChange] = []
    for p in order:
        if p in added or p in removed:
            side = added if p in added else removed
            if _parent(p) in side:
                continue  # folded into its parent
            nested = sum(1 for q in side if q.startswith(p) and _folds_into(q, p, side))
            out.append(FieldChange(p, "added" if p in added else "removed",
                                   old=a.get(p), new=b.get(p), nested=nested))
            continue
        aspects = tuple(x for x in FIELD_ASPECTS if _aspect(a[p], x) != _aspect(b[p], x))
        if aspects:
            out.append(FieldChange(p, "changed", old=a[p], new=b[p], aspects=aspects))
    return tuple(out)


def _folds_into(path: str, ancestor: str, side: set[str]) -> bool:
    """Is ``path`` below ``ancestor`` with every position between them in ``side``?"""
    p = _parent(path)
    while p and p != ancestor:
        if p not in side:
            return False
        p = _parent(p)
    return p == ancestor


def _aspect(f: NestedField, aspect: str) -> Any:
    return {"types": f.types, "required": f.required, "default": f.default_json,
            "enum": f.enum, "truncated": f.truncated}[aspect]


def _short(models: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(m.rsplit(".", 1)[-1] for m in models)


def body_changes(old: Inventory, new: Inventory) -> tuple[BodyChange, ...]:
    """Request-body changes of the (path, method) pairs both inventories serve over HTTP."""
    def bodies(inv: Inventory) -> dict[tuple[str, str], tuple[RequestBody, bool]]:
        return {(r.path, m): (r.request, r.guarded) for r in inv.routes
                if r.kind == "http" and r.request is not None for m in r.methods
                if not (m == "HEAD" and "GET" in r.methods)}  # HEAD is GET's, without a body

    a, b = bodies(old), bodies(new)
    out: list[BodyChange] = []
    for key in sorted(a.keys() & b.keys()):
        (ob, og), (nb, ng) = a[key], b[key]
        aspects = tuple(x for x in BODY_ASPECTS if _body_aspect(ob, x) != _body_aspect(nb, x))
        # fields are compared where both sides know them; a body that is no longer (or not
        # yet) validated against a model is one body change, not a list of every field
        fields = field_changes(ob, nb) if ob.known and nb.known else ()
        if aspects or fields:
            out.append(BodyChange(key[0], key[1], not (og and ng), ob, nb, aspects, fields))
    return tuple(sorted(out, key=lambda c: (not c.outside_guard, c.path, c.method)))


def _body_aspect(body: RequestBody, aspect: str) -> Any:
    return {"source": body.source, "media_type": body.media_type, "models": _short(body.models),
            "types": body.types, "extra": body.extra}[aspect]


def diff(old: Inventory, new: Inventory, old_label: str = "old",
         new_label: str = "new") -> InventoryDiff:
    compared = all(any(r.request is not None for r in inv.routes) for inv in (old, new))
    return InventoryDiff(
        old=DiffSide.of(old_label, old),
        new=DiffSide.of(new_label, new),
        changes=tuple(route_changes(surfaces(old), surfaces(new))),
        middleware_added=tuple(m for m in new.middleware if m not in old.middleware),
        middleware_removed=tuple(m for m in old.middleware if m not in new.middleware),
        bodies=body_changes(old, new) if compared else (),
        fields_compared=compared,
    )
