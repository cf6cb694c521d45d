"""Upstream timeouts at their value: ``limits.timeout_s`` is how long the perimeter waits for
vLLM's answer. On every allowed route with one, a request the witness holds for longer than
the timeout must come back as the perimeter's 504 ``upstream-timeout`` once the timeout has
passed: an answer from the upstream means the timeout is above the plan (or gone), a 504
well before it means it is below (the route refuses what the plan admits).

Only a witness upstream can hold a request (``vp_hold``, at most 30 s): a timeout longer than
that cannot be outlasted within a run and is reported as such, never as proved."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.plan.model import Decision
from scanner.probe.cases import Case
from scanner.probe.checks.upstream import in_forms
from scanner.probe.coverage import Subject, na
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Finding
from scanner.probe.registry import BaseCheck, CheckContext, Results, register
from scanner.witness_asgi import MAX_HOLD_MS

# How much longer than the timeout the witness holds the request, and how late the perimeter's
# 504 may come (a proxy's timer and the event loop's scheduling); how early it may come.
SLACK_S = 2.5
EARLY_S = 0.5
NO_WITNESS = "outlasting the timeout needs a witness upstream that holds the request (verify, or --witness)"
REASON = "upstream-timeout"


def provable(timeout_s: float) -> bool:
    """Can the witness hold a request past ``timeout_s`` with the slack to spare?"""
    return (timeout_s + SLACK_S) * 1000 <= MAX_HOLD_MS


def timed(ctx: CheckContext) -> list[Decision]:
    return [d for d in ctx.plan.allowed if d.kind == "http" and d.limits.timeout_s]


@register
class Timeouts(BaseCheck):
    """One request per route with a timeout, held by the witness past it: the perimeter's 504
    ``upstream-timeout`` must answer after the timeout, not before, and nothing from vLLM."""

    id: ClassVar[str] = "timeout"
    title: ClassVar[str] = "upstream timeouts"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for d in timed(ctx):
            key, t = f"timeout {d.method} {d.path}", d.limits.timeout_s or 0.0
            if not ctx.witness:
                yield na(key, NO_WITNESS, d.method, d.path)
            elif not provable(t):
                yield na(key, f"timeout_s {t:g} cannot be outlasted within a run (the witness holds a "
                              f"request {MAX_HOLD_MS // 1000} s at most)", d.method, d.path)
            else:
                why = "" if ctx.allowed_cell(d) else "no credential and vantage the plan admits here"
                if d.state_changing and not ctx.options.allow_state_changes:
                    why = "state-changing: not sent (--allow-state-changes against a staging upstream)"
                yield Subject(key, d.method, d.path, why=why)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        if not ctx.witness:
            return
        for d in timed(ctx):
            t, cell = d.limits.timeout_s or 0.0, ctx.allowed_cell(d)
            if cell is None or not provable(t) or (d.state_changing and not ctx.options.allow_state_changes):
                continue
            base = ctx.case(self.id, d.method, d.path, cell[0], cell[1], "limit",
                            subject=f"timeout {d.method} {d.path}",
                            note=f"held {t + SLACK_S:g}s upstream > timeout_s {t:g}")
            held = replace(base, expected="deny", reasons=(REASON,), hold_ms=math.ceil((t + SLACK_S) * 1000))
            yield from in_forms(d, held)   # each way a body is forwarded has its own timeout

    def review(self, ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
        d = ctx.decision(case.method, case.path)
        t = d.limits.timeout_s if d is not None else None
        if t is None or a.status is None:
            return a
        took = a.latency_ms / 1000
        if a.status == 504 and a.reason == REASON:
            if took < t - EARLY_S:
                return replace(a, verdict="failed", why=(
                    f"timed out after {took:.1f}s, before timeout_s {t:g}: the perimeter's timeout is "
                    "below the plan"))
            if took > t + SLACK_S:
                return replace(a, verdict="failed", why=(
                    f"timed out only after {took:.1f}s: the perimeter's timeout is above timeout_s {t:g}"))
            return replace(a, verdict="proved", why=f"504 {REASON} after {took:.1f}s (timeout_s {t:g})")
        if a.layer == "upstream":   # the witness let it go past the timeout: vLLM's answer came back
            return replace(a, verdict="failed", why=(
                f"vLLM's answer came back after {took:.1f}s although it was held past timeout_s {t:g}: "
                "the perimeter's timeout is above the plan"))
        return a

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        failed = [("VP006" if "below" in a.why else "VP005", a) for _c, a in results if a.verdict == "failed"]
        for (rule, _m, _p, _v), attempts in group(failed).items():
            title = "timeout below the plan" if rule == "VP006" else "timeout above the plan"
            yield make(rule, attempts, "; ".join(sorted({a.why for a in attempts})), title=title,
                       extra=self.id)
