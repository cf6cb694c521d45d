"""The mutation score: a mutant cut short by Ctrl-C or SIGTERM is neither caught nor survived,
and operators that do not apply are not counted."""

from __future__ import annotations

from scanner.report import mutation
from scanner.verify.mutation import MutantRun


def _m(op: str, status: str, family: str = "remove") -> MutantRun:
    return MutantRun("nginx", op, op, status, family=family)   # type: ignore[arg-type]


def test_interrupted_and_not_applicable_mutants_are_not_counted() -> None:
    runs = [_m("a", "caught"), _m("b", "survived"), _m("c", "interrupted"), _m("d", "not-applicable"),
            _m("e", "caught", "raise")]
    assert mutation.score(runs, "nginx") == (2, 3)
    assert mutation.score(runs, "nginx", "remove") == (1, 2)
    assert mutation.family_scores(runs, "nginx") == {"remove": (1, 2), "raise": (1, 1)}


def test_an_interrupted_mutant_is_no_catch_of_any_rule() -> None:
    m = MutantRun("nginx", "x", "x", "interrupted", rules=("VP001",), checks=("matrix",), catches=("matrix",))
    assert not m.expected
