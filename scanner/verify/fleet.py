"""``verify --replicas N``: the closed loop for a fleet (issue 21). N replicas of one proxy, the
limiter and one redis-server on loopback (scanner.runtime.fleet), in front of the stand-in; the
probe spreads its rate, concurrency and token-budget cases over every replica (scanner.probe.fleet),
so each limit must hold for their sum. Then Redis is stopped and the failure policy is tried
through every replica (:func:`outage`): ``deny`` answers 503 shared-store-unavailable, ``local``
admits no more than the policy in sum and refuses the rest with 429; never unlimited. Before
that, :func:`slots_back`: one principal's requests one after another through each replica, more
than its concurrency, none refused 429 concurrency (a slot not released when its request ended is
an orphan: the principal is locked out of it until the lease's owner is gone or slot_ttl_s).

The plan is the policy's with the fleet's addresses (scanner.runtime.fleet.plan_for: a policy
without ``shared:`` gets ``on_unavailable: deny``). Mutation operators of the fleet
(scanner.mutate.fleet) weaken the second replica's config.
"""

from __future__ import annotations

import http.client
import ipaddress
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from scanner import mutate, stop
from scanner.errors import EXIT_OK, InternalError, UsageError
from scanner.inventory.model import Inventory
from scanner.net import free_port, on_free_port
from scanner.plan.model import Decision, Plan
from scanner.policy.model import Policy
from scanner.probe import findings
from scanner.probe.interface import (
    Coverage,
    CoverageStatus,
    Credential,
    Finding,
    ProbeOptions,
    ProbeResult,
    Target,
    Vantage,
)
from scanner.probe.runner import probe
from scanner.runtime import fleet
from scanner.runtime.proxy import Proxy
from scanner.verify.loop import loop, probe_options
from scanner.verify.mutation import MutantRun, MutantStatus, caught_by, interruptible, mutant_options

MAX_REPLICAS = 8
OUTAGE_SETTLE_S = 1.5     # after Redis stops: the local buckets (full at first) are what they hold


@dataclass(frozen=True)
class FleetOutage:
    """What the fleet answered with Redis stopped: ``holds`` when the failure policy held."""

    policy: str                       # deny | local
    route: str                        # "GET /v1/models" (the route tried)
    statuses: tuple[int, ...]         # in order, alternating replicas
    reasons: tuple[str, ...]
    limit: int                        # local: the most the policy admits at once (burst + 1)
    holds: bool
    what: str                         # one sentence for the report

    def to_dict(self) -> dict[str, object]:
        return {"on_unavailable": self.policy, "route": self.route, "statuses": list(self.statuses),
                "reasons": sorted(set(self.reasons)), "holds": self.holds, "what": self.what}


@dataclass(frozen=True)
class FleetSlots:
    """What sequential requests (nothing else in flight) through each replica got: ``holds`` when
    none was refused (every slot came back when its request ended)."""

    route: str                        # "GET /v1/models" ("" none to try)
    statuses: tuple[int, ...]         # replica by replica
    reasons: tuple[str, ...]
    limit: int                        # the route's concurrency: limit + 1 sent through each replica
    holds: bool
    what: str


@dataclass(frozen=True)
class FleetRun:
    proxy: str
    replicas: int
    result: ProbeResult
    seconds: float
    outage: FleetOutage | None = None
    mutant: str = ""
    slots: FleetSlots | None = None


def check_replicas(n: int) -> int:
    if not 2 <= n <= MAX_REPLICAS:
        raise UsageError(f"--replicas {n}: a fleet is 2 to {MAX_REPLICAS} replicas on this machine")
    return n


def fleet_plan(plan: Plan, replicas: int) -> Plan:
    """``plan`` for a fleet on loopback: the limiter and Redis on free ports."""
    return fleet.plan_for(plan, replicas, free_port(), free_port())


