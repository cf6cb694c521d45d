"""Run a probe: cases from the registered checks, sent paced by the plan's own limits,
bounded in concurrency, rate and time, yielded as events; then each check judges its
attempts into findings and coverage.

    async for event in run_probe(plan, target, credentials, vantages, options): ...
    result = summarize(events)        # or: result = probe(plan, target, ...)

Every answer gets a verdict (:mod:`scanner.probe.verdict`); an inconclusive one is sent
again (bounded: ``max_tries`` per case, a run-wide budget), after the limiter it met has
refilled. Ctrl-C, ``--max-time`` or a check that fails internally never lose what was
already proven: the run still judges every attempt it has and reports the rest as not
proven (``Interrupted`` / ``Errored`` events; the result is partial, exit 3).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from scanner import reasons as R
from scanner import stop
from scanner.plan.model import Plan
from scanner.probe import checks as _builtin_checks  # noqa: F401  (registers the built-in checks)
from scanner.probe import coverage as cov
from scanner.probe import fleet
from scanner.probe.cases import Case, with_query
from scanner.probe.coverage import Subject
from scanner.probe.interface import (
    Attempt,
    AttemptDone,
    Covered,
    Credential,
    Errored,
    Event,
    FindingFound,
    Finished,
    Interrupted,
    ProbeOptions,
    ProbeResult,
    Started,
    Target,
    Vantage,
    Witnessed,
    WitnessRecord,
)
from scanner.probe.owned import sealed_target
from scanner.probe.pace import (
    FREE,
    Bound,
    Gcra,
    Lane,
    LaneState,
    bound,
    lane_of,
    paced_model,
    refill_wait,
    remaining_seconds,
    time_limit,
)
from scanner.probe.registry import Check, CheckContext, selected
from scanner.probe.send import Sender, skipped
from scanner.probe.token_pace import (
    Charge,
    TokenModel,
    about_budget,
    balance,
    charge_of,
    light,
    planned_spend,
    refill_seconds,
    settled,
    token_bound,
)
from scanner.probe.verdict import verdict
from scanner.probe.witness import WitnessError, fetch, seen_verdict
from scanner.severity import severity_rank
from scanner.witness_asgi import ANSWER_PARAM, HOLD_GROUP_PARAM, HOLD_PARAM, PROBE_PARAM, TAG_PARAM
from scanner.witness_asgi import tag as witness_tag

PerCheck = dict[str, list[tuple[Case, Attempt]]]   # check id -> its cases with their last attempts

RETRY_DELAY = 0.5              # seconds before an inconclusive case goes again (no limiter involved)
AHEAD = 256                    # cases looked at past a head that waits for its tokens
FIRSTS_WAIT = 0.05              # a case charged to a budget whose Case.first cases are not decided yet
POLL = 0.02                    # a worker with nothing ready looks again after this long
ETA_EVERY_S = 0.25             # the progress display's ETA is computed again after this long
# With --stop-on-failure, these checks' allowed requests are compared with the witness at once.
EARLY_WITNESS = frozenset({"upstream", "limits"})


def catalog_paths(directory: str | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(path, methods) of exact HTTP routes in the catalogs of ``directory`` (None: the bundled
    ones, read once per process: about a second); none if there are none."""
    from scanner.errors import PerimeterError

    if directory is not None:
        return _catalog_paths(Path(directory))
    try:
        from scanner.resources import data_file

        return _bundled_catalog_paths(data_file("policies", "catalog"))
    except PerimeterError:
        return ()


