"""Coverage: what each check established about each subject (a plan decision or limit), and
the "not proven" finding (VP011) for every subject a check applies to but could not prove."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scanner.probe import findings
from scanner.probe.interface import Attempt, Coverage, CoverageStatus, Finding

if TYPE_CHECKING:
    from scanner.probe.cases import Case


@dataclass(frozen=True)
class Subject:
    """Something a check applies to: ``key`` names it in coverage and on its cases."""

    key: str
    method: str = ""
    path: str = ""
    applies: bool = True
    why: str = ""                  # not applicable: why; applies but no case possible: why


def na(key: str, why: str, method: str = "", path: str = "") -> Subject:
    return Subject(key, method, path, applies=False, why=why)


def generic(check: str, subjects: Sequence[Subject], results: Sequence[tuple[Case, Attempt]],
            interrupted: bool = False) -> list[Coverage]:
    """Per subject: failed if any case failed; not proven if any stayed inconclusive or was
    skipped, or if none was sent; else proved. Not-applicable subjects say why."""
    by_subject: dict[str, list[Attempt]] = {}
    for _c, a in results:
        by_subject.setdefault(a.subject, []).append(a)
    out = []
    for s in subjects:
        if not s.applies:
            out.append(Coverage(check, s.key, "not-applicable", s.why, 0, s.method, s.path))
            continue
        out.append(of_attempts(check, s, by_subject.get(s.key, []), interrupted))
    return out


def of_attempts(check: str, s: Subject, attempts: Sequence[Attempt], interrupted: bool = False) -> Coverage:
    if not attempts:
        why = s.why or ("not sent: the run was cut short" if interrupted else "no case could be generated")
        return Coverage(check, s.key, "not-proven", why, 0, s.method, s.path)
    return status_of(check, s, *judged(attempts))


def judged(attempts: Sequence[Attempt]) -> tuple[CoverageStatus, str, int]:
    """Failed if any attempt failed; not proven if any stayed inconclusive or was skipped."""
    n = len(attempts)
    for status, verdicts in (("failed", ("failed",)), ("not-proven", ("inconclusive", "skipped"))):
        hit = next((a for a in attempts if a.verdict in verdicts), None)
        if hit is not None:
            return status, hit.why, n  # type: ignore[return-value]
    return "proved", f"{n} attempt{'s' if n != 1 else ''}", n


def status_of(check: str, s: Subject, status: CoverageStatus, why: str, n: int) -> Coverage:
    return Coverage(check, s.key, status, why, n, s.method, s.path)


def assessed(check: str, subjects: Sequence[Subject],
             done: Mapping[str, tuple[tuple[CoverageStatus, str, int], object]],
             interrupted: bool = False) -> Iterator[Coverage]:
    """Per subject: the check's own assessment (``done``: subject key -> ((status, why, n), ...))
    where it made one, else the generic verdict (not applicable, or not proven: nothing sent)."""
    for s in subjects:
        if s.key in done and s.applies:
            yield status_of(check, s, *done[s.key][0])
        else:
            yield from generic(check, [s], [], interrupted)


def not_proven_findings(check: str, subjects: Sequence[Subject], covered: Iterable[Coverage],
                        results: Sequence[tuple[Case, Attempt]]) -> Iterable[Finding]:
    """One VP011 finding per cause: the subjects the check applies to but could not prove, for
    the same reason (each subject is in the coverage)."""
    evidence: dict[str, list[Attempt]] = {}
    for _c, a in results:
        if a.verdict in ("inconclusive", "skipped"):
            evidence.setdefault(a.subject, []).append(a)
    by_why: dict[str, list[Coverage]] = {}
    for c in covered:
        if c.status == "not-proven":
            by_why.setdefault(c.why, []).append(c)
    for why, group in by_why.items():
        methods = {c.method for c in group}
        paths = {c.path for c in group}
        attempts = [a for c in group for a in evidence.get(c.subject, [])]
        method = methods.pop() if len(methods) == 1 else "*"
        path = paths.pop() if len(paths) == 1 else "*"
        yield findings.not_proven(check, [c.subject for c in group], method, path, why, attempts)
