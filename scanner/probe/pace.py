"""Pacing: which limiter a case spends, and a schedule that keeps every limiter within what
the plan allows, so that only the checks about limits ever meet one.

A request spends a token of a rate bucket (and holds a concurrency slot) only when it
passes the perimeter's network, method, key and role checks: that is the plan's
decision for the method on the wire, the credential and the source address. Buckets
are per :attr:`Decision.rate_zone` and principal (``auth: key``) or source address
(``auth: none``), exactly as both generators key them; each gets a *lane*.

Within a lane, cases are sent through a conservative model of the proxy's bucket:
half the burst up front, then 95% of the rate (a generic cell rate algorithm). NGINX's
leaky bucket admits that; Envoy's bucket, filled once per interval, stays above empty as
long as half the burst covers one interval's worth (true of every default audience). A lane's
ordinary cases go first (phase 0), then its held-open concurrency cases (phase 1), then
its rate burst (phase 2: the burst at once, then 3 x the rate: meeting the limiter is the
point), then requests to the bucket's other routes, which must find it empty (phase 3, unpaced),
and another principal's (or address's) requests, which must not (``Case.lane``: sent in this
lane's phases though their own bucket is another). An unexpected
429 empties the model (the real bucket is empty) and the case is tried again later.

Token budgets (``limits.tokens_per_minute``) are paced by scanner/probe/token_pace.py: the
runner holds a case until its plan cost fits its budget's model; :class:`Bound` counts them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from scanner.plan.model import Plan
from scanner.probe.cases import Case
from scanner.probe.expect import expect, in_networks
from scanner.probe.token_pace import TokenBound

# The share of a bucket the schedule counts on: half the burst, 95% of the rate.
BURST_SHARE = 0.5
RATE_SHARE = 0.95
# A rate burst goes out at this many times the rate once the bucket's burst is spent.
SUSTAIN = 3.0


@dataclass(frozen=True)
class Lane:
    """One limiter bucket (or none: ``key`` ""), and the concurrency slots its cases use."""

    key: str = ""
    rps: float = 0.0               # 0: not rate-limited
    burst: int = 0
    slots_key: str = ""            # concurrency family and subject; "" if none
    slots: int = 0                 # in flight at most (0: unbounded)


FREE = Lane()


def lane_of(plan: Plan, case: Case, source_address: str | None, passes: bool = False) -> Lane:
    """The lane of ``case``: the buckets the request on the wire spends, from the plan (with
    ``passes``: as if the network, key and role checks let it through)."""
    d = plan.decision(case.send_method, case.path)
    if d is None or not d.allowed or d.kind == "mount" or (case.before_limits and not passes):
        return FREE
    if not passes and expect(d, case.credential, source_address).denied:
        return FREE                # refused before any limiter
    if not d.rate_zone and not d.conn_zone:
        return FREE
    counted = (d.auth, case.credential.kind) in (("key", "role"), ("jwt", "token"))
    subject = case.credential.label if counted else (source_address or case.vantage.name)
    rate = d.limits.rate
    return Lane(
        key=f"{d.rate_zone}|{d.conn_zone}|{subject}",
        rps=rate.rps if rate else 0.0, burst=rate.burst if rate else 0,
        slots_key=f"{d.conn_zone}|{subject}" if d.conn_zone else "",
        slots=d.limits.concurrency or 0,
    )


def outside(source_address: str | None, cidrs: tuple[str, ...]) -> bool:
    return source_address is not None and not in_networks(source_address, cidrs)


@dataclass
class Gcra:
    """A generic cell rate algorithm: when may the next request go, for ``rps`` with
    ``burst`` requests up front. ``rps`` 0: always now."""

    rps: float
    burst: float
    tat: float = 0.0               # theoretical arrival time

    @property
    def interval(self) -> float:
        return 1.0 / self.rps if self.rps > 0 else 0.0

    def ready_at(self, now: float) -> float:
        if self.rps <= 0:
            return now
        return max(now, self.tat - (max(1.0, self.burst) - 1) * self.interval)

    def take(self, now: float) -> float:
        at = self.ready_at(now)
        if self.rps > 0:
            self.tat = max(self.tat, at) + self.interval
        return at

    def empty(self, now: float, wait: float) -> None:
        """The real bucket is empty: nothing before ``now + wait``, then one at a time."""
        if self.rps > 0:
            self.tat = now + wait + max(1.0, self.burst) * self.interval


@dataclass
class LaneState:
    lane: Lane
    model: Gcra
    queues: tuple[deque[int], deque[int], deque[int], deque[int]] = field(
        default_factory=lambda: (deque(), deque(), deque(), deque()))
    busy: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # sent, not yet settled, per phase
    sustained: Gcra = field(init=False)   # the pace of its rate burst (phase 2): burst_model

    def __post_init__(self) -> None:
        self.sustained = burst_model(self.lane)

    def phase(self) -> int | None:
        """The phase whose next case may go now: a phase starts once every earlier phase has
        been sent and settled (its retries included)."""
        for i, q in enumerate(self.queues):
            if q:
                return i
            if self.busy[i]:
                return None
        return None

    def pending(self) -> bool:
        return any(self.queues) or any(self.busy)


def paced_model(lane: Lane) -> Gcra:
    """The schedule's model of ``lane``'s bucket (see the module docstring)."""
    if lane.rps <= 0:
        return Gcra(0.0, 0.0)
    return Gcra(lane.rps * RATE_SHARE, max(1.0, lane.burst * BURST_SHARE))


@dataclass(frozen=True)
class LaneBound:
    """The least time one rate-limited lane's cases need at the schedule's pace."""

    key: str
    rps: float
    paced: int                     # its ordinary and held cases, at the bucket's pace (paced_model)
    burst: int                     # its rate burst, at the burst's pace (burst_model)
    seconds: float                 # the phases one after the other (follow-ups go unpaced)


@dataclass(frozen=True)
class Bound:
    """The least time a run can take, from its plan alone, before anything is sent: the global
    ``--rate`` over every ordinary case, and each rate-limited lane at its own pace (see the
    module docstring); the run takes at least the larger. Retries and answers' latency only
    add to it."""

    cases: int                     # cases to send (not skipped)
    rate: float                    # the global rate (0: unpaced)
    global_s: float                # the ordinary cases at ``rate``
    lanes: tuple[LaneBound, ...]   # rate-limited lanes, slowest first
    tokens: tuple[TokenBound, ...] = ()   # token budgets their cases spend, slowest first (token_pace)

    @property
    def seconds(self) -> float:
        return max(self.global_s, self.lanes[0].seconds if self.lanes else 0.0,
                   self.tokens[0].seconds if self.tokens else 0.0)

    @property
    def slowest(self) -> str:
        """What sets the bound: "rate" (the global rate), the slowest lane's key or the slowest token
        budget's ("" if none)."""
        lane = self.lanes[0].seconds if self.lanes else 0.0
        tokens = self.tokens[0].seconds if self.tokens else 0.0
        if self.global_s > 0 and self.global_s >= max(lane, tokens):
            return "rate"
        if tokens > lane:
            return self.tokens[0].key
        return self.lanes[0].key if self.lanes and lane > 0 else ""


