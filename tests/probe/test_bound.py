"""The run's lower bound (scanner.probe.pace.bound) and the time limit derived from it: computed
from the plan's cases before anything is sent, carried by the Started event, and a real lower
bound of the run it describes."""

from __future__ import annotations

import asyncio

import pytest

from scanner.probe import pace
from scanner.probe.cases import Case
from scanner.probe.interface import AttemptDone, ProbeOptions, Started, Vantage
from scanner.probe.runner import collect, run_probe, summarize
from tests.probe import helpers as h

CRED = h.creds("user")[-1]


def cases(n: int, phase: int = 0, skip: str = "", hold_ms: int = 0) -> list[Case]:
    return [Case("unit", "GET", "/x", "GET", f"/x?{phase}-{i}", CRED, Vantage(), "allow",
                 phase=phase, skip=skip, hold_ms=hold_ms)  # type: ignore[arg-type]
            for i in range(n)]


LANE = pace.Lane("z:key:10/20||role:user", rps=10.0, burst=20)


def test_bound_of_known_lanes() -> None:
    lanes = [
        # nothing limits these: only the global rate paces them; skipped cases are not sent
        (pace.FREE, cases(100) + cases(7, skip="state-changing")),
        # the bucket's pace: burst 20 x 0.5 = 10 at once, then 9.5/s: 50 - 10 = 40 intervals
        # = 4.2105 s; one held case (phase 1) adds a paced send and its 2 s hold; the rate
        # burst: 21 at once, then 30/s: 51 - 21 = 30 intervals = 1 s
        (LANE, cases(50) + cases(1, phase=1, hold_ms=2000) + cases(51, phase=2) + cases(5, phase=3)),
    ]
    b = pace.bound(50.0, lanes)
    assert b.cases == 100 + 50 + 1 + 51 + 5
    assert b.global_s == pytest.approx(149 / 50)        # 150 ordinary cases, the first at once
    assert [(lane.key, lane.paced, lane.burst) for lane in b.lanes] == [(LANE.key, 51, 51)]
    assert b.lanes[0].seconds == pytest.approx(41 / 9.5 + 2.0 + 30 / 30)
    assert b.seconds == pytest.approx(41 / 9.5 + 3.0)
    assert b.slowest == LANE.key
    assert pace.time_limit(b) == pytest.approx(2 * b.seconds + 60, abs=0.05)

    slower = pace.bound(20.0, lanes)                    # now the global rate sets it
    assert slower.seconds == pytest.approx(149 / 20) and slower.slowest == "rate"
    assert pace.bound(0.0, lanes).global_s == 0.0       # --rate 0: unpaced


def test_no_cases_no_bound() -> None:
    b = pace.bound(0.0, [(LANE, cases(3))])             # unpaced, and within the burst: at once
    assert (b.seconds, b.slowest) == (0.0, "")


def events(rate: float, max_time: float | None) -> list[object]:
    options = ProbeOptions(rate=rate, max_time=max_time, transport_factory=h.perimeter(h.plan()),
                           catalog_dir="/nonexistent", checks=("matrix", "rate"))
    return asyncio.run(collect(run_probe(h.plan(), h.TARGET, h.creds("user"), (Vantage(),), options)))


def test_started_carries_the_bound_and_the_run_keeps_above_it() -> None:
    seen = events(rate=40.0, max_time=None)
    start = next(e for e in seen if isinstance(e, Started))
    assert start.bound_by == "rate" and start.rate == 40.0 and start.lanes == 1
    assert start.bound_s > 1.0
    assert start.max_time_s == pytest.approx(2 * start.bound_s + 60, abs=0.2)
    result = summarize(seen)                            # type: ignore[arg-type]
    assert not result.unreachable, result.reason
    assert result.elapsed_s >= start.bound_s - 0.1      # a lower bound indeed
    done = [e for e in seen if isinstance(e, AttemptDone)]
    assert done[-1].done == start.total
    assert done[-1].sent == sum(e.attempt.outcome != "skipped" for e in done) >= start.to_send
    assert done[0].eta_s <= start.bound_s + 0.1 and done[-1].eta_s == 0.0
    assert done[-1].lanes_left == 0 and max(e.lanes_left for e in done) == 1


def test_an_explicit_max_time_wins() -> None:
    start = next(e for e in events(rate=0.0, max_time=7.0) if isinstance(e, Started))
    assert start.max_time_s == 7.0
    assert start.bound_by.startswith("inference:")     # unpaced globally: the rate-limited lane
