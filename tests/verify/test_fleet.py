"""What ``verify --replicas`` records of a Redis outage in the run's result (scanner.verify.fleet.recorded):
a coverage line every report format shows, a deviation when the failure policy did not hold, not
proven when Redis could not be stopped on any route; the same for slots that did not come back
(recorded_slots)."""

from __future__ import annotations

import pytest

from scanner.errors import EXIT_FINDINGS, EXIT_OK
from scanner.probe.interface import ProbeResult
from scanner.report.probe_writers import render
from scanner.verify import fleet
from tests.cli.inprocess import in_process, run  # noqa: F401  (in_process: the fixture)


def _result() -> ProbeResult:
    return ProbeResult(target="http://127.0.0.1:1", plan_digest="d", policy="p", vantages=("public",),
                       credentials=(), attempts=(), findings=(), elapsed_s=1.0, unreachable=False)


def _outage(holds: bool, route: str = "GET /v1/models") -> fleet.FleetOutage:
    what = "Redis stopped: 44 requests to GET /v1/models through 2 replicas, 44 answered 503"
    return fleet.FleetOutage("deny", route, (503, 200) if not holds else (503, 503), (), 21, holds,
                               what if route else "Redis was not stopped: no limited GET route")


def test_a_held_failure_policy_is_a_proved_line_of_the_report() -> None:
    r = fleet.recorded(_result(), _outage(True))
    assert r.exit_code() == EXIT_OK and not r.findings
    (line,) = r.coverage
    assert line.status == "proved" and line.check == "fleet" and (line.method, line.path) == ("GET", "/v1/models")
    assert "44 answered 503" in render(r, "json") and "| fleet | 1 | 0 |" in render(r, "markdown")


def test_a_failure_policy_not_held_fails_the_run() -> None:
    r = fleet.recorded(_result(), _outage(False))
    assert r.exit_code() == EXIT_FINDINGS
    (f,) = r.findings
    assert f.rule == "VP005" and f.check == "fleet" and "shared store down" in f.title
    assert r.coverage[0].status == "failed"
    assert all("44 answered 503" in render(r, fmt) for fmt in ("json", "markdown", "sarif", "junit"))
    assert "shared store down" in render(r, "table")


def test_redis_not_stopped_is_not_proven() -> None:
    r = fleet.recorded(_result(), _outage(False, route=""))
    assert r.exit_code() == EXIT_OK and r.exit_code(require_proof=True) == EXIT_FINDINGS
    assert [f.rule for f in r.findings] == ["VP011"] and r.coverage[0].status == "not-proven"


def _slots(refused: int, route: str = "GET /v1/models") -> fleet.FleetSlots:
    statuses = (200,) * (34 - refused) + (429,) * refused
    what = f"34 requests to GET /v1/models one after another: {34 - refused} admitted, {refused} refused 429 concurrency"
    return fleet.FleetSlots(route, statuses if route else (), (), 16, route != "" and not refused,
                            what if route else "no limited GET route with a shared concurrency zone")


def test_slots_that_came_back_are_a_proved_line_and_orphans_fail_the_run() -> None:
    ok = fleet.recorded_slots(_result(), _slots(0))
    assert ok.exit_code() == EXIT_OK and [c.status for c in ok.coverage] == ["proved"]
    bad = fleet.recorded_slots(_result(), _slots(9))
    (f,) = bad.findings
    assert bad.exit_code() == EXIT_FINDINGS and f.rule == "VP005" and f.check == "fleet"
    assert "slots not released" in f.title and "9 refused 429 concurrency" in f.detail
    # both fleet checks failing: two findings, told apart
    both = fleet.recorded(bad, _outage(False))
    assert len({x.id for x in both.findings}) == 2
    none = fleet.recorded_slots(_result(), _slots(0, route=""))
    assert none.exit_code(require_proof=True) == EXIT_FINDINGS and [x.rule for x in none.findings] == ["VP011"]


@pytest.mark.usefixtures("in_process")
def test_the_cli_says_whether_slots_came_back_and_fails_when_not(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``verify --replicas 2`` with the fleet's run stubbed (the live runs: tests/limiter/
    test_fleet_verify.py): one stderr line per fleet check, exit 1 when slots did not come back."""
    from scanner.verify import fleet as fleet_module

    def runs(refused: int) -> object:
        def loop_all(*_a: object, **_k: object) -> tuple[list[fleet.FleetRun], list[object]]:
            result = fleet.recorded(fleet.recorded_slots(_result(), _slots(refused)), _outage(True))
            return [fleet.FleetRun("nginx", 2, result, 1.0, _outage(True), slots=_slots(refused))], []
        return loop_all

    monkeypatch.setattr(fleet_module, "loop_all", runs(0))
    code, _out, err = run(capsys, "verify", "--inventory", "vllm-0.29.0-default", "--replicas", "2",
                          "--format", "json", "-q")
    assert code == EXIT_OK and "0 refused 429 concurrency: slots come back" in err
    assert "the failure policy holds" in err
    monkeypatch.setattr(fleet_module, "loop_all", runs(9))
    code, _out, err = run(capsys, "verify", "--inventory", "vllm-0.29.0-default", "--replicas", "2",
                          "--format", "json", "-q")
    assert code == EXIT_FINDINGS and "9 refused 429 concurrency: slots DO NOT come back" in err
