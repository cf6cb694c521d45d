"""The checks registry: ``@register`` a class with ``id``, ``generate`` and ``judge``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeVar

from scanner.errors import UsageError
from scanner.plan.model import Decision, Plan
from scanner.probe.cases import Case
from scanner.probe.interface import Attempt, Credential, Finding, ProbeOptions, Target, Vantage


@dataclass(frozen=True)
class CheckContext:
    plan: Plan
    target: Target
    credentials: tuple[Credential, ...]
    vantages: tuple[Vantage, ...]
    options: ProbeOptions
    catalog_paths: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (path, methods) of known routes
    _index: dict[tuple[str, str], Decision] = field(default_factory=dict, compare=False, repr=False)

    def decision(self, method: str, path: str) -> Decision | None:
        if not self._index:
            for d in self.plan.decisions:
                if d.kind != "mount":
                    self._index.setdefault((d.method, d.path), d)
        return self._index.get((method, path))

    def source_address(self, vantage: Vantage) -> str | None:
        """The address the target sees: the bound one, else loopback for a loopback target."""
        if vantage.address:
            return vantage.address
        host = self.target.url.host
        return "127.0.0.1" if host in ("127.0.0.1", "localhost") or host.startswith("127.") else None


Results = Sequence[tuple[Case, Attempt]]


class Check(Protocol):
    id: ClassVar[str]
    title: ClassVar[str]

    def generate(self, ctx: CheckContext) -> Iterable[Case]: ...

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]: ...


REGISTRY: dict[str, Check] = {}
C = TypeVar("C", bound=Callable[[], Check])


def register(cls: C) -> C:
    """Class decorator: instantiate and register a check under its ``id``."""
    inst = cls()
    REGISTRY[inst.id] = inst
    return cls


def selected(ids: Sequence[str]) -> tuple[Check, ...]:
    from scanner.probe import checks  # noqa: F401  (registers the built-in checks)

    if not ids:
        return tuple(REGISTRY.values())
    unknown = [i for i in ids if i not in REGISTRY]
    if unknown:
        raise UsageError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
    return tuple(REGISTRY[i] for i in ids)
