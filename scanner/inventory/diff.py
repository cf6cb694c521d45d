"""Compare two inventories: the upgrade-review view (e.g. vLLM 0.28 -> 0.29 -> 0.33).

Routes are compared per path. A path may carry several routes (``/metrics`` is a
mount and a GET route, ``/ping`` is a GET and a POST route); its *surface* is the
union of their methods and kinds. A path present on one side only is ``added`` or
``removed``; a path on both sides is ``changed`` when its methods, its
``--api-key`` guard or its kinds differ (endpoint moves alone are not changes).
Changes to paths outside vLLM's guarded prefixes (on either side) come first:
those are the ones that answer without a key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scanner.inventory.model import Inventory, Route, RouteKind

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


@dataclass(frozen=True)
class InventoryDiff:
    old: DiffSide
    new: DiffSide
    changes: tuple[RouteChange, ...]
    middleware_added: tuple[str, ...] = ()
    middleware_removed: tuple[str, ...] = ()

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
                    or self.guard_prefixes_changed)

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


def diff(old: Inventory, new: Inventory, old_label: str = "old",
         new_label: str = "new") -> InventoryDiff:
    return InventoryDiff(
        old=DiffSide.of(old_label, old),
        new=DiffSide.of(new_label, new),
        changes=tuple(route_changes(surfaces(old), surfaces(new))),
        middleware_added=tuple(m for m in new.middleware if m not in old.middleware),
        middleware_removed=tuple(m for m in old.middleware if m not in new.middleware),
    )
