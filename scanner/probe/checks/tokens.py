"""Token budgets (``limits.tokens_per_minute``): per token zone (:attr:`Decision.token_zone`),
requests of a known cost (:meth:`Decision.token_cost`, the plan's one statement of what a request
is charged: its admitted envelope's tokens) from one principal until the budget must be spent: at
most ``budget // cost + 3`` of them, the cost chosen so that three fit (or the route's
max_request_tokens). The requests take turns over every multiplier of every route in the zone
(``n``, ``best_of``, prompt lists, batches of conversations, input lists, pairs), each asking for
several sequences: a proxy that charges one of them less lets more through than the budget.
The first ones must reach the upstream, then the budget must refuse (429 ``token-budget`` with
``Retry-After``), having let through no more tokens than the plan's budget plus what it refills
while they are sent (:func:`budget_capacity`); another principal's requests (another address's
on ``auth: none``), as many as fit a budget, must all reach it (a budget of its own).

The requests are ordinary cases of the route's lane (phase 0: paced under its rate limit, so the
``rate`` check's burst is not spent here and these never meet the rate limiter), sent before the
lane's other cases (``Case.first``): the other checks' requests spend the same budget. A zone the
probe cannot exercise is "not proven" with why, never passed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import ClassVar

from scanner import reasons as R
from scanner.plan.model import Decision
from scanner.probe import coverage as cov
from scanner.probe.cases import Case
from scanner.probe.checks.limits import carrier, multipliers, tokens_body
from scanner.probe.checks.load import (
    OTHER_PRINCIPAL,
    Assessment,
    Zone,
    answered_at,
    by_subject,
    other_cell,
    representative,
)
from scanner.probe.coverage import Subject
from scanner.probe.findings import make
from scanner.probe.interface import Attempt, Coverage, Credential, Finding, Vantage
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

FIT = 3              # requests of one cost that fit a budget
EXTRA = 3            # sent beyond what fits
MAX_REQUESTS = 40    # a zone needing more (a budget far over what one body can cost) is not proven


def budget_capacity(limit: int, window: float) -> float:
    """The most tokens a budget of ``limit`` per minute lets through within ``window`` seconds from
    a full budget, on either generated proxy: Envoy's bucket (max_tokens = limit, refilled with
    limit per 60 s, continuously) and njs's sliding minute (the previous minute's count weighted
    by what is left of it: it frees at most limit / 60 a second); plus one token of rounding."""
    return limit * (1 + window / 60) + 1


def body_of_cost(d: Decision, cost: int, base: dict[str, object], max_bytes: int) -> bytes | None:
    """A JSON body ``d`` charges exactly ``cost`` (Decision.token_cost: its envelope's tokens),
    asking for as many sequences as its first multiplier and caps let; None when none fits."""
    return tokens_body(d, cost, base, max_bytes)


def plan_zone(d: Decision, max_bytes: int,
              kinds: int = FIT) -> tuple[int, int, bytes] | tuple[None, str, None]:
    """(cost, how many fit, body) for ``d``'s budget, or (None, why not, None). The cost lets
    ``kinds`` requests (at least three: one per multiplier of the zone) fit the budget, or is the
    route's max_request_tokens when that is less (a body over it is refused before it is charged)."""
    limit = d.limits.tokens_per_minute or 0
    cost = max(1, min(limit // max(FIT, kinds), d.limits.max_request_tokens or limit))
    fit = limit // cost
    if fit + EXTRA > MAX_REQUESTS:
        return None, (f"a budget of {limit} tokens needs {fit + EXTRA} requests of the largest cost a body "
                      f"may have here ({cost}; more than {MAX_REQUESTS})"), None
    body = body_of_cost(d, cost, {}, max_bytes)
    if body is None:
        return None, f"no body of cost {cost} fits body_bytes here", None
    return cost, fit, body


def kinds(ctx: CheckContext, ds: Sequence[Decision], cell: tuple[Credential, Vantage] | None) -> int:
    """How many multipliers (by name) the routes of a zone have for ``cell``'s principal."""
    return len({name for d in ds if cell is not None and carrier(ctx, d) == ("", {})
                and cell in ctx.allowed_cells(d) for name, _ in multipliers(d)})


def shapes(ctx: CheckContext, ds: Sequence[Decision], cost: int, cell: tuple[Credential, Vantage],
           max_bytes: Callable[[Decision], int]) -> list[tuple[Decision, str, bytes]]:
    """Bodies of exactly ``cost`` through every multiplier of every route in a zone (n, best_of,
    prompt lists, batches, input lists, pairs: scanner/plan/envelope.py), each asking for more than
    one sequence: (route, multiplier, body). A proxy that ignores one charges those less."""
    out, named = [], set()
    for d in sorted(ds, key=lambda d: (d.path, d.method)):
        if carrier(ctx, d) != ("", {}) or cell not in ctx.allowed_cells(d):
            continue    # another principal's cell would be another budget
        for shape in multipliers(d):
            body = None if shape[0] in named else tokens_body(d, cost, {}, max_bytes(d), shape)
            if body is not None and d.envelope(body).sequences > 1:
                out.append((d, shape[0], body))
                named.add(shape[0])     # each multiplier once, on the first route that has it
    return out


@register
class TokenBudget(BaseCheck):
    """Per token zone: one principal's requests of a known cost until its budget must refuse
    (429 token-budget with Retry-After); another principal unaffected."""

    id: ClassVar[str] = "token-budget"
    title: ClassVar[str] = "token budgets"

    def layout(self, ctx: CheckContext) -> list[Zone]:
        by: dict[str, list[Decision]] = {}
        for d in ctx.plan.allowed:
            if d.token_zone:
                by.setdefault(d.token_zone, []).append(d)
        out = []
        for name, ds in sorted(by.items()):
            rep = representative(ctx, [d for d in ds if carrier(ctx, d) == ("", {})]) \
                or representative(ctx, ds)
            cells = ctx.allowed_cells(rep) if rep else []
            out.append(Zone(self.id, name, tuple(ds), rep, cells[0] if cells else None))
        return out

    def _max_bytes(self, ctx: CheckContext, d: Decision) -> int:
        return min(d.limits.body_bytes or 1 << 30, ctx.options.max_body_bytes)

    def _other(self, ctx: CheckContext, z: Zone) -> tuple[str, tuple[Credential, Vantage] | None, str]:
        """(subject, the cell of another principal than the zone's, or of another address on ``auth:
        none``, why there is none)."""
        if z.rep is None or z.cell is None:
            return f"{z.key} {OTHER_PRINCIPAL}", None, "the zone is not exercised"
        suffix, cell, why = other_cell(ctx, z.rep, z.cell)
        return f"{z.key} {suffix}", cell, why

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for z in self.layout(ctx):
            s = z.subject()
            if z.rep is not None and not s.why:
                if carrier(ctx, z.rep) != ("", {}):
                    s = replace(s, why="every route in it changes state (--allow-state-changes against a "
                                       "staging upstream)")
                else:
                    cost, why, _ = plan_zone(z.rep, self._max_bytes(ctx, z.rep),
                                             kinds(ctx, z.decisions, z.cell))
                    if cost is None:
                        s = replace(s, why=str(why))
            yield s
            if s.why:
                continue
            other, cell, why = self._other(ctx, z)
            yield Subject(other, s.method, s.path, why="" if cell else why)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for z in self.layout(ctx):
            d, cell = z.rep, z.cell
            if d is None or cell is None or carrier(ctx, d) != ("", {}):
                continue
            cost, fit, body = plan_zone(d, self._max_bytes(ctx, d), kinds(ctx, z.decisions, cell))
            if cost is None or body is None or not isinstance(fit, int):
                continue
            limit = d.limits.tokens_per_minute
            n = fit + EXTRA
            # the same cost through each multiplier of the zone's routes in turn (same principal)
            sent = shapes(ctx, z.decisions, cost, cell, lambda x: self._max_bytes(ctx, x)) or [(d, "", body)]
            for i in range(n):
                route, shape, b = sent[i % len(sent)]
                seq = route.envelope(b).sequences
                yield self._case(ctx, route, cell, z.key, b,
                                 f"cost {cost} {i + 1}/{n} ({fit} fit {limit} tokens per minute)"
                                 + (f"; {shape}: {seq} sequences" if shape else ""))
            other, cell2, _why = self._other(ctx, z)
            if cell2 is not None:
                for i in range(fit):
                    yield self._case(ctx, d, cell2, other, body,
                                     f"another {'principal' if d.auth == 'key' else 'address'} ("
                                     f"{cell2[0].label} from {cell2[1].name}), cost {cost} {i + 1}/{fit}")

    def _case(self, ctx: CheckContext, d: Decision, cell: tuple[Credential, Vantage], subject: str,
              body: bytes, note: str) -> Case:
        base = ctx.case(self.id, d.method, d.path, cell[0], cell[1], "limit", subject=subject, note=note)
        return replace(base, body=body, json_body=True, expected="allow", reasons=("token-budget",),
                       headers=(*((k, v) for k, v in base.headers if k.lower() != "content-type"),
                                ("Content-Type", "application/json")), phase=0, first=True)

    # --- judging ----------------------------------------------------------------------------

    def assessed(self, ctx: CheckContext, results: Results) -> dict[str, tuple[Assessment, list[Attempt]]]:
        by = by_subject(results)
        out: dict[str, tuple[Assessment, list[Attempt]]] = {}
        for z in self.layout(ctx):
            other = self._other(ctx, z)[0]
            mine, theirs = by.get(z.key, []), by.get(other, [])
            if z.rep is None or not mine:
                continue
            cost, fit, _ = plan_zone(z.rep, self._max_bytes(ctx, z.rep), kinds(ctx, z.decisions, z.cell))
            limit = z.rep.limits.tokens_per_minute
            if cost is None or not isinstance(fit, int) or limit is None:
                continue
            out[z.key] = (self._assess(mine, fit, cost, limit), mine)
            if theirs:
                out[other] = (self._assess_other(mine, theirs, fit), theirs)
        return out

    @staticmethod
    def _assess(attempts: Sequence[Attempt], fit: int, cost: int, limit: int) -> Assessment:
        n = len(attempts)
        reached = [a for a in attempts if a.verdict == "proved" and a.outcome == "reached"]
        refused = [a for a in attempts if R.proves("token-budget", a.status, a.reason)]
        bad = next((a for a in attempts if a.verdict == "failed"), None)
        if bad is not None:
            return "failed", bad.why, n
        took = (max(answered_at(a) for a in reached) - min(a.sent_at for a in attempts)) if reached else 0.0
        most = budget_capacity(limit, took)
        if len(reached) * cost > most:
            return "failed", (f"{len(reached)} of {n} requests of cost {cost} reached the upstream within "
                              f"{took:.1f}s ({len(reached) * cost} tokens) where a budget of {limit} per "
                              f"minute lets through at most {most:.0f}: the token budget is above the plan, "
                              "or not enforced"), n
        if not refused:
            other = next((a for a in attempts if a.verdict != "proved"), None)
            return "not-proven", (other.why if other else "no request was refused for token-budget"), n
        timed = [a for a in refused if "Retry-After " in a.note]
        if len(timed) < len(refused):
            return "failed", "a token-budget refusal without Retry-After", n
        if not reached:
            return "not-proven", ("every request was refused for token-budget: the budget was spent before "
                                  "(other checks, or an earlier run within the minute)"), n
        return "proved", (f"{len(reached)} reached the upstream ({fit} fit), then {len(refused)} refused "
                          f"for token-budget with Retry-After"), n

    @staticmethod
    def _assess_other(mine: Sequence[Attempt], theirs: Sequence[Attempt], fit: int) -> Assessment:
        n = len(theirs)
        passed = sum(a.verdict == "proved" and a.outcome == "reached" for a in theirs)
        ours = sum(a.verdict == "proved" and a.outcome == "reached" for a in mine)
        if passed == n and ours:
            return "proved", (f"all {n} reached while the first principal's budget was spent: a "
                              "budget of its own"), n
        if any(R.proves("token-budget", a.status, a.reason) for a in theirs) and passed + ours <= fit:
            return "failed", (f"refused for token-budget after {passed} of its own and {ours} of the first "
                              f"principal's requests ({fit} fit one budget): one budget is shared"), n
        other = next((a for a in theirs if a.verdict != "proved" or a.outcome != "reached"), None)
        return "not-proven", (other.why if other else "the first principal's requests did not reach"), n

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        for (status, why, _n), attempts in self.assessed(ctx, results).values():
            if status == "failed":
                yield make("VP005", attempts, why, title="token budget not enforced", extra=self.id)

    def cover(self, ctx: CheckContext, subjects: Sequence[Subject], results: Results,
              interrupted: bool = False) -> Iterable[Coverage]:
        yield from cov.assessed(self.id, subjects, self.assessed(ctx, results), interrupted)
