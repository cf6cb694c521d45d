"""Drift between a baseline and what is live: routes, probe results, open ports."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scanner.inventory.model import Inventory
from scanner.probe import registry
from scanner.probe import runner as _runner  # noqa: F401  (registers the built-in checks)
from scanner.probe.interface import Attempt, Finding, ProbeResult

RouteChangeKind = Literal["added", "removed"]
# FastAPI keeps these out of /openapi.json; their absence from a spec is not a vanished route.
NOT_IN_SPEC = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
# Attempts whose outcome is timing-dependent are not compared: checks that meet limiters (the
# registry's stable flag says which are not), and any answer the proxy throttled (a burst, not a
# policy change).
TIMING_OUTCOMES = frozenset({"limited"})


@dataclass(frozen=True)
class RouteDrift:
    path: str
    change: RouteChangeKind
    methods: tuple[str, ...]
    source: str              # "openapi" or "sweep": how it was seen (or not seen)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "methods": list(self.methods),
                "source": self.source}


@dataclass(frozen=True)
class OutcomeChange:
    check: str
    request_line: str
    credential: str
    vantage: str
    old: str                 # "outcome status" of the baseline attempt
    new: str

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "request_line": self.request_line, "credential": self.credential,
                "vantage": self.vantage, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class ProbeDrift:
    new_findings: tuple[Finding, ...]
    resolved_findings: tuple[Finding, ...]
    outcome_changes: tuple[OutcomeChange, ...]

    @property
    def empty(self) -> bool:
        return not (self.new_findings or self.resolved_findings or self.outcome_changes)

    def to_dict(self) -> dict[str, Any]:
        return {"new_findings": [f.to_dict() for f in self.new_findings],
                "resolved_findings": [f.to_dict() for f in self.resolved_findings],
                "outcome_changes": [c.to_dict() for c in self.outcome_changes]}


@dataclass(frozen=True)
class LiveSurface:
    """Routes seen live: the spec's paths (None when no spec was served) and swept paths."""

    spec_paths: Mapping[str, tuple[str, ...]] | None
    swept: Mapping[str, tuple[str, ...]]
    note: str = ""
    error: str = ""          # the sweep could not run (upstream unreachable): no route verdict


def _template(path: str) -> re.Pattern[str] | None:
    """``/v1/responses/{response_id}`` -> a regex matching concrete paths it serves."""
    if "{" not in path:
        return None
    parts = re.split(r"\{[^}]*\}", path)
    return re.compile("[^/]+".join(re.escape(p) for p in parts) + r"\Z")


def route_drift(baseline: Inventory, live: LiveSurface) -> tuple[RouteDrift, ...]:
    """Routes live but not in the baseline (a swept path a baseline template serves is not
    new: ``/v1/responses/render`` answers 405 from ``/v1/responses/{response_id}``), and, when a
    spec was served, baseline routes a spec would list that it does not."""
    known = {r.path for r in baseline.routes}
    templates = [t for t in (_template(p) for p in known) if t is not None]
    out: dict[str, RouteDrift] = {}
    for source, paths in (("openapi", live.spec_paths or {}), ("sweep", live.swept)):
        for path, methods in sorted(paths.items()):
            covered = source == "sweep" and any(t.match(path) for t in templates)
            if path not in known and path not in out and not covered:
                out[path] = RouteDrift(path, "added", tuple(methods), source)
    if live.spec_paths is not None:
        for r in baseline.routes:
            if (r.kind == "http" and r.path not in NOT_IN_SPEC and r.path not in live.spec_paths
                    and r.path not in out):
                out[r.path] = RouteDrift(r.path, "removed", r.methods, "openapi")
    return tuple(sorted(out.values(), key=lambda d: (d.change, d.path)))


def _key(a: Attempt) -> tuple[str, str, str, str, str]:
    return (a.check, a.request_line, a.credential, a.vantage, a.note)


def _state(a: Attempt) -> str:
    return f"{a.outcome} {a.status if a.status is not None else '-'}"


def outcome_changes(old: Iterable[Attempt], new: Iterable[Attempt]) -> tuple[OutcomeChange, ...]:
    stable = registry.stable_ids()
    before = {_key(a): a for a in old if a.check in stable}
    out = []
    for a in new:
        b = before.get(_key(a))
        if b is not None and b.outcome != a.outcome and not {a.outcome, b.outcome} & TIMING_OUTCOMES:
            out.append(OutcomeChange(a.check, a.request_line, a.credential, a.vantage, _state(b), _state(a)))
    return tuple(sorted(out, key=lambda c: (c.request_line, c.credential, c.vantage)))


def probe_drift(old: ProbeResult | None, new: ProbeResult) -> ProbeDrift:
    if old is None:
        return ProbeDrift(new.findings, (), ())
    # only what both runs checked compares (an audit may run fewer checks than the baseline)
    both = old.checks() & new.checks()

    def ours(f: Finding) -> bool:
        return not f.check or f.check in both

    old_ids = {f.id for f in old.findings}
    new_ids = {f.id for f in new.findings}
    return ProbeDrift(new_findings=tuple(f for f in new.findings if f.id not in old_ids and ours(f)),
                      resolved_findings=tuple(f for f in old.findings if f.id not in new_ids and ours(f)),
                      outcome_changes=outcome_changes(old.attempts, new.attempts))


def new_ports(old: tuple[int, ...] | None, now: tuple[int, ...]) -> tuple[int, ...]:
    """Open now, closed in the baseline scan; nothing is "new" without a baseline scan (the
    netscan findings still judge every open port against the policy)."""
    if old is None:
        return ()
    return tuple(p for p in now if p not in old)
