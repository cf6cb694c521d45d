"""scanner.probe.fleet: the limits' cases alternate between the replicas of a fleet (per burst, per
held group, per check for the rest); every other case goes through the first."""

from __future__ import annotations

from scanner.probe.cases import Case
from scanner.probe.fleet import spread
from scanner.probe.interface import Credential, Vantage


def _case(check: str, burst: str = "", hold: str = "") -> Case:
    return Case(check=check, method="GET", path="/v1/models", send_method="GET", target="/v1/models",
                credential=Credential("k", "role"), vantage=Vantage(), expected="allow", burst=burst,
                hold_group=hold)


def test_bursts_and_held_groups_alternate_other_checks_stay() -> None:
    cases = [_case("rate", burst="b1") for _ in range(5)] + [_case("rate", burst="b2") for _ in range(2)] \
        + [_case("concurrency", hold="h") for _ in range(3)] + [_case("matrix") for _ in range(3)] \
        + [_case("token-budget") for _ in range(2)]
    out = spread(cases, 2)
    assert [c.replica for c in out[:5]] == [0, 1, 0, 1, 0]
    assert [c.replica for c in out[5:7]] == [0, 1]             # each burst starts on the first
    assert [c.replica for c in out[7:10]] == [0, 1, 0]
    assert [c.replica for c in out[10:13]] == [0, 0, 0]        # not a limit: the target
    assert [c.replica for c in out[13:]] == [0, 1]
    assert [c.replica for c in spread(cases, 3)[:5]] == [0, 1, 2, 0, 1]
    assert spread(cases, 1) == cases