@functools.lru_cache(maxsize=1)
def _bundled_catalog_paths(base: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return _catalog_paths(base)


def _catalog_paths(base: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    from scanner.errors import PerimeterError
    from scanner.inventory import model

    out: dict[str, tuple[str, ...]] = {}
    for f in sorted(base.glob("*.json")) if base.is_dir() else ():
        try:
            inv = model.load(f)
        except PerimeterError:
            continue
        for r in inv.routes:
            if r.kind == "http" and "{" not in r.path and r.path not in out:
                out[r.path] = tuple(m for m in r.methods if m != "*") or ("GET",)
    return tuple(sorted(out.items()))


class _Schedule:
    """Which case goes next: lanes paced by the plan's limits (scanner.probe.pace), one
    global rate, per-case retries within a bounded budget; the run's lower bound, its time
    limit (``options.max_time``, or derived from the bound) and what is left of both."""

    def __init__(self, ctx: CheckContext, cases: Sequence[Case], options: ProbeOptions,
                 start: float, wall_offset: float | None = None) -> None:
        self._eta: tuple[float, float] | None = None   # (when, value) of the last eta()
        self.ctx, self.cases, self.options = ctx, cases, options
        # token budgets (scanner.probe.token_pace): each case's charge, each budget's model, on
        # the wall clock (njs counts minutes of the epoch): wall = monotonic + offset
        self.wall_offset = time.time() - time.monotonic() if wall_offset is None else wall_offset
        self.charges: list[Charge] = [charge_of(ctx.plan, c, ctx.source_address(c.vantage)) for c in cases]
        self.tokens: dict[str, TokenModel] = {ch.key: TokenModel(ch.limit, ch.capacity)
                                              for ch in self.charges if ch.key}
        self.sent_wall = [0.0] * len(cases)
        # Case.first cases not decided yet, per token budget: the other cases charged to that
        # budget wait for them (the token-budget check's proof needs the budget before they spend
        # it, whichever lane they are sent in)
        self.firsts_left: dict[str, int] = {}
        self.fresh = [False] * len(cases)    # the first request the run charged to its budget
        for c, ch in zip(cases, self.charges, strict=True):
            if c.first and ch.key:
                self.firsts_left[ch.key] = self.firsts_left.get(ch.key, 0) + 1
        self.phase_started: set[tuple[str, int]] = set()   # (lane, phase 1 or 2) already sent from
        self.throttled: list[str] = [""] * len(cases)       # an earlier token-budget refusal, said

        self.glob = Gcra(options.rate, 1.0)
        self.lanes: dict[str, LaneState] = {}
        self.lane_key: list[str] = []
        self.tries = [0] * len(cases)
        self.not_before = [0.0] * len(cases)
        self.slots: dict[str, int] = {}
        self.firsts: dict[str, int] = {}     # Case.first cases in flight, per lane (one at a time)
        self.budget = max(50, len(cases) // 5)
        for i, case in enumerate(cases):
            lane = FREE if case.skip else lane_of(ctx.plan, case, ctx.source_address(case.vantage))
            # Case.lane: in another (earlier) lane's phases
            st = (self.lanes.get(case.lane) if case.lane and not case.skip else None) or self._lane(lane)
            st.queues[case.phase].append(i)
            self.lane_key.append(st.lane.key)
        spend = planned_spend(cases, self.charges)
        self.bound: Bound = bound(options.rate, [(st.lane, [cases[i] for q in st.queues for i in q])
                                                 for st in self.lanes.values()],
                                  [token_bound(k, self.tokens[k].limit, self.tokens[k].capacity, n)
                                   for k, n in sorted(spend.items())])
        self.max_time = options.max_time if options.max_time is not None else \
            max(options.auto_floor_s, time_limit(self.bound))
        self.deadline = start + self.max_time
        self.ordinary_left = sum(1 for c in cases if c.phase == 0 and not c.skip)   # unsent, globally paced
        self.done = 0                  # cases decided: their last send settled, not going again
        free = self.lanes.get("")
        if free is not None:   # one vantage at a time: a pipelined chunk then shares one connection
            ordered = sorted(free.queues[0], key=lambda i: cases[i].vantage.name)
            free.queues[0].clear()
            free.queues[0].extend(ordered)
        lead = options.lead_check
        for st in self.lanes.values():   # the cases that must go first, in their order; then the
            # costliest on a token budget (one of the whole budget needs it untouched)
            ordered = sorted(st.queues[0], key=lambda i: (not cases[i].first, cases[i].check != lead,
                                                          -self.charges[i].cost))
            st.queues[0].clear()
            st.queues[0].extend(ordered)

    def pending(self) -> bool:
        return any(st.pending() for st in self.lanes.values())

    def unsent(self) -> int:
        return sum(len(q) for st in self.lanes.values() for q in st.queues)

    def lanes_left(self) -> int:
        """Rate-limited lanes with cases still to send or settle."""
        return sum(1 for st in self.lanes.values() if st.lane.rps > 0 and st.pending())

    def eta(self, now: float) -> float:
        """The least time the unsent cases still need (the bound, from ``now``); computed again
        at most every ETA_EVERY_S (it walks every unsent case: once per answer was quadratic)."""
        if self._eta is not None and now - self._eta[0] < ETA_EVERY_S:
            return max(0.0, self._eta[1] - (now - self._eta[0]))
        value = self._eta_now(now)
        self._eta = (now, value)
        return value

    def _eta_now(self, now: float) -> float:
        rate = self.options.rate
        left = (self.ordinary_left / rate) if rate > 0 else 0.0
        unsent: dict[str, int] = {}
        for st in self.lanes.values() if self.tokens else ():
            for q in st.queues:
                for i in q:
                    ch = self.charges[i]
                    if ch.key:
                        unsent[ch.key] = unsent.get(ch.key, 0) + ch.cost
        wall = now + self.wall_offset
        tokens = (max(0.0, n - self.tokens[k].bucket(wall)) / self.tokens[k].rate for k, n in unsent.items())
        return max((left, *(remaining_seconds(st, now) for st in self.lanes.values()), *tokens))

    def _ahead(self, q: deque[int], now: float, head: int) -> int:
        """The first case of ``q`` no token budget charges (sent before the head, which waits for
        its tokens: it spends none of them), moved to the front; else ``head``."""
        for n, i in enumerate(q):
            if n >= AHEAD:
                break
            if not self.charges[i].key and not self.cases[i].first and self.not_before[i] <= now:
                q.remove(i)
                q.appendleft(i)
                return i
        return head

    def token_ready(self, st: LaneState, phase: int, head: int, now: float) -> float:
        """When the token budgets ``st``'s next case spends have room for it (token_pace): an
        ordinary case for its own cost, unless it is about the budget; a held or burst phase for
        all of its cases at once, before its first one goes; ``now`` when nothing is charged."""
        wall = now + self.wall_offset
        ch = self.charges[head]
        if phase == 0 or phase == 3 or (st.lane.key, phase) in self.phase_started:
            if ch.key and not self.cases[head].first and self.firsts_left.get(ch.key, 0):
                return now + FIRSTS_WAIT   # the budget's own check first (Case.first)
            if not ch.key or about_budget(self.cases[head]) or phase != 0:
                return now
            return now + self.tokens[ch.key].wait(ch.cost, wall)
        need: dict[str, int] = {}
        for i in st.queues[phase]:
            c = self.charges[i]
            if c.key:
                need[c.key] = min(self.tokens[c.key].capacity, need.get(c.key, 0) + c.cost)
        if any(self.firsts_left.get(k, 0) for k in need):
            return now + FIRSTS_WAIT
        return now + max((self.tokens[k].wait(n, wall) for k, n in need.items()), default=0.0)

    def pick(self, now: float) -> tuple[list[int], float]:
        """(cases to send now, 0) or ([], seconds to wait); ([], -1) when nothing is left."""
        if now >= self.deadline:
            return [], -1.0
        best: tuple[tuple[float, bool, bool], LaneState, int] | None = None
        for st in self.lanes.values():
            phase = st.phase()
            if phase is None:
                continue
            lane = st.lane
            if phase != 1 and lane.slots and self.slots.get(lane.slots_key, 0) >= lane.slots:
                continue
            head = st.queues[phase][0]
            if self.cases[head].first and self.firsts.get(st.lane.key, 0):
                continue    # the previous one's answer first (a token budget settles on it)
            if phase == 0 and self.token_ready(st, 0, head, now) > now:
                head = self._ahead(st.queues[0], now, head)   # what its tokens do not hold back
            at = max(now, self.not_before[head])
            if phase < 2 and not self.cases[head].skip:   # bursts at their own pace, follow-ups unpaced
                at = max(at, st.model.ready_at(now), self.glob.ready_at(now) if phase == 0 else now)
            elif phase == 2 and not self.cases[head].skip:
                at = max(at, st.sustained.ready_at(now))
            at = max(at, self.token_ready(st, phase, head, now))
            # of the lanes ready, one whose head is of the lead check first (a mutation run stops at
            # the first failure: the check the operator names must have its chance), then a paced
            # one: its pace, not the free cases, bounds the run
            lead = bool(self.options.lead_check) and self.cases[head].check == self.options.lead_check
            rank = (at, not lead, not (lane.rps > 0 or self.charges[head].key))
            if best is None or rank < best[0]:
                best = (rank, st, phase)
        if best is None:
            return [], (POLL if self.pending() else -1.0)
        (at, _lead, _free), st, phase = best
        if at > now:
            return [], min(at - now, 0.25)
        depth = self.options.pipeline if st.lane is FREE or not st.lane.key else 1
        out: list[int] = []
        q = st.queues[phase]
        while q and len(out) < depth and self.not_before[q[0]] <= now and \
                not (self.cases[q[0]].first and self.firsts.get(st.lane.key, 0)) and \
                not (out and self.charges[q[0]].key):   # a charged case goes when its tokens are there
            i = q.popleft()
            out.append(i)
            st.busy[phase] += 1
            if phase in (1, 2):
                self.phase_started.add((st.lane.key, phase))
            ch = self.charges[i]
            if ch.key:
                self.fresh[i] = self.tokens[ch.key].level is None   # nothing of the run charged it yet
                self.sent_wall[i] = now + self.wall_offset
                self.tokens[ch.key].charge(ch.cost, self.sent_wall[i])
            if not self.cases[i].skip and phase == 2:
                st.sustained.take(now)
            if not self.cases[i].skip and phase < 2:
                st.model.take(now)
                if phase == 0:
                    self.glob.take(now)
                    self.ordinary_left -= 1
            if st.lane.slots and phase != 1:
                self.slots[st.lane.slots_key] = self.slots.get(st.lane.slots_key, 0) + 1
            if self.cases[i].first:
                self.firsts[st.lane.key] = self.firsts.get(st.lane.key, 0) + 1
                break
        return out, 0.0

    def settle(self, i: int, attempt: Attempt, now: float) -> bool:
        """Record the end of one send of case ``i``; True if it goes again."""
        case = self.cases[i]
        st = self.lanes[self.lane_key[i]]
        st.busy[case.phase] -= 1
        if st.lane.slots and case.phase != 1:
            self.slots[st.lane.slots_key] -= 1
        if case.first:
            self.firsts[st.lane.key] -= 1
        self.tries[i] += 1
        kind, _ = R.parse(attempt.reason)
        self._settle_tokens(i, attempt, kind, now)
        if self._refill(i, attempt, kind, now):
            self.budget -= 1
            self.ordinary_left += 1
            st.queues[case.phase].appendleft(i)   # before the rest of its check, in its order
            return True
        if attempt.verdict != "inconclusive" or case.phase != 0 or now >= self.deadline or \
                self.tries[i] >= self.options.max_tries or self.budget <= 0:
            self.done += 1
            if case.first and self.charges[i].key:
                self.firsts_left[self.charges[i].key] -= 1
            return False
        self.budget -= 1
        self.ordinary_left += 1
        if kind == "token-budget" and attempt.layer == "proxy" and self.charges[i].key:
            self.not_before[i] = now    # again when the budget's model has room (token_ready)
        elif kind in R.THROTTLE and attempt.layer == "proxy":
            if not st.lane.key:
                # throttled though the plan says it is refused before any limiter: the perimeter
                # let it get that far, so it spends that limiter's tokens: pace it there
                st = self._lane(lane_of(self.ctx.plan, case, self.ctx.source_address(case.vantage),
                                        passes=True))
                self.lane_key[i] = st.lane.key
            st.model.empty(now, refill_wait(st.lane))
            self.not_before[i] = now + (refill_wait(st.lane) if not st.lane.key else 0.0)
        else:
            self.not_before[i] = now + RETRY_DELAY
        st.queues[0].append(i)
        return True

    def _refill(self, i: int, attempt: Attempt, kind: str, now: float) -> bool:
        """Case ``i`` is about its budget (the token-budget check), was the first request the run
        charged to it, and the proxy refused it for ``token-budget``: the budget was spent before
        the run (an earlier probe within the minute). It goes again once the bucket has refilled
        whole (capacity x 60 / limit seconds, token_pace.refill_seconds), when that is before the
        run's time limit; the cases after it in its lane wait for it. True: it goes again."""
        ch, case = self.charges[i], self.cases[i]
        if not (ch.key and about_budget(case) and self.fresh[i] and self.tries[i] == 1
                and kind == "token-budget" and attempt.layer == "proxy" and case.phase == 0):
            return False
        model, wall = self.tokens[ch.key], now + self.wall_offset
        wait = refill_seconds(model.capacity, model.limit)
        if now + wait >= self.deadline or self.budget <= 0:
            return False
        model.spent(wall)
        model.hold = max(model.hold, wall + wait)
        self.not_before[i] = now + wait
        retry = attempt.note.rsplit("Retry-After ", 1)[1] if "Retry-After " in attempt.note else "?"
        self.throttled[i] = (f"sent again {wait:.1f}s after {attempt.status} token-budget (Retry-After "
                             f"{retry}) to the run's first request on its budget: spent before the run "
                             f"(an earlier probe), a bucket of {model.capacity} refilled whole")
        return True

    def _settle_tokens(self, i: int, attempt: Attempt, kind: str, now: float) -> None:
        """The budget's model after case ``i``'s answer: a request the perimeter refused before
        admission was never charged; one it refused for ``token-budget`` though the model had
        room (not a case about the budget) means the budget holds less: counted spent, and said
        in the case's later attempts."""
        ch = self.charges[i]
        if not ch.key:
            return
        model, wall = self.tokens[ch.key], now + self.wall_offset
        # refused before admission (never charged); not a concurrency refusal: Envoy's circuit
        # breaker answers after the charge
        refused = attempt.status is not None and attempt.layer == "proxy" and attempt.outcome != "reached" \
            and attempt.status < 500 and kind != "concurrency"
        if refused:
            model.give_back(ch.cost, wall, self.sent_wall[i])
        else:   # settled by its answer's usage (a JSON answer the case read)
            model.give_back(settled(ch.cost, self.cases[i], attempt), wall, self.sent_wall[i])
        if kind == "token-budget" and attempt.layer == "proxy" and not about_budget(self.cases[i]):
            retry = attempt.note.rsplit("Retry-After ", 1)[1] if "Retry-After " in attempt.note else "?"
            model.spent(wall, ch.cost, float(retry) if retry.isdigit() else None)
            self.throttled[i] = (f"sent again after {attempt.status} token-budget (Retry-After {retry}) to a "
                                 f"request of {ch.cost} tokens the plan's model of the budget had room for")

    def _lane(self, lane: Lane) -> LaneState:
        st = self.lanes.get(lane.key)
        if st is None:
            st = self.lanes[lane.key] = LaneState(lane, paced_model(lane))
        return st


class _Run:
    """One probe run's state: cases, their latest attempts, the witness's records."""

    def __init__(self, ctx: CheckContext, items: Sequence[tuple[Check, Case]], sender: Sender,
                 options: ProbeOptions, schedule: _Schedule, others: tuple[Sender, ...] = ()) -> None:
        self.ctx, self.items, self.sender, self.options = ctx, items, sender, options
        self.senders = (sender, *others)     # replica i's sender (Case.replica)
        self.cases = schedule.cases
        self.schedule = schedule
        self.latest: list[Attempt | None] = [None] * len(items)
        self.run_id = secrets.token_hex(3)
        self.counter = 0
        self.sent = 0
        self.failed = 0

    @property
    def unanswered(self) -> bool:
        """Requests were sent and not one got an answer."""
        return bool(self.sent) and all(a is None or (a.status is None and a.verdict != "proved")
                                       for a in self.latest)   # (a handshake refused as the case expects)

    def _wire(self, case: Case, tries: int = 0) -> tuple[Case, str]:
        """The case as sent: with a probe id (and hold) when a witness records the upstream."""
        if not self.options.witness or case.grpc_port:   # the witness records HTTP requests only
            return case, ""
        if not case.target.startswith(("/", "http://", "https://")):
            return case, ""   # OPTIONS *: a query would make it another target
        self.counter += 1
        pid = f"{self.run_id}-{self.counter}"
        params = {PROBE_PARAM: pid}
        if case.answer:
            params[ANSWER_PARAM] = str(case.answer)
        if case.hold_ms:
            params[HOLD_PARAM] = str(case.hold_ms)
            if case.hold_group:   # one hold for the group, fresh for each retry of a case
                group = hashlib.sha256(f"{case.hold_group} {tries}".encode()).hexdigest()[:12]
                params[HOLD_GROUP_PARAM] = f"{self.run_id}-{group}"
        if self.options.witness_secret:   # the witness inside vLLM records tagged requests only
            params[TAG_PARAM] = witness_tag(self.options.witness_secret.encode(), params)
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return replace(case, target=with_query(case.target, query)), pid

    async def execute(self) -> AsyncIterator[Attempt]:
        """Send every case (and its retries); yield each attempt as it settles."""
        queue: asyncio.Queue[Attempt | None] = asyncio.Queue()
        workers = max(1, self.options.concurrency)

        held: set[asyncio.Task[None]] = set()

        async def worker() -> None:
            try:
                while True:
                    batch, wait = self.schedule.pick(time.monotonic())
                    if wait < 0:
                        return
                    if not batch:
                        await asyncio.sleep(wait)
                    elif self.cases[batch[0]].hold_ms:
                        # held open on purpose: never ties up a worker (or the others would wait)
                        task = asyncio.create_task(self._send(batch, queue))
                        held.add(task)
                        task.add_done_callback(held.discard)
                    else:
                        await self._send(batch, queue)
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        try:
            finished = 0
            while finished < workers:
                item = await queue.get()
                if item is None:
                    finished += 1
                else:
                    yield item
        finally:
            for t in (*tasks, *held):
                t.cancel()
            await asyncio.gather(*tasks, *held, return_exceptions=True)

    async def _send(self, batch: list[int], queue: asyncio.Queue[Attempt | None]) -> None:
        wired = [self._wire(self.cases[i], self.schedule.tries[i]) for i in batch]
        live = [(i, c, pid) for i, (c, pid) in zip(batch, wired, strict=True) if not c.skip]
        attempts: dict[int, Attempt] = {i: skipped(c, c.skip) for i, (c, _p) in zip(batch, wired, strict=True)
                                        if c.skip}
        if live:
            by_replica: dict[int, list[tuple[int, Case, str]]] = {}
            for item in live:
                by_replica.setdefault(min(item[1].replica, len(self.senders) - 1), []).append(item)
            # each replica's share of the batch at once (a burst stays a burst across the fleet)
            sent_each = await asyncio.gather(*(self.senders[r].send_many([c for _i, c, _p in group])
                                               for r, group in by_replica.items()))
            for group, sent in zip(by_replica.values(), sent_each, strict=True):
                for (i, _c, pid), a in zip(group, sent, strict=True):
                    attempts[i] = replace(a, probe_id=pid)
        now = time.monotonic()
        for i in batch:
            case = self.cases[i]
            a = attempts[i]
            v, why = verdict(case.expected, case.reasons, a)
            if case.answer and a.status == case.answer:   # the witness's own answer, as it asked:
                v, why = "proved", "answered as asked (the check's review judges the body)"   # no retry
            a = replace(a, verdict=v, why=why, reasons=case.reasons, subject=case.subject,
                        tries=self.schedule.tries[i] + 1)
            if self.schedule.throttled[i]:   # an earlier answer was a token-budget refusal: said
                a = replace(a, note=f"{a.note}; {self.schedule.throttled[i]}" if a.note else
                            self.schedule.throttled[i])
            if self.options.stop_on_failure and self.options.witness and v != "failed" and \
                    case.check in EARLY_WITNESS and case.expected == "allow":
                a = await self._witnessed(i, a)   # a failure only the witness sees stops the run too
            self.latest[i] = a
            self.failed += a.verdict == "failed"
            self.sent += a.outcome != "skipped"
            self.schedule.settle(i, a, now)
            if a.verdict == "failed" and self.options.stop_on_failure:
                self.schedule.deadline = now      # one failure decides it: send nothing more
            await queue.put(a)

    async def _witnessed(self, i: int, a: Attempt) -> Attempt:
        chk, case = self.items[i]
        assert self.options.witness is not None
        try:
            seen = await fetch(self.options.witness, a.probe_id, self.options.timeout, exact=True,
                               secret=self.options.witness_secret)
        except WitnessError:
            return a
        return chk.review(self.ctx, case, seen_verdict(case, a, seen.get(a.probe_id)))

    def finals(self, records: dict[str, WitnessRecord] | None) -> tuple[PerCheck, list[Attempt]]:
        """Each sent case with its last attempt (witness verdicts applied), per check id; and
        the attempts the witness's view changed."""
        out: PerCheck = {}
        changed: list[Attempt] = []
        for (chk, case), a in zip(self.items, self.latest, strict=True):
            if a is None:
                continue
            if records is not None:
                seen = chk.review(self.ctx, case, seen_verdict(case, a, records.get(a.probe_id)))
                if seen != a:
                    changed.append(seen)
                a = seen
            out.setdefault(chk.id, []).append((case, a))
        return out, changed


async def run_probe(plan: Plan, target: Target, credentials: Sequence[Credential],
                    vantages: Sequence[Vantage], options: ProbeOptions) -> AsyncIterator[Event]:
    """The probe as a stream of events: Started, AttemptDone..., Witnessed..., FindingFound..., Covered...,
    [Interrupted], [Errored...], Finished."""
    t0 = time.monotonic()
    ctx = CheckContext(plan=plan, target=target, credentials=tuple(credentials),
                       vantages=tuple(vantages) or (Vantage(),), options=options,
                       catalog_paths=catalog_paths(options.catalog_dir))
    checks = selected(options.checks)
    items: list[tuple[Check, Case]] = []
    subjects: dict[str, tuple[Subject, ...]] = {}
    broken: list[Errored] = []
    for chk in checks:
        try:
            subjects[chk.id] = tuple(chk.subjects(ctx))
            generated = fleet.spread([light(plan, c) for c in chk.generate(ctx)],
                                     1 + len(options.replicas))
            items += [(chk, c) for c in generated]
        except Exception as exc:  # a bug in one check: the others still run
            broken.append(Errored(chk.id, f"{type(exc).__name__}: {exc}"))
    spread = balance(plan, [c for _k, c in items], ctx.credentials, ctx.source_address)
    # (a case naming a stored response, responses: owned: its id sealed for the key it went to)
    items = [(chk, c if chk.id == "ownership" else sealed_target(ctx, c))
             for (chk, _c), c in zip(items, spread, strict=True)]
    schedule = _Schedule(ctx, [c for _k, c in items], options, t0)
    b = schedule.bound
    yield Started(target=target.base_url, plan_digest=plan.digest, policy=plan.policy_name,
                  total=len(items), vantages=tuple(v.name for v in ctx.vantages),
                  credentials=tuple((c.label, c.fingerprint) for c in ctx.credentials),
                  started_at=time.time(), to_send=b.cases, bound_s=round(b.seconds, 1),
                  bound_by=b.slowest, lanes=len(b.lanes), rate=options.rate,
                  max_time_s=schedule.max_time)
    for e in broken:
        yield e
    sender = Sender(target, options.timeout, options.transport_factory, options.client)
    # a fleet: one sender per other replica (the same TLS and client settings)
    others = [Sender(replace(target, base_url=url), options.timeout, options.transport_factory,
                     options.client) for url in options.replicas]
    run = _Run(ctx, items, sender, options, schedule, tuple(others))
    reason = ""
    records: dict[str, WitnessRecord] | None = None
    try:
        reason = await _preflight(sender, ctx)
        if not reason:
            async for attempt in run.execute():
                yield AttemptDone(attempt, done=schedule.done, sent=run.sent,
                                  lanes_left=schedule.lanes_left(),
                                  eta_s=round(schedule.eta(time.monotonic()), 1))
            unsent = run.schedule.unsent()
            if unsent:
                why = ("stopped at the first failure" if options.stop_on_failure and run.failed
                       else f"--max-time {schedule.max_time:g}s exceeded (the plan's lower bound: "
                            f"{b.seconds:.0f}s, set by {_bound_by(b)})")
                reason = f"{why}: {unsent} of {len(items)} cases not sent (partial results)"
                yield Interrupted(reason)
            elif run.unanswered:
                reason = "nothing answered: every request failed"
        if options.witness and run.sent and not run.unanswered:
            # also after a cut-short run: what was sent is judged with the witness's view
            records = await fetch(options.witness, f"{run.run_id}-", options.timeout,
                                  secret=options.witness_secret)
    except WitnessError as exc:
        reason = str(exc)
        yield Errored("witness", reason)
    except asyncio.CancelledError:
        reason = "interrupted: partial results"
        yield Interrupted(reason)
    except Exception as exc:  # an internal error while sending: keep what was proven
        reason = f"internal error while probing: {type(exc).__name__}: {exc}"
        yield Errored("runner", reason)
    finally:
        for s in (sender, *others):
            await s.aclose()
    if broken and not reason:   # a check that could not generate its cases: partial, never a pass
        reason = f"check {broken[0].check} failed: {broken[0].message}"
    results, changed = run.finals(records)
    for a in changed:
        yield Witnessed(a)
    for chk in checks:
        if chk.id not in subjects:
            continue
        try:
            own = results.get(chk.id, [])
            for finding in chk.judge(ctx, own):
                yield FindingFound(finding)
            covered = tuple(chk.cover(ctx, subjects[chk.id], own, interrupted=bool(reason)))
        except Exception as exc:
            reason = reason or f"check {chk.id} failed: {type(exc).__name__}"
            yield Errored(chk.id, f"{type(exc).__name__}: {exc}")
            continue
        for c in covered:
            yield Covered(c)
        for finding in cov.not_proven_findings(chk.id, subjects[chk.id], covered, own):
            yield FindingFound(finding)
    yield Finished(elapsed_s=round(time.monotonic() - t0, 3), sent=run.sent, unreachable=bool(reason),
                   reason=reason)


def _bound_by(b: Bound) -> str:
    if b.slowest == "rate":
        return f"--rate {b.rate:g}"
    if b.tokens and b.slowest == b.tokens[0].key:
        t = b.tokens[0]
        return f"token budget {t.key}: {t.tokens} tokens at {t.limit} a minute"
    return f"lane {b.slowest} at {b.lanes[0].rps:g} r/s" if b.slowest else "nothing"


async def _preflight(sender: Sender, ctx: CheckContext) -> str:
    """One request per vantage; a reason string if the target cannot be reached at all."""
    for vantage in ctx.vantages:
        case = Case("preflight", "GET", "/", "GET", "/", ctx.credentials[0], vantage, "deny")
        a = await sender.send(case)
        if a.outcome == "error" and a.status is None:
            tls = a.error.startswith("tls")
            hint = " (check --ca-bundle; verification is never turned off)" if tls else ""
            return f"{ctx.target.base_url} from vantage {vantage.name}: {a.error}{hint}"
    return ""


def summarize(events: Iterable[Event]) -> ProbeResult:
    """Fold a run's events into one result (the writers' input); a Witnessed attempt replaces
    the one of its probe id."""
    start: Started | None = None
    end: Finished | None = None
    attempts: list[Attempt] = []
    witnessed: dict[str, Attempt] = {}
    findings = []
    coverage = []
    for e in events:
        if isinstance(e, Started):
            start = e
        elif isinstance(e, AttemptDone):
            attempts.append(e.attempt)
        elif isinstance(e, Witnessed):
            witnessed[e.attempt.probe_id] = e.attempt
        elif isinstance(e, FindingFound):
            findings.append(e.finding)
        elif isinstance(e, Covered):
            coverage.append(e.coverage)
        elif isinstance(e, Finished):
            end = e
    if start is None:
        raise ValueError("no Started event")
    return ProbeResult(
        target=start.target, plan_digest=start.plan_digest, policy=start.policy,
        vantages=start.vantages, credentials=start.credentials,
        attempts=tuple(witnessed.get(a.probe_id, a) if a.probe_id else a for a in attempts),
        findings=tuple(sorted(findings, key=lambda f: (severity_rank(f.severity), f.path, f.method, f.id))),
        elapsed_s=end.elapsed_s if end else 0.0,
        unreachable=end.unreachable if end else True,
        reason=end.reason if end else "the run did not finish",
        coverage=tuple(coverage),
    )


async def collect(stream: AsyncIterator[Event]) -> list[Event]:
    return [e async for e in stream]


def probe(plan: Plan, target: Target, credentials: Sequence[Credential], vantages: Sequence[Vantage],
          options: ProbeOptions) -> ProbeResult:
    """Synchronous convenience: run the probe and summarise it."""
    return summarize(stop.run(collect(run_probe(plan, target, credentials, vantages, options))))


__all__ = ["Lane", "catalog_paths", "collect", "probe", "run_probe", "summarize"]