def run(plan: Plan, proxy: Proxy, work: Path, credentials: Sequence[Credential], vantages: Sequence[Vantage],
        options: ProbeOptions, replicas: int, mutant: str = "", outage_too: bool = True) -> FleetRun:
    """Write, validate and start the fleet (the second replica weakened by ``mutant``), probe it
    through every replica, check that slots come back (slots_back), then stop Redis and try the
    failure policy (a mutant's too: a replica's failover burst shows only there)."""
    t0 = time.monotonic()
    check_replicas(replicas)

    def started(first: int) -> tuple[Plan, fleet.Fleet]:
        # every port of the fleet fresh when one was taken (scanner.net.on_free_port): the
        # limiter's and each replica's are in every replica's config
        fp = fleet_plan(fleet.replica(plan, first), replicas)
        ports = (first, *(free_port() for _ in range(replicas - 1)))
        f = fleet.Fleet(fp, proxy, work, ports)
        dirs = f.write()
        if mutant:
            op = mutate.OPERATORS[f"{proxy.kind}.{mutant}"]
            op.apply(dirs[1], fleet.replica(fp, ports[1]))
        for port, d in zip(ports, f.dirs, strict=True):
            problem = proxy.validate(fleet.replica(fp, port), d)
            if problem:
                raise InternalError(f"{proxy.name} rejected the generated config of a replica: {problem}")
        return fp, f.start()

    result: ProbeResult
    down: FleetOutage | None = None
    back: FleetSlots | None = None
    with ExitStack() as stack:
        fp, f = on_free_port(started, plan.listen.port)
        stack.callback(f.stop)
        urls = f.urls
        result = probe(fp, Target(urls[0]), credentials, vantages, replace(options, replicas=urls[1:]))
        if outage_too and not stop.requested():
            back = slots_back(fp, f, credentials, vantages)
            down = outage(fp, f, credentials, vantages)
    if back is not None:
        result = recorded_slots(result, back)
    if down is not None:
        result = recorded(result, down)
    return FleetRun(proxy.name, replicas, result, round(time.monotonic() - t0, 2), down, mutant, back)


OUTAGE_CHECK = "fleet"


def recorded(result: ProbeResult, o: FleetOutage) -> ProbeResult:
    """``result`` with what the fleet did while Redis was stopped, so every report format says it:
    a coverage line (proved: the failure policy held), and a finding when it did not (VP005: the
    limits were not what the policy says with the store down) or Redis could not be stopped on
    any route (VP011: not proven)."""
    return _record(result, f"shared store unavailable (on_unavailable: {o.policy})", o.route, o.holds,
                   o.what, len(o.statuses), "failure policy not held with the shared store down",
                   OUTAGE_CHECK)


def recorded_slots(result: ProbeResult, back: FleetSlots) -> ProbeResult:
    """``result`` with whether slots came back (slots_back): a coverage line, and a finding when a
    sequential request was refused (VP005) or there was no route to try (VP011: not proven)."""
    return _record(result, "slots released (a principal's sequential requests)", back.route, back.holds,
                   back.what, len(back.statuses), "slots not released when their requests ended",
                   f"{OUTAGE_CHECK}:slots")


def _record(result: ProbeResult, subject: str, route: str, holds: bool, what: str, attempts: int,
            title: str, key: str) -> ProbeResult:
    """``result`` with one of the fleet's own checks: proved, failed (VP005 on ``route``, its
    ``title``; ``key`` tells its finding id apart) or, without a route to try, not proven (VP011)."""
    method, _, path = route.partition(" ")
    status: CoverageStatus = "proved" if holds else "failed" if route else "not-proven"
    cov = Coverage(OUTAGE_CHECK, subject, status, why=what, attempts=attempts, method=method, path=path)
    if holds:
        found: tuple[Finding, ...] = ()
    elif not route:
        found = (findings.not_proven(OUTAGE_CHECK, [subject], "*", "*", what, []),)
    else:
        rule = findings.RULES["VP005"]
        found = (Finding(id=findings.finding_id("VP005", method, path, "*", key),
                         rule="VP005", severity=rule.severity, title=f"{title}: {route}",
                         method=method, path=path, vantage="*", detail=what,
                         remediation=rule.remediation, check=OUTAGE_CHECK),)
    return replace(result, coverage=(*result.coverage, cov), findings=(*result.findings, *found))


# --- Redis stopped ---------------------------------------------------------------------------------


