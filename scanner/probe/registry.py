"""The checks registry: ``@register`` a :class:`BaseCheck` subclass with ``id``, ``title``,
``subjects`` (what it applies to), ``generate`` (cases) and ``judge`` (findings).

Coverage is derived from a check's subjects and its cases' verdicts (``cover``): every
subject is proved, failed, not proven (with why) or not applicable (with why). A subject
that applies but got no case is not proven, and that is a finding (VP011), never silence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from scanner.errors import UsageError
from scanner.plan.model import Decision, Plan
from scanner.probe import coverage, safe
from scanner.probe.cases import Case, Role, concrete, with_query
from scanner.probe.coverage import Subject
from scanner.probe.expect import Expectation, expect, in_networks
from scanner.probe.interface import Attempt, Coverage, Credential, Finding, ProbeOptions, Target, Vantage


@dataclass(frozen=True)
class CheckContext:
    plan: Plan
    target: Target
    credentials: tuple[Credential, ...]
    vantages: tuple[Vantage, ...]
    options: ProbeOptions
    catalog_paths: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (path, methods) of known routes
    _allowed: dict[str, tuple[Decision, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def witness(self) -> bool:
        return bool(self.options.witness)

    def decision(self, method: str, path: str) -> Decision | None:
        """The plan's decision for ``method`` on the route ``path`` (never a mount's)."""
        d = self.plan.decision(method, path)
        return d if d is not None and d.kind != "mount" else None

    def path_allowed(self, path: str) -> tuple[Decision, ...]:
        if path not in self._allowed:
            self._allowed[path] = tuple(d for d in self.plan.routes().get(path, ()) if d.allowed)
        return self._allowed[path]

    def source_address(self, vantage: Vantage) -> str | None:
        """The address the target sees: the bound one, else loopback for a loopback target."""
        if vantage.address:
            return vantage.address
        host = self.target.url.host
        return "127.0.0.1" if host in ("127.0.0.1", "localhost") or host.startswith("127.") else None

    def expect(self, method: str, path: str, cred: Credential, vantage: Vantage) -> Expectation:
        return expect(self.decision(method, path), cred, self.source_address(vantage),
                      self.path_allowed(path))

    def body_limit(self, path: str) -> int:
        """The smallest body limit of the path's allowed decisions (no limit: a large number)."""
        limits = [d.limits.body_bytes for d in self.path_allowed(path) if d.limits.body_bytes is not None]
        return min(limits, default=1 << 62)

    def slots(self) -> tuple[tuple[Credential, ...], ...]:
        """Credentials grouped by what the perimeter can tell apart: no key, a malformed one, an
        unknown one, and each role (several keys of a role are interchangeable for access)."""
        groups: dict[str, list[Credential]] = {}
        for c in self.credentials:
            groups.setdefault(f"role:{c.role}" if c.kind == "role" else c.label, []).append(c)
        return tuple(tuple(g) for g in groups.values())

    def allowed_cells(self, d: Decision) -> list[tuple[Credential, Vantage]]:
        """Every (credential, vantage) the plan admits for ``d``."""
        return [(cred, v) for v in self.vantages for cred in self.credentials
                if expect(d, cred, self.source_address(v)).expected == "allow"]

    def allowed_cell(self, d: Decision) -> tuple[Credential, Vantage] | None:
        cells = self.allowed_cells(d)
        return cells[0] if cells else None

    def no_cell(self, d: Decision) -> str:
        """Why no credential and vantage of this run is admitted by ``d`` ("" when one is)."""
        if self.allowed_cells(d):
            return ""
        inside = [v for v in self.vantages if in_networks(self.source_address(v), d.networks)]
        if not inside:
            return f"no vantage inside its networks ({', '.join(d.networks)}): add a --vantage there"
        return f"no --key with a role it admits ({', '.join(d.roles) or 'any principal'})"

    def case(self, check: str, method: str, path: str, cred: Credential, vantage: Vantage, role: Role, *,
             subject: str, exp: Expectation | None = None, target: str | None = None, raw: bool = False,
             note: str = "", headers: tuple[tuple[str, str], ...] = (),
             declared: tuple[str, ...] | None = None, state_changing: bool | None = None,
             extra_reasons: tuple[str, ...] = ()) -> Case:
        """A case for ``method path``, made safe for state-changing routes (see scanner.probe.safe)."""
        exp = exp or self.expect(method, path, cred, vantage)
        routes = self.plan.routes().get(path, ())
        if declared is None:
            declared = tuple(sorted({d.method for d in routes}))
        if state_changing is None:
            state_changing = any(d.state_changing for d in routes)
        reasons = exp.reasons + tuple(r for r in extra_reasons if r not in exp.reasons)
        req = safe.safe_request(method, path, declared, state_changing, self.options.allow_state_changes)
        base = target if target is not None else concrete(path)
        if req is None:
            return Case(check, method, path, method, base, cred, vantage, exp.expected, reasons, subject,
                        role=role, state_changing=True, note=note,
                        skip="state-changing; no verified non-acting request (--allow-state-changes "
                             "against a staging upstream or the stand-in)")
        ctype = (("Content-Type", req.content_type),) if req.content_type else ()
        if req.body and len(req.body) > self.body_limit(path):   # refused for its size first: also proof
            reasons += () if "body-too-large" in reasons else ("body-too-large",)
        return Case(check, method, path, req.method, with_query(base, req.query), cred, vantage,
                    exp.expected, reasons, subject, headers=ctype + headers, body=req.body, raw=raw,
                    role=role, state_changing=state_changing, json_body=req.body is not None,
                    note=note or req.how)


