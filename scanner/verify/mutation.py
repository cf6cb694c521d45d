"""``verify --mutate``: the prober's own sensitivity. The closed loop (:mod:`scanner.verify.loop`)
runs against weakened copies of the generated config (:mod:`scanner.mutate`): each must be
caught, i.e. make the probe exit non-zero with its default flags (a deviation from the plan;
"not proven" alone does not catch). The score per proxy and family: :mod:`scanner.report.mutation`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from scanner import mutate, stop
from scanner.errors import EXIT_OK, InternalError
from scanner.inventory.model import Inventory
from scanner.plan.model import Plan
from scanner.policy.model import Policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime.proxy import Proxy
from scanner.verify.loop import ProxyRun, Setup, loop, proxy_run

MutantStatus = Literal["caught", "survived", "invalid", "not-applicable", "interrupted"]


@dataclass(frozen=True)
class MutantRun:
    proxy: str
    operator: str
    title: str
    status: MutantStatus
    what: str = ""                 # what the operator changed, or why it could not
    rules: tuple[str, ...] = ()    # the findings that caught it
    seconds: float = 0.0
    checks: tuple[str, ...] = ()   # the checks of the findings that caught it, first first
    family: str = ""               # the operator's family (scanner.mutate.FAMILIES)
    catches: tuple[str, ...] = ()  # the checks the operator says must catch it

    @property
    def check(self) -> str:
        """The check of the first finding that caught it ("" none)."""
        return self.checks[0] if self.checks else ""

    @property
    def expected(self) -> bool:
        """Was it caught by a check (or rule) that the operator says must catch it?"""
        return self.status == "caught" and bool((set(self.checks) | set(self.rules)) & set(self.catches))

    def to_dict(self) -> dict[str, object]:
        return {"proxy": self.proxy, "operator": self.operator, "family": self.family, "title": self.title,
                "status": self.status, "what": self.what, "rules": list(self.rules),
                "checks": list(self.checks), "catches": list(self.catches), "seconds": self.seconds}


def caught_by(result: ProbeResult) -> tuple[str, ...]:
    """The rules of what the probe established against a mutant: findings, and subjects it tried
    and could not prove. Subjects left unsent by an early stop are not evidence."""
    rules = {f.rule for f in result.findings if f.rule != "VP011"}
    if any(c.status == "failed" for c in result.coverage):
        rules.add("failed")
    if any(c.status == "not-proven" and c.attempts for c in result.coverage):
        rules.add("VP011")
    if result.unreachable and not any(a.status is not None for a in result.attempts):
        # the mutant proxy started and listens, yet answers no HTTP/1.1 at all (an outage)
        rules.add("unreachable")
    return tuple(sorted(rules))


MUTANT_TIMEOUT_S = 5.0


def mutant_options(options: ProbeOptions, operator: str, lead: str = "") -> ProbeOptions:
    """``options`` for the run of mutation ``operator``: a mutant is caught by one failure; an
    unanswered request is not tried a third time, nor waited for longer than MUTANT_TIMEOUT_S
    (the upstream answers in milliseconds: the stand-in, or vLLM without its engine). The cases
    of ``lead`` (default: the first check the operator says catches it) go first: the run stops
    sooner; every check still runs until one fails."""
    op = mutate.OPERATORS.get(operator)
    return replace(options, stop_on_failure=True, max_tries=min(options.max_tries, 2),
                   timeout=min(options.timeout, MUTANT_TIMEOUT_S),
                   lead_check=lead or (op.catches[0] if op else ""))


def mutants(inventory: Inventory, policy: Policy, proxies: Sequence[Proxy], options: ProbeOptions,
            keys_per_role: int = 1, only: Sequence[str] = (),
            say: Callable[[str], None] = lambda _m: None) -> tuple[list[ProxyRun], list[MutantRun]]:
    """The unmutated run per proxy, then one run per mutation operator (scanner.mutate), each
    on a freshly generated config with one weakening, the operator's first catching check
    leading; a mutant is caught when the probe exits non-zero with its default flags. A proxy
    whose unmutated run is not clean gets no mutants: nothing to compare to. ``only``: operator
    ids, names (without the proxy kind) or families."""
    baselines: list[ProxyRun] = []
    out: list[MutantRun] = []
    with loop(inventory, policy, proxies, keys_per_role) as (s, witness, written):
        for proxy, directory in written:
            try:
                base = proxy_run(s, proxy, directory, options, witness)
            except KeyboardInterrupt:
                stop.interrupted()
                break
            baselines.append(base)
            if stop.requested():
                break
            if base.result.deviations or base.result.unreachable:   # "not proven" alone is no deviation
                say(f"{proxy.name}: the unmutated config is not clean ({len(base.result.deviations)} "
                    "deviations from the plan): no mutation run")
                continue
            for op in selected(mutate.operators(proxy.kind), only):
                if op.needs == mutate.fleet.NEEDS:   # a fleet's operator: verify --replicas runs it
                    continue
                fast, where = mutant_options(options, op.id), directory.parent / f"{proxy.name}-{op.id}"
                out.append(interruptible(proxy.name, op, partial(mutant, s, proxy, op, where, fast, witness)))
                say(f"{proxy.name} {op.id}: {out[-1].status} {' '.join(out[-1].rules)}")
                if stop.requested():
                    break
            if stop.requested():
                break
    return baselines, out


def selected(operators: Sequence[mutate.Operator], only: Sequence[str]) -> list[mutate.Operator]:
    """The operators ``only`` names (ids, names or families; all without it), in the order it names
    them (the registry's order within one name), so ``--operator A --operator B`` runs A first."""
    if not only:
        return list(operators)
    def first(op: mutate.Operator) -> int:
        return min(i for i, o in enumerate(only) if o in (op.id, op.name, op.family))
    return sorted((op for op in operators if {op.id, op.name, op.family} & set(only)), key=first)


def interruptible(proxy: str, op: mutate.Operator, run_it: Callable[[], MutantRun]) -> MutantRun:
    """``run_it()``, the run of mutation ``op`` against ``proxy``; "interrupted" when Ctrl-C or
    SIGTERM cut it short (inside the probe's loop: a partial run, which would look caught; or
    outside it: a proxy starting or stopping): neither caught nor survived."""
    try:
        m = run_it()
    except KeyboardInterrupt:
        stop.interrupted()
        return MutantRun(proxy, op.id, op.title, "interrupted", family=op.family, catches=op.catches)
    if stop.requested() and m.status in ("caught", "survived"):
        return replace(m, status="interrupted", rules=(), checks=())
    return m


def mutant(s: Setup, proxy: Proxy, op: mutate.Operator, directory: Path, options: ProbeOptions,
           witness: str) -> MutantRun:
    """One mutation operator against ``proxy``: a fresh config, the weakening, the proxy's own
    validator, the proxy started and probed (stopping at the first failure)."""
    files = proxy.write(s.plan, directory)

    def run_of(status: MutantStatus, what: str, **more: Any) -> MutantRun:
        return MutantRun(proxy.name, op.id, op.title, status, what, family=op.family, catches=op.catches,
                         **more)

    try:
        what = op.apply(files, s.plan)
    except mutate.NotApplicable as exc:
        return run_of("not-applicable", str(exc))
    problem = proxy.validate(s.plan, directory)
    if problem:
        return run_of("invalid", f"{what}: {problem}")
    def rewrite(plan: Plan) -> None:   # the mutant again, on the port it moved to (start_checked)
        op.apply(proxy.write(plan, directory), plan)

    try:
        run_ = proxy_run(s, proxy, directory, options, witness, rewrite)
    except InternalError as exc:
        return run_of("invalid", f"{what}: {exc}")
    # caught only as a user would see it: probe's exit code with its default flags is not 0
    caught = run_.result.exit_code() != EXIT_OK
    return run_of("caught" if caught else "survived", what, rules=caught_by(run_.result),
                  seconds=run_.seconds, checks=tuple(dict.fromkeys(f.check for f in run_.result.deviations)))