def _tried(plan: Plan, credentials: Sequence[Credential], vantages: Sequence[Vantage],
           zone: str = "rate:") -> tuple[Decision, Credential, Vantage] | None:
    """A route to try the outage on: an allowed GET with a shared rate zone (and a ``zone`` one),
    a key it admits and a vantage in its networks."""
    shared = plan.shared
    assert shared is not None
    for d in sorted(plan.allowed, key=lambda d: (d.path, d.method)):
        zones = shared.route_zones(d)
        if d.method != "GET" or d.kind != "http" or not d.exact or d.auth != "key" or not d.rate_zone \
                or not any(z.startswith("rate:") for z in zones) \
                or not any(z.startswith(zone) for z in zones):
            continue
        cred = next((c for c in credentials if c.kind == "role" and (not d.roles or c.role in d.roles)), None)
        nets = [ipaddress.ip_network(n, strict=False) for n in d.networks]
        where = next((v for v in vantages if v.address and any(ipaddress.ip_address(v.address) in n
                                                                 for n in nets)), None)
        if cred is not None and where is not None:
            return d, cred, where
    return None


def _get(port: int, path: str, cred: Credential, vantage: Vantage) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                      source_address=(vantage.address or "127.0.0.1", 0))
    try:
        conn.request("GET", path, headers=cred.headers())
        reply = conn.getresponse()
        reply.read()
        return reply.status, reply.getheader("x-perimeter-reason") or ""
    except OSError as exc:
        return 0, type(exc).__name__
    finally:
        conn.close()


# at most this many sequential requests through each replica (a concurrency above it: not proven)
SLOTS_MAX = 130


def slots_back(plan: Plan, f: fleet.Fleet, credentials: Sequence[Credential],
               vantages: Sequence[Vantage]) -> FleetSlots:
    """One principal's requests to a route with a shared concurrency zone, one after another
    (each answered before the next: never more than one in flight), concurrency + 1 through each
    replica, paced at the route's rate (a rate refusal waits and goes again). Each request's slot
    must come back when it ends: one refused 429 concurrency is a slot that did not (a release
    lost, a replica that never sends it)."""
    tried = _tried(plan, credentials, vantages, "conc:")
    if tried is None:
        return FleetSlots("", (), (), 0, False, "no limited GET route with a shared concurrency zone, a key "
                          "and a vantage to try slots on")
    d, cred, vantage = tried
    rate, limit = d.limits.rate, d.limits.concurrency or 0
    route = f"{d.method} {d.path}"
    if limit + 1 > SLOTS_MAX:
        return FleetSlots(route, (), (), limit, False, f"{route}: concurrency {limit} needs more than "
                          f"{SLOTS_MAX} requests a replica")
    step = 1.0 / rate.rps if rate else 0.0
    time.sleep(min(3.0, (rate.burst + 1) * step) if rate else 0.0)   # the probe's rate spent: refilled
    answers: list[tuple[int, str]] = []
    for port in f.ports:
        for _ in range(limit + 1):
            got = _get(port, d.path, cred, vantage)
            for _retry in range(20):
                if got != (429, "rate"):
                    break
                time.sleep(step)
                got = _get(port, d.path, cred, vantage)
            answers.append(got)
            time.sleep(step)
    statuses = tuple(a[0] for a in answers)
    refused = sum(1 for a in answers if a == (429, "concurrency"))
    holds = all(s == 200 for s in statuses)
    what = (f"{len(answers)} requests to {route} one after another, {limit + 1} through each of "
            f"{len(f.ports)} replicas (concurrency {limit}): {statuses.count(200)} admitted, {refused} "
            f"refused 429 concurrency" + ("" if holds else f", statuses {sorted(set(statuses))}")
            + (" (slots not released when their requests ended)" if refused else ""))
    return FleetSlots(route, statuses, tuple(a[1] for a in answers), limit, holds, what)


