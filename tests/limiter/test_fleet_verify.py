"""``verify --replicas 2`` (scanner.verify.fleet): two replicas, the limiter and a redis-server in
front of the stand-in; the probe's rate and concurrency cases spread over both replicas hold for
the sum; each fleet mutant (one replica unshared, a per-replica key) is caught by them (exit 1);
Redis stopped: the failure policy holds and says so. The cheap variant runs the concurrency check
through an Envoy fleet; the mutants and the whole probe of both proxies are slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner import mutate
from scanner.errors import EXIT_OK
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.probe.interface import ProbeOptions
from scanner.verify import fleet, loop, mutation
from tests.limiter.harness import redis_binary
from tests.probe.realproxy import proxy_named
from tests.probe.test_token_budget import LIVE_TPM, token_policy

CATALOG = "vllm-0.29.0-default"
LIMITS = ProbeOptions(rate=0, timeout=10, max_time=120, checks=("concurrency",))
TOKENS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=180, checks=("token-budget",))


def _fleet(name: str, options: ProbeOptions, mutants: bool, only: tuple[str, ...] = ()
           ) -> tuple[list[fleet.FleetRun], list[mutation.MutantRun]]:
    redis_binary()
    return fleet.loop_all(load_ref(CATALOG), load_policy(None), [proxy_named(name)], options, 2, 2,
                          mutants, only)


@pytest.mark.envoy
def test_envoy_fleet_limits_hold_for_the_sum_and_the_outage_is_reported() -> None:
    runs, mutants = _fleet("envoy", LIMITS, False)
    (run,) = runs
    assert run.result.exit_code() == EXIT_OK, [f.title for f in run.result.deviations]
    assert not mutants
    assert run.outage is not None and run.outage.holds and run.outage.policy == "deny"
    assert set(run.outage.statuses) == {503} and "shared-store-unavailable" in run.outage.what
    # in the run's result, so every report format says it
    (line,) = [c for c in run.result.coverage if c.check == fleet.OUTAGE_CHECK and "unavailable" in c.subject]
    assert line.status == "proved" and line.why == run.outage.what
    # and the slots came back: sequential requests through each replica, none refused
    (slots,) = [c for c in run.result.coverage if c.check == fleet.OUTAGE_CHECK and "slots" in c.subject]
    assert slots.status == "proved" and run.slots is not None and slots.why == run.slots.what
    assert run.slots.statuses == (200,) * (2 * (run.slots.limit + 1))


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param("envoy", marks=pytest.mark.envoy),
                                  pytest.param("nginx", marks=pytest.mark.nginx)])
def test_both_fleet_mutants_are_caught(name: str) -> None:
    """About 50 s a proxy: the baseline and one fleet per mutant."""
    _runs, mutants = _fleet(name, LIMITS, True, ("replica-unshared", "replica-zone-key"))
    assert {m.operator for m in mutants} == {f"{name}.replica-unshared", f"{name}.replica-zone-key"}
    assert all(m.status == "caught" and m.expected for m in mutants), [(m.operator, m.status, m.checks)
                                                                        for m in mutants]

@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param("envoy", marks=pytest.mark.envoy),
                                  pytest.param("nginx", marks=pytest.mark.nginx)])
def test_an_orphaned_slot_and_a_failover_burst_are_caught(name: str) -> None:
    """Issue 27, item 9 (about 50 s a proxy): the second replica never releasing its slots is
    caught by sequential requests refused 429 concurrency (fleet.slots_back); its failover handing
    out a full burst at once by the requests it admits with Redis stopped (fleet.outage). The
    unmutated fleet passes both."""
    runs, mutants = _fleet(name, LIMITS, True, ("replica-orphaned-slot", "replica-failover-burst"))
    (run,) = runs
    assert run.slots is not None and run.slots.holds and run.outage is not None and run.outage.holds
    assert run.result.exit_code() == EXIT_OK
    by = {m.operator.partition(".")[2]: m for m in mutants}
    assert set(by) == {"replica-orphaned-slot", "replica-failover-burst"}
    assert all(m.status == "caught" and m.expected and m.rules == ("VP005", "failed") for m in mutants), \
        [(m.operator, m.status, m.rules, m.checks) for m in mutants]


def test_fleet_operators_skip_a_single_proxy_and_a_plan_without_shared(tmp_path: Path) -> None:
    s = loop.setup(load_ref(CATALOG), load_policy(None), tmp_path, 9)
    for op in (o for o in mutate.OPERATORS.values() if o.needs == mutate.fleet.NEEDS):
        with pytest.raises(mutate.NotApplicable, match="shared"):
            op.apply(tmp_path, s.plan)
    assert not set(mutate.OPERATORS) - {o.id for k in ("envoy", "nginx") for o in mutate.operators(k)}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param("envoy", marks=pytest.mark.envoy),
                                  pytest.param("nginx", marks=pytest.mark.nginx)])
def test_the_whole_probe_through_a_fleet(name: str) -> None:
    runs, mutants = _fleet(name, ProbeOptions(rate=0, timeout=15, max_time=300), True)
    (run,) = runs
    assert run.result.exit_code() == EXIT_OK and run.outage is not None and run.outage.holds
    tried = [m for m in mutants if m.status != "not-applicable"]
    assert len(tried) == 4 and all(m.status == "caught" for m in tried)
    (skipped,) = [m for m in mutants if m.status == "not-applicable"]   # the bundled policy has no token budget
    assert skipped.operator == f"{name}.limiter-bucket-two-minutes" and "token zone" in skipped.what


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param("envoy", marks=pytest.mark.envoy),
                                  pytest.param("nginx", marks=pytest.mark.nginx)])
def test_a_shared_token_bucket_of_two_minutes_is_caught(name: str) -> None:
    """Issue 27, item 9: the limiter's token zone at twice its capacity (the zones file the replica
    carries) lets the fleet admit up to 2 C + N a minute; the token-budget check spread over both
    replicas catches it by exit code. The unmutated fleet passes."""
    redis_binary()
    runs, mutants = fleet.loop_all(load_ref(CATALOG), token_policy(LIVE_TPM), [proxy_named(name)],
                                   TOKENS, 2, 2, True, ("limiter-bucket-two-minutes",))
    (run,) = runs
    assert run.result.exit_code() == EXIT_OK, [f.title for f in run.result.deviations]
    (m,) = mutants
    assert m.status == "caught" and m.expected and m.checks == ("token-budget",) and "VP005" in m.rules, \
        (m.status, m.rules, m.checks)

