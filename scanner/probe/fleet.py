"""A fleet's proof: the cases of the checks that prove limits (rate, concurrency, token budget)
spread over every replica, so each limit must hold for the sum of what they admit (issue 21).

A burst (``Case.burst``) and a held group (``Case.hold_group``) alternate between the replicas in
their order: two replicas that each keep their own count admit about twice the limit, and the
check's judge, which expects the plan's limit, catches it. Every other case of those checks
alternates too; the other checks' cases go through the first replica (the target)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from scanner.probe.cases import Case

SPREAD: tuple[str, ...] = ("rate", "concurrency", "token-budget")


def spread(cases: Sequence[Case], replicas: int) -> list[Case]:
    """``cases`` with the limits' cases assigned round robin to ``replicas`` (per burst, per held
    group, per check for the rest); unchanged with fewer than 2."""
    if replicas < 2:
        return list(cases)
    counters: dict[tuple[str, str], int] = {}
    out = []
    for c in cases:
        if c.check not in SPREAD or c.grpc_port:
            out.append(c)
            continue
        group = (c.check, c.burst or c.hold_group or "")
        n = counters.get(group, 0)
        counters[group] = n + 1
        out.append(replace(c, replica=n % replicas))
    return out
