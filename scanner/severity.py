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


def at_or_above(severities: Iterable[str], fail_on: str) -> bool:
    """Does any severity reach ``fail_on`` (``"none"``: never)?"""
    if fail_on == "none":
        return False
    return min((severity_rank(s) for s in severities), default=len(SEVERITIES)) <= severity_rank(fail_on)


def finding_id(rule: str, *parts: str) -> str:
    """A stable id: the rule and a short hash of what the finding is about."""
    return f"{rule}-" + hashlib.sha256(" ".join((rule, *parts)).encode()).hexdigest()[:10]
