"""Run a probe: cases from the registered checks, sent bounded in concurrency, rate and
time, yielded as events; then each check judges its attempts into findings.

    async for event in run_probe(plan, target, credentials, vantages, options): ...
    result = summarize(events)        # or: result = probe(plan, target, ...)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from itertools import islice
from pathlib import Path

from scanner.plan.model import Plan
from scanner.probe.cases import Case
from scanner.probe.interface import (
    Attempt,
    AttemptDone,
    Credential,
    Event,
    FindingFound,
    Finished,
    ProbeOptions,
    ProbeResult,
    Started,
    Target,
    Vantage,
    severity_rank,
)
from scanner.probe.registry import Check, CheckContext, selected
from scanner.probe.send import Sender, skipped


class _Bucket:
    """Token bucket over the whole run: at most ``rate`` sends per second (0: unlimited)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self) -> None:
        if not self.interval:
            return
        async with self.lock:
            now = time.monotonic()
            at = max(now, self.next)
            self.next = at + self.interval
        if at > now:
            await asyncio.sleep(at - now)


def catalog_paths(directory: str | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(path, methods) of exact HTTP routes in the bundled catalogs; none if there are none."""
    from scanner.errors import PerimeterError
    from scanner.inventory import model

    if directory is None:
        try:
            from scanner.resources import data_file

            base = data_file("policies", "catalog")
        except PerimeterError:
            return ()
    else:
        base = Path(directory)
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


async def run_probe(plan: Plan, target: Target, credentials: Sequence[Credential],
                    vantages: Sequence[Vantage], options: ProbeOptions) -> AsyncIterator[Event]:
    """The probe as a stream of events: Started, AttemptDone..., FindingFound..., Finished."""
    t0 = time.monotonic()
    ctx = CheckContext(plan=plan, target=target, credentials=tuple(credentials),
                       vantages=tuple(vantages) or (Vantage(),), options=options,
                       catalog_paths=catalog_paths(options.catalog_dir))
    checks = selected(options.checks)
    cases = [(chk, c) for chk in checks for c in chk.generate(ctx)]
    yield Started(target=target.base_url, plan_digest=plan.digest, policy=plan.policy_name,
                  total=len(cases), vantages=tuple(v.name for v in ctx.vantages),
                  credentials=tuple((c.label, c.fingerprint) for c in ctx.credentials),
                  started_at=time.time())
    sender = Sender(target, options.timeout, options.transport_factory, options.client)
    results: dict[str, list[tuple[Case, Attempt]]] = {chk.id: [] for chk in checks}
    deadline = t0 + options.max_time
    sent = 0
    reason = ""
    try:
        reason = await _preflight(sender, ctx)
        if not reason:
            # one vantage at a time: a worker's pipelined chunk then shares one connection
            plain = sorted(((k, c) for k, c in cases if not c.burst), key=lambda kc: kc[1].vantage.name)
            bursts: dict[str, list[tuple[Check, Case]]] = {}
            for k, c in cases:
                if c.burst:
                    bursts.setdefault(c.burst, []).append((k, c))
            batches = [(plain, _Bucket(options.rate))] + [(b, _Bucket(0)) for b in bursts.values()]
            for batch, bucket in batches:
                stream = _execute(batch, sender, options.concurrency, bucket, deadline, options.pipeline)
                async for chk, case, attempt in stream:
                    results[chk.id].append((case, attempt))
                    sent += attempt.outcome != "skipped"
                    yield AttemptDone(attempt)
            done = sum(len(v) for v in results.values())
            if done < len(cases):
                reason = (f"--max-time {options.max_time:g}s exceeded: {len(cases) - done} of "
                          f"{len(cases)} cases not sent (partial results)")
            elif sent and not any(a.outcome not in ("error", "skipped")
                                  for v in results.values() for _c, a in v):
                reason = "nothing answered: every request failed"
    finally:
        await sender.aclose()
    for chk in checks:
        for finding in chk.judge(ctx, results[chk.id]):
            yield FindingFound(finding)
    yield Finished(elapsed_s=round(time.monotonic() - t0, 3), sent=sent, unreachable=bool(reason),
                   reason=reason)


async def _preflight(sender: Sender, ctx: CheckContext) -> str:
    """One request per vantage; a reason string if the target cannot be reached at all."""
    for vantage in ctx.vantages:
        case = Case("preflight", "GET", "/", "GET", "/", ctx.credentials[0], vantage, "deny")
        a = await sender.send(case)
        if a.outcome == "error":
            tls = a.error.startswith("tls")
            hint = " (check --ca-bundle; verification is never turned off)" if tls else ""
            return f"{ctx.target.base_url} from vantage {vantage.name}: {a.error}{hint}"
    return ""


async def _execute(batch: Sequence[tuple[Check, Case]], sender: Sender, concurrency: int,
                   bucket: _Bucket, deadline: float, depth: int = 1,
                   ) -> AsyncIterator[tuple[Check, Case, Attempt]]:
    """Send ``batch`` with ``concurrency`` workers (each pipelining up to ``depth`` requests on
    its connection); stop taking new cases at ``deadline``."""
    queue: asyncio.Queue[tuple[Check, Case, Attempt] | None] = asyncio.Queue()
    it = iter(batch)

    async def worker() -> None:
        try:
            while time.monotonic() < deadline:
                chunk = list(islice(it, depth))
                if not chunk:
                    return
                live = []
                for chk, case in chunk:
                    if case.skip:
                        await queue.put((chk, case, skipped(case, case.skip)))
                    else:
                        live.append((chk, case))
                for _ in live:
                    await bucket.take()
                if time.monotonic() >= deadline:
                    return
                attempts = await sender.send_many([c for _k, c in live])
                for (chk, case), attempt in zip(live, attempts, strict=True):
                    await queue.put((chk, case, attempt))
        finally:
            await queue.put(None)

    n = max(1, concurrency)
    tasks = [asyncio.create_task(worker()) for _ in range(n)]
    try:
        finished = 0
        while finished < n:
            item = await queue.get()
            if item is None:
                finished += 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def summarize(events: Iterable[Event]) -> ProbeResult:
    """Fold a run's events into one result (the writers' input)."""
    start: Started | None = None
    end: Finished | None = None
    attempts: list[Attempt] = []
    findings = []
    for e in events:
        if isinstance(e, Started):
            start = e
        elif isinstance(e, AttemptDone):
            attempts.append(e.attempt)
        elif isinstance(e, FindingFound):
            findings.append(e.finding)
        elif isinstance(e, Finished):
            end = e
    if start is None:
        raise ValueError("no Started event")
    return ProbeResult(
        target=start.target, plan_digest=start.plan_digest, policy=start.policy,
        vantages=start.vantages, credentials=start.credentials, attempts=tuple(attempts),
        findings=tuple(sorted(findings, key=lambda f: (severity_rank(f.severity), f.path, f.method, f.id))),
        elapsed_s=end.elapsed_s if end else 0.0,
        unreachable=end.unreachable if end else True,
        reason=end.reason if end else "the run did not finish",
    )


async def collect(stream: AsyncIterator[Event]) -> list[Event]:
    return [e async for e in stream]


def probe(plan: Plan, target: Target, credentials: Sequence[Credential], vantages: Sequence[Vantage],
          options: ProbeOptions) -> ProbeResult:
    """Synchronous convenience: run the probe and summarise it."""
    return summarize(asyncio.run(collect(run_probe(plan, target, credentials, vantages, options))))