def outage(plan: Plan, f: fleet.Fleet, credentials: Sequence[Credential],
           vantages: Sequence[Vantage]) -> FleetOutage:
    """Stop Redis; send twice the route's burst + 1 (plus 2) requests alternating the replicas; judge."""
    shared = plan.shared
    assert shared is not None
    tried = _tried(plan, credentials, vantages)
    if tried is None:
        return FleetOutage(shared.on_unavailable, "", (), (), 0, False,
                      "Redis was not stopped: no limited GET route with a key and a vantage to try it on")
    d, cred, vantage = tried
    rate = d.limits.rate
    assert rate is not None
    limit = rate.burst + 1
    f.redis.stop()
    time.sleep(OUTAGE_SETTLE_S)
    answers = [_get(f.ports[i % len(f.ports)], d.path, cred, vantage) for i in range(2 * limit + 2)]
    statuses = tuple(a[0] for a in answers)
    reasons = tuple(a[1] for a in answers)
    admitted = statuses.count(200)
    route = f"{d.method} {d.path}"
    if shared.on_unavailable == "deny":
        holds = all(a == (503, "shared-store-unavailable") for a in answers)
        what = (f"Redis stopped: {len(answers)} requests to {route} through {len(f.ports)} replicas, "
                f"{statuses.count(503)} answered 503 shared-store-unavailable, {admitted} admitted "
                f"(on_unavailable: deny)")
    else:
        holds = 0 < admitted <= limit and all(s in (200, 429) for s in statuses)
        what = (f"Redis stopped: {len(answers)} requests to {route} through {len(f.ports)} replicas, "
                f"{admitted} admitted by the replicas' local shares (the policy: {limit} at once), "
                f"{statuses.count(429)} refused 429, {statuses.count(503)} 503 (on_unavailable: local)")
    return FleetOutage(shared.on_unavailable, route, statuses, reasons, limit, holds, what)


# --- the loop: each proxy's fleet, then (--mutate) the fleet's operators ----------------------------


def loop_all(inventory: Inventory, policy: Policy, proxies: Sequence[Proxy], options: ProbeOptions,
             keys_per_role: int, replicas: int, mutants: bool = False, only: Sequence[str] = (),
             say: Callable[[str], None] = lambda _m: None) -> tuple[list[FleetRun], list[MutantRun]]:
    """The fleet run per proxy (and its outage), then with ``mutants`` one run per fleet operator
    (scanner.mutate.fleet) on a fresh fleet whose second replica it weakens."""
    check_replicas(replicas)
    runs: list[FleetRun] = []
    out: list[MutantRun] = []
    with loop(inventory, policy, proxies, keys_per_role) as (s, witness, written):
        base_options = probe_options(s, options, witness)
        for proxy, directory in written:
            say(f"{proxy.name}: a fleet of {replicas}, the limiter and redis-server; probing through "
                f"every replica")
            try:
                r = run(s.plan, proxy, directory.parent / f"{proxy.name}-fleet", s.credentials, s.vantages,
                        base_options, replicas)
            except KeyboardInterrupt:   # outside the probe's loop (a replica starting): as below
                stop.interrupted()
                break
            runs.append(r)
            if stop.requested():   # Ctrl-C or SIGTERM: keep what was proven, start nothing new
                break
            if r.outage is not None:
                say(f"{proxy.name}: {r.outage.what}: {'holds' if r.outage.holds else 'DOES NOT HOLD'}")
            if not mutants:
                continue
            if r.result.deviations or r.result.unreachable:
                say(f"{proxy.name}: the unmutated fleet is not clean: no mutation run")
                continue
            for op in mutate.operators(proxy.kind):
                if op.needs != mutate.fleet.NEEDS or (only and not {op.id, op.name, op.family} & set(only)):
                    continue
                work = directory.parent / f"{proxy.name}-{op.id}"
                fast = mutant_options(base_options, op.id)
                out.append(interruptible(proxy.name, op, partial(
                    _mutant, s.plan, proxy, op, work, s.credentials, s.vantages, fast, replicas)))
                say(f"{proxy.name} {op.id}: {out[-1].status} {' '.join(out[-1].rules)}")
                if stop.requested():
                    break
            if stop.requested():
                break
    return runs, out


def _mutant(plan: Plan, proxy: Proxy, op: mutate.Operator, work: Path, credentials: Sequence[Credential],
            vantages: Sequence[Vantage], options: ProbeOptions, replicas: int) -> MutantRun:
    def run_of(status: MutantStatus, what: str, **more: object) -> MutantRun:
        return MutantRun(proxy.name, op.id, op.title, status, what, family=op.family,
                         catches=op.catches, **more)  # type: ignore[arg-type]
    try:
        r = run(plan, proxy, work, credentials, vantages, options, replicas, mutant=op.name)
    except mutate.NotApplicable as exc:
        return run_of("not-applicable", str(exc))
    except InternalError as exc:
        return run_of("invalid", str(exc))
    caught = r.result.exit_code() != EXIT_OK
    return run_of("caught" if caught else "survived", op.title, rules=caught_by(r.result),
                  seconds=r.seconds, checks=tuple(dict.fromkeys(f.check for f in r.result.deviations)))
