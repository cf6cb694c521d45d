"""Token budgets (``limits.tokens_per_minute``) and their settlement from usage: per token zone
(:attr:`Decision.token_zone`), one principal sends requests of a known cost
(:func:`scanner.plan.body.token_cost`, the plan's one statement of what a request is charged at
admission: its admitted envelope's tokens), one at a time (``Case.first``: each answer is
complete, so settled, before the next is admitted):

1. ``settled``: ``fit`` requests (``budget // cost``, the cost chosen so that three fit, or the
   route's max_request_tokens, or the most a body under body_bytes is charged: :func:`reachable`;
   more than :data:`MAX_REQUESTS` in all: not proven, saying so) whose answers' bodies the
   prober reads, on the zone's generation routes when it has any (their model takes
   ``stream_options``). vLLM, and the stand-in, report ``usage`` in every JSON answer (the
   stand-in: ``max(1, bytes // 4)`` prompt tokens and ``min(budget, 10)`` completion tokens per
   choice): far less than the charge. The proxy must
   return the charge less that usage (scanner/plan/settle.py :func:`refund`) before the answer
   ends. Bodies that run sequences vLLM does not report (``best_of`` above ``n``) are not used.
   The last one is a stream that does not ask for its usage (``"stream": true``): the proxy asks
   for it, and the usage-only event must not reach the client (VP005 if it does); its usage is
   then invisible to the prober, which counts it 0 where it bounds the tokens let through from
   below and its whole cost where it bounds the room left.
2. ``kept``: ``fit + 3`` requests that keep their charge: with the stand-in's witness, it answers
   them 400 itself (``vp_answer``, an error answer reports no usage); against a real deployment
   (no witness) they are ordinary requests whose answers' usage is read too. They take turns over
   every multiplier of every route in the zone (``n``, ``best_of``, prompt lists, batches of
   conversations, input lists, pairs), each asking for several sequences: a proxy that charges one
   of them less lets more through than the budget.

Another principal's requests (another address's on ``auth: none``), as many as fit a budget, must
all reach the upstream (a budget of its own): its first before the first principal's requests, the
rest after them, in the first principal's lane (:meth:`TokenBudget._assess_other` tells a budget
spent before the run from a shared one). The requests are ordinary cases of the route's lane
(phase 0, paced under its rate limit: they never meet the rate limiter), sent before the lane's
other cases, whose requests spend the same budget.

A zone without a generation route (none whose model takes ``stream_options``: e.g. ``/tokenize``
alone) has no settlement to prove (its answers are not known to report usage): "not applicable".

What is judged, per zone (``token-budget <zone>``): the tokens let through, each reached request
counted at its settled charge (its cost less the refund its answer's usage gives, the whole cost
when the answer reported none), are at most the budget plus what it refills while they are sent
(:func:`budget_capacity`), else VP005 (an answer without usage refunded counts at its whole cost);
then the budget refuses (429 ``token-budget`` with ``Retry-After``). The budget is its bucket
(Decision.token_capacity C, refilled with tokens_per_minute N a minute): at most C + N x t / 60 in
t seconds. The settlement
(``token-budget <zone> settled``): more requests of the cost reached than the budget lets through
unsettled within that time: proved; the first request sent after the settled answers refused
although the usage they reported left room for it on a budget spent by these requests only, or the
usage-only event of the settled stream shown to the client: VP005 "token budget not settled" (the
refunds were not made, or not before the answers ended).

How it can fail wrongly or stay unproven: a budget already spent by the same principal within the
minute (an earlier probe) leaves less room than the check counts on. Spent whole, the run's first
request on it is refused and goes again once the bucket refilled whole (scanner/probe/runner.py,
when the time limit allows); spent in part (partly refilled), the other principal stays "not
proven" and so does the settlement when a settled request meets the bucket (the zone itself is
still bounded by it). The settlement is judged as if the bucket were full at the start: one partly
refilled that still let every settled request through, or spent by other means after them, can
make the first ``kept`` request refused and look unsettled (neither seen with two probes back to
back on NGINX 1.31 and Envoy 1.40: their settled requests met the bucket, not proven). An upstream
that reports no usage (an old stand-in, a server not OpenAI-shaped) leaves the settlement "not proven", never
failed; so does a JSON answer longer than the 64 KiB the prober reads. A zone the probe cannot
exercise is "not proven" with why, never passed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import ClassVar

from scanner import reasons as R
from scanner.plan import body as plan_body
from scanner.plan import settle
from scanner.plan.model import Decision
from scanner.probe import coverage as cov
from scanner.probe.cases import Case
from scanner.probe.checks.limits import carrier, multipliers, tokens_body
from scanner.probe.checks.load import (
    OTHER_PRINCIPAL,
    Assessment,
    ZoneTrial,
    answered_at,
    other_cell,
    representative,
)
from scanner.probe.coverage import Subject
from scanner.probe.findings import make
from scanner.probe.interface import Attempt, Coverage, Credential, Finding, Vantage
from scanner.probe.pace import lane_of
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

FIT = 3              # requests of one cost that fit a budget
EXTRA = 3            # sent beyond what fits
MAX_REQUESTS = 40    # a zone needing more (a budget far over what one body can cost) is not proven
SETTLED = "settled"  # the settled subject's suffix
SETTLED_NOTE = "settled by its answer's usage"     # in the note of a settled request
KEPT_NOTE = "kept"                                 # ... of a request that keeps its charge
STREAMED = "a stream not asking for its usage"     # the multiplier part of the settled stream's note
GAUGE_NOTE = "sent first: its own budget before the first principal spends"
KEPT_ANSWER = 400    # the witness's own answer to a kept request: an error, no usage
Sent = tuple[Case, Attempt]


def budget_capacity(capacity: int, limit: int, window: float) -> float:
    """The most tokens a budget of ``limit`` per minute with a bucket of ``capacity``
    (Decision.token_capacity) lets through within ``window`` seconds from a full bucket, on every
    enforcer (Envoy's local_ratelimit: max_tokens = capacity, refilled with limit per 60 s
    continuously; njs's bucket and the fleet's limiter the same): the full bucket plus its refill;
    plus one token of rounding."""
    return capacity + limit * window / 60 + 1


def body_of_cost(d: Decision, cost: int, base: dict[str, object], max_bytes: int) -> bytes | None:
    """A JSON body ``d`` charges exactly ``cost`` (scanner.plan.body.token_cost: its envelope's tokens),
    asking for as many sequences as its first multiplier and caps let, else through its next
    multipliers (one may ask for more sequences: a prompt list past ``n``'s cap); None when none fits."""
    for shape in (None, *multipliers(d)[1:]):
        body = tokens_body(d, cost, base, max_bytes, shape)
        if body is not None:
            return body
    return None


def reachable(d: Decision, cost: int, max_bytes: int) -> int:
    """The largest cost at most ``cost`` a JSON body of ``d`` under ``max_bytes`` reaches
    (sequences x output budget + body bytes, within its caps; body_of_cost); 0: none."""
    if body_of_cost(d, cost, {}, max_bytes) is not None:
        return cost
    low, high = 0, cost    # body_of_cost(low) exists (0: none known), body_of_cost(high) does not
    for _ in range(64):
        if high - low <= 1:
            break
        mid = (low + high) // 2
        if body_of_cost(d, mid, {}, max_bytes) is not None:
            low = mid
        else:
            high = mid
    return low


def plan_zone(d: Decision, max_bytes: int,
              kinds: int = FIT) -> tuple[int, int, bytes] | tuple[None, str, None]:
    """(cost, how many fit, body) for ``d``'s budget, or (None, why not, None). The cost lets
    ``kinds`` requests (at least three: one per multiplier of the zone) fit the budget's full
    bucket (Decision.token_capacity), or is the route's max_request_tokens when that is less (a
    body over it is refused before it is charged), or the largest cost a body under
    ``max_bytes`` (body_bytes) reaches when that is less."""
    capacity = d.token_capacity
    wanted = max(1, min(capacity // max(FIT, kinds), d.limits.max_request_tokens or capacity))
    cost = reachable(d, wanted, max_bytes)
    if cost <= 0:
        return None, f"no JSON body under body_bytes ({max_bytes}) is charged a cost here", None
    fit = capacity // cost
    if 2 * fit + EXTRA > MAX_REQUESTS:
        most = "" if cost == wanted else \
            f", the most a body under body_bytes ({max_bytes}) is charged: sequences x output budget + bytes"
        return None, (f"a bucket of {capacity} tokens needs {2 * fit + EXTRA} requests of the largest cost a "
                      f"body may have here ({cost}{most}; more than {MAX_REQUESTS})"), None
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
            if body is not None and plan_body.envelope(d, body).sequences > 1:
                out.append((d, shape[0], body))
                named.add(shape[0])     # each multiplier once, on the first route that has it
    return out


def _doc(raw: bytes | str | None) -> object:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def reported(body: bytes) -> bool:
    """Does vLLM's usage count every sequence this body runs (settle.unreported)?"""
    doc = _doc(body)
    return not settle.unreported(doc if isinstance(doc, dict) else None)


def answer_usage(a: Attempt) -> settle.Usage | None:
    """The usage the JSON answer the client received reports (None: none, or not read whole)."""
    return settle.usage_of(_doc(a.answer_body))


def hidden_shown(answer: str) -> bool:
    """Does a streamed answer hold the usage-only event (settle.hidden)?"""
    for line in answer.splitlines():
        if line.startswith("data:") and "usage" in line:
            doc = _doc(line[5:].strip())
            if settle.hidden(doc):
                return True
    return False


def settled_charge(cost: int, c: Case, a: Attempt, hidden: int) -> int:
    """What a request of ``cost`` weighs once its answer settled it: the cost less the refund the
    usage its answer reported gives (scanner/plan/settle.py); the whole cost without usage. A
    settled stream's usage never reaches the client (the proxy asked for it and drops it): it
    weighs ``hidden`` (0 where the tokens let through are bounded from below, the whole cost where
    the room left is)."""
    if STREAMED in c.note:
        return hidden
    doc = _doc(c.body)
    return cost - settle.refund(cost, answer_usage(a), doc if isinstance(doc, dict) else None)


def _reached(a: Attempt) -> bool:
    return a.verdict == "proved" and a.outcome == "reached"


def _refused(a: Attempt) -> bool:
    return R.proves("token-budget", a.status, a.reason)


@register
class TokenBudget(BaseCheck):
    """Per token zone: one principal's requests of a known cost, settled from their answers' usage,
    then kept, until its budget must refuse (429 token-budget with Retry-After); another principal
    unaffected."""

    id: ClassVar[str] = "token-budget"
    title: ClassVar[str] = "token budgets"

    def layout(self, ctx: CheckContext) -> list[ZoneTrial]:
        by: dict[str, list[Decision]] = {}
        for d in ctx.plan.allowed:
            if d.token_zone:
                by.setdefault(d.token_zone, []).append(d)
        out = []
        for name, ds in sorted(by.items()):
            rep = representative(ctx, [d for d in ds if carrier(ctx, d) == ("", {})]) \
                or representative(ctx, ds)
            cells = ctx.allowed_cells(rep) if rep else []
            out.append(ZoneTrial(self.id, name, tuple(ds), rep, cells[0] if cells else None))
        return out

    def _max_bytes(self, ctx: CheckContext, d: Decision) -> int:
        return min(d.limits.body_bytes or 1 << 30, ctx.options.max_body_bytes)

    def _other(self, ctx: CheckContext, z: ZoneTrial) -> tuple[str, tuple[Credential, Vantage] | None, str]:
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
            if s.why or any(d.envelope_spec.ask_usage for d in z.decisions):
                yield replace(s, key=f"{z.key} {SETTLED}")
            else:
                yield cov.na(f"{z.key} {SETTLED}", "no generation route in the zone (none takes "
                             "stream_options): its answers are not known to report usage", s.method, s.path)
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
            n = fit + EXTRA
            where = f"{fit} fit a bucket of {d.token_capacity}, {d.limits.tokens_per_minute} a minute"
            # the same cost through each multiplier of the zone's routes in turn (same principal)
            sent = shapes(ctx, z.decisions, cost, cell, lambda x: self._max_bytes(ctx, x)) or [(d, "", body)]
            # settled: bodies whose sequences vLLM's usage counts, on the generation routes (their
            # model takes stream_options) when the zone has any: their answers report usage
            counted = [x for x in sent if reported(x[2])] or [(d, "", body)]
            counted = [x for x in counted if x[0].envelope_spec.ask_usage] or counted
            streamed = self._stream(ctx, counted, cost)
            # another principal's requests in this principal's lane (scanner.probe.pace: one at a
            # time, in order): its first before any of this principal's (its own budget held a
            # request before this one spent), the rest once this one's budget is spent
            other, cell2, _why = self._other(ctx, z)
            theirs = [self._case(ctx, d, cell2, other, body,
                                 f"another {'principal' if d.auth == 'key' else 'address'} ("
                                 f"{cell2[0].label} from {cell2[1].name}), cost {cost} {i + 1}/{fit}"
                                 + (f" ({GAUGE_NOTE})" if i == 0 else ""))
                      for i in range(fit)] if cell2 is not None else []
            if theirs:
                lane_own = lane_of(ctx.plan, self._case(ctx, d, cell, z.key, body, ""),
                                   ctx.source_address(cell[1])).key
                theirs = [replace(c, lane=lane_own) for c in theirs]
                yield theirs[0]
            for i in range(fit):
                route, shape, b = streamed if streamed and i == fit - 1 else counted[i % len(counted)]
                seqs = f"; {shape}: {plan_body.envelope(route, b).sequences} sequences" if shape else ""
                c = self._case(ctx, route, cell, z.key, b,
                               f"cost {cost} {i + 1}/{fit} ({where}, {SETTLED_NOTE}){seqs}")
                yield replace(c, read_answer=True)
            for i in range(n):
                route, shape, b = sent[i % len(sent)]
                seqs = f"; {shape}: {plan_body.envelope(route, b).sequences} sequences" if shape else ""
                c = self._case(ctx, route, cell, z.key, b, f"cost {cost} {i + 1}/{n} ({where}, {KEPT_NOTE}"
                               + (": the upstream answers 400 itself" if ctx.witness else "") + ")" + seqs)
                yield replace(c, answer=KEPT_ANSWER) if ctx.witness else replace(c, read_answer=True)
            yield from theirs[1:]

    def _stream(self, ctx: CheckContext, counted: Sequence[tuple[Decision, str, bytes]],
                cost: int) -> tuple[Decision, str, bytes] | None:
        """The last settled request as a stream (``"stream": true``, no ``stream_options``) on a
        generation route whose rules let ``stream`` through as sent: the proxy asks for its usage,
        and the client must not see the usage-only event it did not ask for."""
        # a body holding its prompts (an item list: messages, prompt) first: one vLLM can run as sent
        for d, name, _b in sorted(counted, key=lambda x: not x[1].endswith(" list")):
            rules = d.fields
            free = all(rules.mode(f) == "allow" and f not in rules.pins for f in ("stream", "stream_options"))
            shape = next((m for m in multipliers(d) if m[0] == name), None)
            if d.envelope_spec.ask_usage and free:
                body = tokens_body(d, cost, {"stream": True}, self._max_bytes(ctx, d), shape)
                if body is not None:
                    return d, f"{name}, {STREAMED}" if name else STREAMED, body
        return None

    def _case(self, ctx: CheckContext, d: Decision, cell: tuple[Credential, Vantage], subject: str,
              body: bytes, note: str) -> Case:
        base = ctx.case(self.id, d.method, d.path, cell[0], cell[1], "limit", subject=subject, note=note)
        return replace(base, body=body, json_body=True, expected="allow", reasons=("token-budget",),
                       headers=(*((k, v) for k, v in base.headers if k.lower() != "content-type"),
                                ("Content-Type", "application/json")), phase=0, first=True)

    # --- judging ----------------------------------------------------------------------------

    def assessed(self, ctx: CheckContext, results: Results) -> dict[str, tuple[Assessment, list[Attempt]]]:
        by: dict[str, list[Sent]] = {}
        for c, a in results:
            by.setdefault(a.subject, []).append((c, a))
        out: dict[str, tuple[Assessment, list[Attempt]]] = {}
        for z in self.layout(ctx):
            other = self._other(ctx, z)[0]
            mine, theirs = by.get(z.key, []), [a for _c, a in by.get(other, [])]
            if z.rep is None or not mine:
                continue
            cost, fit, _ = plan_zone(z.rep, self._max_bytes(ctx, z.rep), kinds(ctx, z.decisions, z.cell))
            limit, capacity = z.rep.limits.tokens_per_minute, z.rep.token_capacity
            if cost is None or not isinstance(fit, int) or limit is None:
                continue
            attempts = [a for _c, a in mine]
            out[z.key] = (self._assess(mine, fit, cost, limit, capacity), attempts)
            if any(d.envelope_spec.ask_usage for d in z.decisions):
                out[f"{z.key} {SETTLED}"] = (self._assess_settled(mine, cost, limit, capacity), attempts)
            if theirs:
                out[other] = (self._assess_other(attempts, theirs, fit, cost, limit, capacity), theirs)
        return out

    @staticmethod
    def _assess(sent: Sequence[Sent], fit: int, cost: int, limit: int, capacity: int) -> Assessment:
        attempts = [a for _c, a in sent]
        n = len(attempts)
        reached = [(c, a) for c, a in sent if _reached(a)]
        refused = [a for a in attempts if _refused(a)]
        bad = next((a for a in attempts if a.verdict == "failed"), None)
        if bad is not None:
            return "failed", bad.why, n
        start = min(a.sent_at for a in attempts)
        took = (max(answered_at(a) for _c, a in reached) - start) if reached else 0.0
        most = budget_capacity(capacity, limit, took)
        spent = sum(settled_charge(cost, c, a, 0) for c, a in reached)
        if spent > most:
            return "failed", (f"{len(reached)} of {n} requests of cost {cost} reached the upstream within "
                              f"{took:.1f}s ({spent} tokens once settled by the usage their answers "
                              "reported) "
                              f"where a budget of {limit} per minute with a bucket of {capacity} lets "
                              f"through at most {most:.0f}: the "
                              "token budget is above the plan, not enforced, or refunds answers without "
                              "usage"), n
        if not refused:
            other = next((a for a in attempts if a.verdict != "proved"), None)
            return "not-proven", (other.why if other else
                                  f"no request was refused for token-budget ({spent} tokens once settled by "
                                  "the usage their answers reported)"), n
        timed = [a for a in refused if "Retry-After " in a.note]
        if len(timed) < len(refused):
            return "failed", "a token-budget refusal without Retry-After", n
        if not reached:
            return "not-proven", ("every request was refused for token-budget: the budget was spent before "
                                  "(other checks, or an earlier run within the minute)"), n
        return "proved", (f"{len(reached)} reached the upstream ({spent} tokens once settled; {fit} of cost "
                          f"{cost} fit unsettled), then {len(refused)} refused for token-budget with "
                          "Retry-After"), n

    @staticmethod
    def _assess_settled(sent: Sequence[Sent], cost: int, limit: int, capacity: int) -> Assessment:
        """Did the usage the settled requests' answers reported go back to the budget?"""
        n = len(sent)
        first = [(c, a) for c, a in sent if SETTLED_NOTE in c.note]
        later = sorted(((c, a) for c, a in sent if SETTLED_NOTE not in c.note),
                       key=lambda x: x[1].sent_at)
        if not first or any(a.verdict == "failed" for _c, a in sent):
            return "not-proven", "the zone's requests failed or were not sent", n
        if not all(_reached(a) for _c, a in first):
            a = next(a for _c, a in first if not _reached(a))
            return "not-proven", (f"a request whose usage was to be read did not reach the upstream "
                                  f"({a.status or a.error or 'no answer'}): the budget was spent before"), n
        shown = [a for _c, a in first if hidden_shown(a.answer_body)]
        if shown:
            return "failed", ("the usage-only event of a stream reached a client that did not ask for it "
                              "(the proxy asks a settled stream for its usage and must drop that event)"), n
        usages = [answer_usage(a) for _c, a in first]
        if all(u is None for u in usages):
            return "not-proven", ("the upstream's answers reported no usage: nothing to settle (vLLM and "
                                  "the stand-in report it in every JSON answer)"), n
        refund = sum(cost - settled_charge(cost, c, a, cost) for c, a in first)
        if refund <= 0:
            return "not-proven", "the answers reported as much usage as their charge: nothing to return", n
        reached = [a for _c, a in sent if _reached(a)]
        took = max(answered_at(a) for a in reached) - min(a.sent_at for _c, a in sent)
        most = budget_capacity(capacity, limit, took)
        if len(reached) * cost > most:
            return "proved", (f"{len(reached)} requests of cost {cost} reached within {took:.1f}s where the "
                              f"budget unsettled lets through at most {most:.0f} tokens: the {refund} tokens "
                              "the answers' usage left unused went back to it"), n
        end = max(answered_at(a) for _c, a in first)
        after = [(c, a) for c, a in later if a.sent_at >= end]
        spent = sum(settled_charge(cost, c, a, cost) for c, a in first)
        if after and _refused(after[0][1]) and spent + cost <= capacity:
            return "failed", (f"not settled: {len(first)} requests charged {len(first) * cost} tokens "
                              f"weigh {spent} once the usage their answers reported is counted, yet the next "
                              f"request of cost {cost} was refused for token-budget (a bucket of {capacity} "
                              "settled from usage has room for it)"), n
        return "not-proven", (f"{len(reached)} requests of cost {cost} reached: no more than the budget lets "
                              "through unsettled"), n

    @staticmethod
    def _assess_other(mine: Sequence[Attempt], theirs: Sequence[Attempt], fit: int, cost: int,
                      limit: int, capacity: int) -> Assessment:
        """Another principal's budget: its first request went before the first principal spent
        (it tells a budget spent before the run from a shared one), the rest after. Shared only
        when its next request was refused although its own bucket, which held that first request,
        refilled at least one request's cost in between (a budget of its own must have let it
        through); a refusal the evidence cannot tell from a budget spent before the run (an
        earlier probe within C x 60 / N seconds) is not proven, with why."""
        n = len(theirs)
        order = sorted(theirs, key=lambda a: a.sent_at)
        passed = sum(_reached(a) for a in theirs)
        ours = sum(_reached(a) for a in mine)
        refill_s = capacity * 60 / limit
        if passed == n and ours:
            return "proved", (f"all {n} reached while the first principal's budget was spent: a "
                              "budget of its own"), n
        if order and _refused(order[0]):
            return "not-proven", (f"its first request, sent before the first principal's, was refused for "
                                  f"token-budget: its budget was spent before the run (an earlier probe: a "
                                  f"bucket of {capacity} refills in {refill_s:.0f}s), so a shared budget is "
                                  "not told from it; probe again after that"), n
        refused = next((i for i, a in enumerate(order) if _refused(a)), None)
        if refused == 1 and _reached(order[0]) and ours:
            gap = order[1].sent_at - answered_at(order[0])
            if limit * gap / 60 >= cost:
                return "failed", (f"refused for token-budget {gap:.1f}s after its first request reached, "
                                  f"once {ours} of the first principal's requests were let through: its own "
                                  f"budget ({limit} a minute) refilled {limit * gap / 60:.0f} tokens in "
                                  f"between, room for this one of cost {cost}: one budget is shared"), n
            return "not-proven", (f"refused for token-budget {gap:.1f}s after its first request reached: its "
                                  f"own budget refills {limit * gap / 60:.0f} tokens in that time, less than "
                                  f"the cost {cost}, so a shared budget is not told from one spent before "
                                  "the run"), n
        if refused is not None:
            return "not-proven", (f"{passed} of {n} reached, then refused for token-budget: its budget held "
                                  f"less than {fit} of cost {cost}, spent before the run (an earlier probe: "
                                  f"a bucket of {capacity} refills in {refill_s:.0f}s) or shared"), n
        other = next((a for a in theirs if a.verdict != "proved" or a.outcome != "reached"), None)
        return "not-proven", (other.why if other else "the first principal's requests did not reach"), n

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        for key, ((status, why, _n), attempts) in self.assessed(ctx, results).items():
            if status == "failed":
                unsettled = key.endswith(f" {SETTLED}")
                yield make("VP005", attempts, why, extra=f"{self.id} {SETTLED}" if unsettled else self.id,
                           title="token budget not settled" if unsettled else "token budget not enforced")

    def cover(self, ctx: CheckContext, subjects: Sequence[Subject], results: Results,
              interrupted: bool = False) -> Iterable[Coverage]:
        yield from cov.assessed(self.id, subjects, self.assessed(ctx, results), interrupted)