def spread_seconds(model: Gcra, n: int, now: float = 0.0) -> float:
    """How long ``n`` more requests take from ``now`` under ``model``: what it still holds of
    its burst at once, then one per interval (the last one's send time)."""
    if model.rps <= 0 or n <= 0:
        return 0.0
    return max(0.0, max(model.tat, now) - now + (n - model.burst) * model.interval)


def lane_seconds(lane: Lane, paced: int, held_ms: int = 0, burst: int = 0) -> float:
    """How long a lane's phases take one after the other: ``paced`` ordinary and held cases at
    the bucket's pace, the longest hold, then ``burst`` cases of its rate burst."""
    return spread_seconds(paced_model(lane), paced) + held_ms / 1000 + \
        spread_seconds(burst_model(lane), burst)


def global_seconds(ordinary: int, rate: float) -> float:
    """How long ``ordinary`` cases take at the global rate (the first goes at once)."""
    return (ordinary - 1) / rate if rate > 0 and ordinary > 1 else 0.0


def bound(rate: float, lanes: list[tuple[Lane, list[Case]]],
          tokens: Sequence[TokenBound] = ()) -> Bound:
    """The run's :class:`Bound` for its cases grouped by lane (and the token budgets they spend)."""
    ordinary = sum(1 for _lane, cases in lanes for c in cases if not c.skip and c.phase == 0)
    rated = []
    for lane, cases in lanes:
        if lane.rps <= 0:
            continue
        paced = [c for c in cases if not c.skip and c.phase < 2]
        held = max((c.hold_ms for c in paced if c.phase == 1), default=0)
        burst = sum(1 for c in cases if not c.skip and c.phase == 2)
        rated.append(LaneBound(lane.key, lane.rps, len(paced), burst,
                               lane_seconds(lane, len(paced), held, burst)))
    rated.sort(key=lambda b: (-b.seconds, b.key))
    return Bound(cases=sum(1 for _lane, cases in lanes for c in cases if not c.skip), rate=rate,
                 global_s=global_seconds(ordinary, rate), lanes=tuple(rated),
                 tokens=tuple(sorted(tokens, key=lambda b: (-b.seconds, b.key))))


# --max-time auto: this many times the bound, plus this much (answers, retries, refills)
AUTO_FACTOR = 2.0
AUTO_SLACK_S = 60.0


def time_limit(b: Bound) -> float:
    """The run's time limit when none is given (``--max-time auto``)."""
    return round(AUTO_FACTOR * b.seconds + AUTO_SLACK_S, 1)


def remaining_seconds(st: LaneState, now: float) -> float:
    """The least time ``st``'s unsent cases still need from ``now`` (holds left out)."""
    if st.lane.rps <= 0:
        return 0.0
    return spread_seconds(st.model, len(st.queues[0]) + len(st.queues[1]), now) + \
        spread_seconds(st.sustained, len(st.queues[2]), now)


def burst_model(lane: Lane) -> Gcra:
    """The pace of ``lane``'s rate burst (phase 2): the bucket's whole burst + 1 at once, then
    SUSTAIN x its rate, so the burst lasts long enough for a rate above the plan to admit
    measurably more than the plan's capacity over it (checks.load.capacity)."""
    if lane.rps <= 0:
        return Gcra(0.0, 0.0)
    return Gcra(lane.rps * SUSTAIN, lane.burst + 1.0)


def refill_wait(lane: Lane) -> float:
    """How long an emptied bucket needs before the model sends again (one fill interval)."""
    return max(1.0, 1.0 / lane.rps) if lane.rps > 0 else 0.5


def now() -> float:
    return time.monotonic()
