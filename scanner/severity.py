"""The severity vocabulary every finding uses (probe, netscan, audit), and the one rule that
turns findings into an exit code."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Literal

Severity = Literal["critical", "high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = ("critical", "high", "medium", "low", "info")


def severity_rank(s: str) -> int:
    """0 for critical .. 4 for info; unknown strings rank below info."""
    return SEVERITIES.index(s) if s in SEVERITIES else len(SEVERITIES)


# The default --fail-on: every deviation from the plan fails the run, whatever its severity.
FAIL_ON_DEFAULT: Severity = "info"
# "Not proven" is not a deviation: it fails the run only with --require-proof.
NOT_PROVEN_RULE = "VP011"


def fails(findings: Iterable[tuple[str, str]], fail_on: str = FAIL_ON_DEFAULT,
          require_proof: bool = False) -> bool:
    """The exit-code rule over (rule, severity) pairs: a deviation at or above ``fail_on`` fails;
    a subject not proven (VP011) fails only with ``require_proof``."""
    items = list(findings)
    if require_proof and any(rule == NOT_PROVEN_RULE for rule, _s in items):
        return True
    return at_or_above((s for rule, s in items if rule != NOT_PROVEN_RULE), fail_on)


def at_or_above(severities: Iterable[str], fail_on: str) -> bool:
    """Does any severity reach ``fail_on`` (``"none"``: never)?"""
    if fail_on == "none":
        return False
    return min((severity_rank(s) for s in severities), default=len(SEVERITIES)) <= severity_rank(fail_on)


def finding_id(rule: str, *parts: str) -> str:
    """A stable id: the rule and a short hash of what the finding is about."""
    return f"{rule}-" + hashlib.sha256(" ".join((rule, *parts)).encode()).hexdigest()[:10]