Results = Sequence[tuple[Case, Attempt]]


class BaseCheck:
    """A check: subclass, set ``id`` and ``title``, implement ``subjects``, ``generate`` and
    ``judge``; ``cover`` derives coverage from the cases' verdicts unless overridden."""

    id: ClassVar[str] = ""
    title: ClassVar[str] = ""
    # Its answers do not depend on timing or load (no limiter involved): the drift audit compares
    # them attempt by attempt with a baseline's.
    stable: ClassVar[bool] = False

    def subjects(self, ctx: CheckContext) -> Iterable[Subject]:
        raise NotImplementedError

    def generate(self, ctx: CheckContext) -> Iterable[Case]:
        raise NotImplementedError

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        raise NotImplementedError

    def review(self, ctx: CheckContext, case: Case, attempt: Attempt) -> Attempt:
        """The attempt's verdict in the light of what the witness saw (default: as it is)."""
        return attempt

    def cover(self, ctx: CheckContext, subjects: Sequence[Subject], results: Results,
              interrupted: bool = False) -> Iterable[Coverage]:
        return coverage.generic(self.id, subjects, results, interrupted)


Check = BaseCheck
REGISTRY: dict[str, BaseCheck] = {}
C = TypeVar("C", bound=type[BaseCheck])


def register(cls: C) -> C:
    """Class decorator: instantiate and register a check under its ``id``."""
    inst = cls()
    if not inst.id or inst.id in REGISTRY:
        raise ValueError(f"check id {inst.id!r} is empty or taken")
    REGISTRY[inst.id] = inst
    return cls


def stable_ids() -> frozenset[str]:
    """The checks whose attempts the drift audit compares one by one."""
    return frozenset(i for i, c in REGISTRY.items() if c.stable)


def ids() -> tuple[str, ...]:
    """The registered check ids, in registration order (for --check choices and help)."""
    return tuple(REGISTRY)


def selected(wanted: Sequence[str]) -> tuple[BaseCheck, ...]:
    if not wanted:
        return tuple(REGISTRY.values())
    unknown = [i for i in wanted if i not in REGISTRY]
    if unknown:
        raise UsageError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
    return tuple(REGISTRY[i] for i in wanted)
