"""Load limits: rate and concurrency zones. The plan puts every allowed route with a rate limit in a bucket
family (:attr:`Decision.rate_zone`) and every route with a concurrency limit in a slot family
(:attr:`Decision.conn_zone`), each counted per principal or client address. A zone is
exercised on one of its routes (the *representative*): a burst that must meet a 429 for rate,
requests held open by the witness that must meet the refusal for concurrency.

Every other route of the zone (a *member*) is then proven to spend the same limiter, so that
a route whose own limit line is missing cannot hide behind its zone's proof: right after the
burst empties the bucket, the member's requests must meet the 429 for rate too (more of them
than the bucket can refill in the meantime); while the held requests fill the zone, the
member's request must be refused for concurrency.

Each limit is proven at its value, not only met: the rate burst's admitted requests are counted
against what the plan's bucket admits over the time they took (:func:`capacity`, the larger of
what the generated NGINX and Envoy buckets admit), and the requests the witness saw in flight at
once against the concurrency limit. A zone counted per principal (per client address on ``auth:
none``) must also give another principal (address) a bucket of its own: its requests to the same
route from the same vantage must pass while the first one's bucket is empty (slots full). Without
a second principal or address that subject is not proven, and says what to pass.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from scanner import reasons as R
from scanner.generate.envoy_model import bucket
from scanner.generate.nginx_model import enforced_rps
from scanner.plan import body as plan_body
from scanner.plan.model import Decision
from scanner.policy.model import Rate
from scanner.probe import coverage as cov
from scanner.probe.cases import Case
from scanner.probe.coverage import Subject
from scanner.probe.expect import expect
from scanner.probe.findings import make
from scanner.probe.interface import Attempt, Coverage, CoverageStatus, Credential, Finding, Vantage
from scanner.probe.pace import RATE_SHARE, lane_of
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

MAX_HOLD_S = 30.0
# The follow-ups per member are sized for a refill over this long: sent more slowly, a member
# without the limiter is reported not proven rather than failed.
FOLLOW_WINDOW_S = 1.0
# Without a witness the client holds its requests open (Case.dribble): a proxy that counts a request
# from its head on (NGINX's limit_conn) refuses limit + 1; one that counts only what it forwards
# (Envoy buffers the body before its router's circuit breaker) cannot be seen filling up.
UNCOUNTED = ("every request held open by its client was let through, and no zone of this run refused one: "
             "this proxy counts a request only once it is forwarded (Envoy buffers the body first); "
             "in flight at the upstream needs a witness (--witness)")
# ... so on a zone with a generation route the client holds streams instead: each request whole, its
# answer read until the hold ends (Case.stream_hold). A stream's head comes from the upstream, so an
# answer still coming when the client closes it was in flight there (Attempt.open_ms), whichever
# proxy counts it: more of them at once than the limit is the limit raised.
STREAM_PROMPT = "Count from one to one thousand, one number a line."
STREAM_ITEMS = {"messages": [{"role": "user", "content": STREAM_PROMPT}], "prompt": STREAM_PROMPT,
                "input": STREAM_PROMPT}
SHORT_STREAMS = ("{ended} of {n} streams were not being answered when the client's hold ended (answered "
                 "whole before it, or only after it: queued), and none was refused: a generation that "
                 "outlasts the hold needs a served model")

Assessment = tuple[CoverageStatus, str, int]
Assessed = tuple[Assessment, list[Attempt]]
Cell = tuple[Credential, Vantage]
OTHER_PRINCIPAL = "other principal"
OTHER_ADDRESS = "other address"
OTHER_SENDS = 2          # another principal's requests while the first one's bucket is empty
# NGINX counts a bucket in milliseconds of a clock cached once per event-loop turn: an admission
# may be counted this much late (and one request more for rounding).
CLOCK_S = 0.02


def capacity(rate: Rate, window: float) -> float:
    """The most requests a zone of ``rate`` admits within ``window`` seconds from a full bucket,
    on either generated proxy: NGINX's ``limit_req`` (burst + 1 at once, then the ``rate`` it is
    written with, scanner.generate.nginx_model.enforced_rps) and Envoy's ``local_ratelimit``
    bucket (scanner.generate.envoy_model.bucket: max_tokens at once, refilled continuously at
    tokens_per_fill per fill_interval, as measured on Envoy 1.40); plus CLOCK_S of the rate and
    one request of tolerance."""
    b = bucket(rate)
    envoy = b.max_tokens + b.tokens_per_fill / float(b.fill_interval.removesuffix("s")) * window
    nginx = rate.burst + 1 + enforced_rps(rate.rps) * window
    return max(envoy, nginx) + rate.rps * CLOCK_S + 1


def other_cell(ctx: CheckContext, d: Decision, cell: Cell) -> tuple[str, Cell | None, str]:
    """(subject suffix, the cell of another principal, or address on ``auth: none``, that ``d``
    admits on the same vantage (address: with the same credential), why there is none)."""
    if d.auth in ("key", "jwt", "cert"):
        kind = {"key": "role", "jwt": "token", "cert": "cert"}[d.auth]
        found = next(((c, v) for c, v in ctx.allowed_cells(d)
                      if v == cell[1] and c.kind == kind and c.label != cell[0].label
                      and (kind == "role" or c.principal != cell[0].principal)), None)
        return OTHER_PRINCIPAL, found, ("one principal only: give a second key the zone admits (--key "
                                        "ROLE=... twice, or a key of another role it admits)")
    mine = ctx.source_address(cell[1])
    found = next(((c, v) for c, v in ctx.allowed_cells(d)
                  if c == cell[0] and ctx.source_address(v) != mine), None)
    return OTHER_ADDRESS, found, "one address only: give a second --vantage inside its networks"


@dataclass(frozen=True)
class ZoneTrial:
    """One zone as a check exercises it: the zone's routes, the one it is tried on and with which
    cell (the zone itself, its kind and values, is the plan's: scanner.plan.zones.Zone)."""

    check: str
    name: str
    decisions: tuple[Decision, ...]
    rep: Decision | None
    cell: tuple[Credential, Vantage] | None

    @property
    def key(self) -> str:
        return f"{self.check} {self.name}"

    def subject(self) -> Subject:
        if self.rep is None:
            why = "no credential and vantage it admits"
            if all(x.state_changing for x in self.decisions):
                why = "every route in it changes state (--allow-state-changes against a staging upstream)"
            return Subject(self.key, "*", "*", why=why)
        return Subject(self.key, self.rep.method, self.rep.path)

    def members(self, ctx: CheckContext) -> list[tuple[Decision, Subject]]:
        """The zone's other routes, each with its subject (and why it cannot be checked, if so)."""
        rep, cell = self.rep, self.cell
        if rep is None or cell is None:
            return []
        out = []
        for m in self.decisions:
            if m is rep:
                continue
            why = ""
            if (m.rate_zone, m.conn_zone) != (rep.rate_zone, rep.conn_zone):
                why = (f"its other limit puts it in another bucket than {rep.method} {rep.path}, "
                       "the route the zone is exercised on")
            elif expect(m, cell[0], ctx.source_address(cell[1])).expected != "allow":
                why = (f"the credential and vantage the zone is exercised with ({cell[0].label}) "
                       "are not admitted")
            out.append((m, Subject(f"{self.key} via {m.method} {m.path}", m.method, m.path, why=why)))
        return out

    def other(self, ctx: CheckContext) -> tuple[Subject, Cell | None] | None:
        """The separate-bucket subject (another principal or address) and its cell; None when
        the zone cannot be exercised at all."""
        if self.rep is None or self.cell is None:
            return None
        suffix, cell, why = other_cell(ctx, self.rep, self.cell)
        return Subject(f"{self.key} {suffix}", self.rep.method, self.rep.path,
                       why="" if cell else why), cell


def zones(ctx: CheckContext, check: str, attr: str) -> list[ZoneTrial]:
    """The zones of ``attr`` ("rate_zone" or "conn_zone"), by name."""
    by: dict[str, list[Decision]] = {}
    for d in ctx.plan.allowed:
        name = getattr(d, attr)
        if name and d.kind == "http":
            by.setdefault(name, []).append(d)
    out = []
    for name, ds in sorted(by.items()):
        rep = representative(ctx, ds)
        cells = ctx.allowed_cells(rep) if rep else []
        # rate and concurrency take the same principal: its lane holds requests (phase 1), then
        # bursts (phase 2); another principal's lane then never meets them (the separate buckets)
        out.append(ZoneTrial(check, name, tuple(ds), rep, cells[0] if cells else None))
    return out


def representative(ctx: CheckContext, decisions: Sequence[Decision]) -> Decision | None:
    """The decision a zone is exercised on: not state-changing (unless allowed), GET first."""
    usable = [d for d in decisions if not d.state_changing or ctx.options.allow_state_changes]
    usable.sort(key=lambda d: (d.method != "GET", d.method not in ("POST", "GET"), d.path))
    return next((d for d in usable if ctx.allowed_cell(d)), None)


def stream_body(d: Decision) -> bytes | None:
    """A stream request ``d`` admits as sent that the upstream generates for: on a generation route
    (its model takes ``stream_options`` and the plan gives it an output budget) whose first item
    field is a conversation or a prompt, ``"stream": true`` and the output budget at its cap (the
    stream lasts as long as the plan lets a generation run); None when there is no such body."""
    budget = d.enforced_budget
    items = [f for f, _rule in d.envelope_spec.items if f in STREAM_ITEMS]
    if not d.envelope_spec.ask_usage or budget is None or not items or d.fields.mode("stream") != "allow" \
            or "stream" in d.fields.pins:
        return None
    doc: dict[str, object] = {items[0]: STREAM_ITEMS[items[0]], "stream": True}
    if "." not in budget.field and d.fields.mode(budget.field) == "allow":
        doc[budget.field] = budget.cap
    raw = json.dumps(doc).encode()
    judged = plan_body.judge(d, raw, salt="0" * 64 if d.salt else "")
    return None if judged.refused else raw


def phased(case: Case, phase: int, reasons: tuple[str, ...], burst: str = "", hold_ms: int = 0,
           hold_group: str = "") -> Case:
    """``case`` sent in ``phase`` of its lane: let through, or refused for one of ``reasons``."""
    return replace(case, phase=phase, expected="allow", reasons=reasons, burst=burst,  # type: ignore[arg-type]
                   hold_ms=hold_ms, hold_group=hold_group)


def by_subject(results: Results) -> dict[str, list[Attempt]]:
    out: dict[str, list[Attempt]] = {}
    for _c, a in results:
        out.setdefault(a.subject, []).append(a)
    return out


def answered_at(a: Attempt) -> float:
    return a.sent_at + a.latency_ms / 1000


def member_failure(attempts: Sequence[Attempt]) -> Assessment | None:
    """What a member's attempts say before the zone's proof is consulted (None: all reached)."""
    n = len(attempts)
    bad = next((a for a in attempts if a.verdict == "failed"), None)
    if bad is not None:
        return "failed", bad.why, n
    other = next((a for a in attempts if a.verdict != "proved" or a.outcome != "reached"), None)
    if other is not None:
        return "not-proven", other.why or "no answer", n
    return None


class ZoneCheck(BaseCheck):
    """A zone check's coverage and findings: one subject per zone, one per member route."""

    attr: ClassVar[str] = ""
    finding_title: ClassVar[str] = ""

    def layout(self, ctx: CheckContext) -> list[ZoneTrial]:
        return zones(ctx, self.id, self.attr)

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for z in self.layout(ctx):
            s = self.zone_subject(ctx, z)
            yield s
            for _m, m in z.members(ctx):
                yield m
            other = z.other(ctx)
            if other is not None:
                yield other[0] if not s.why else replace(other[0], why=s.why)

    def zone_subject(self, ctx: CheckContext, z: ZoneTrial) -> Subject:
        return z.subject()

    def assess_zone(self, ctx: CheckContext, z: ZoneTrial, attempts: list[Attempt]) -> Assessment:
        raise NotImplementedError

    def assess_member(self, ctx: CheckContext, z: ZoneTrial, zone: list[Attempt],
                      followers: list[Attempt], attempts: list[Attempt]) -> Assessment:
        raise NotImplementedError

    def assess_other(self, ctx: CheckContext, z: ZoneTrial, zone: list[Attempt],
                     attempts: list[Attempt]) -> Assessment:
        raise NotImplementedError

    def other_cases(self, ctx: CheckContext, z: ZoneTrial, phase: int, lead: Case, hold_ms: int = 0,
                    hold_group: str = "") -> Iterator[Case]:
        """Another principal's (address's) requests to the zone's route, sent in the first one's
        lane (``lead``: one of its cases) after its burst (phase 3) or held ones (phase 1)."""
        other = z.other(ctx)
        if other is None or other[1] is None or z.rep is None:
            return
        subject, (cred, vantage) = other[0], other[1]
        lane = lane_of(ctx.plan, lead, ctx.source_address(lead.vantage)).key
        n = 1 if phase == 1 else OTHER_SENDS
        for i in range(n):
            base = ctx.case(self.id, z.rep.method, z.rep.path, cred, vantage, "limit", subject=subject.key,
                            note=f"{cred.label} from {vantage.name}, while {lead.credential.label}'s "
                                 f"bucket is {'full' if phase == 1 else 'empty'}: {i + 1}/{n}")
            yield replace(phased(base, phase, (self.id,), burst=z.name if phase == 3 else "", hold_ms=hold_ms,
                                 hold_group=hold_group), lane=lane)

    def assessed(self, ctx: CheckContext, results: Results) -> dict[str, tuple[Assessment, list[Attempt]]]:
        """Subject key -> (assessment, attempts) for every subject with attempts."""
        by = by_subject(results)
        out: dict[str, tuple[Assessment, list[Attempt]]] = {}
        for z in self.layout(ctx):
            zone = by.get(z.key, [])
            if zone:
                out[z.key] = (self.assess_zone(ctx, z, zone), zone)
            members = [(s, by.get(s.key, [])) for _m, s in z.members(ctx)]
            followers = [a for _s, atts in members for a in atts]
            for s, atts in members:
                if atts:
                    out[s.key] = (self.assess_member(ctx, z, zone, followers, atts), atts)
            other = z.other(ctx)
            theirs = by.get(other[0].key, []) if other else []
            if other and theirs:
                out[other[0].key] = (self.assess_other(ctx, z, zone, theirs), theirs)
        return out

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        for key, ((status, why, _n), attempts) in self.assessed(ctx, results).items():
            if status == "failed":
                shared = key.endswith((OTHER_PRINCIPAL, OTHER_ADDRESS))
                title = f"{self.title.removesuffix('s')} zone shared" if shared else self.finding_title
                yield make("VP005", attempts, why, title=title, extra=self.id)

    def cover(self, ctx: CheckContext, subjects: Sequence[Subject], results: Results,
              interrupted: bool = False) -> Iterable[Coverage]:
        yield from cov.assessed(self.id, subjects, self.assessed(ctx, results), interrupted)


def refilled(rate: Rate, window: float) -> float:
    """The most requests a zone of ``rate`` admits within ``window`` seconds from an empty bucket,
    on either generated proxy (as :func:`capacity`, less what a full bucket holds at once), with
    FOLLOW_WINDOW_S of slack for the clocks and one request of tolerance."""
    return capacity(rate, max(window, 0.0) + FOLLOW_WINDOW_S) - capacity(rate, 0.0) + 1


def follow_ups(rps: float, burst: int, cap: int) -> int:
    """Requests per member after the burst: more than the bucket can give back meanwhile."""
    return min(cap, max(burst, math.ceil(rps * (1 + FOLLOW_WINDOW_S))) + 2)


@register
class RateBurst(ZoneCheck):
    """A bounded burst (burst + 2 x rps + 1 requests: the burst at once, the rest at 3 x rps) per
    rate zone must meet a 429 for rate, having admitted no more than :func:`capacity` over the
    time it took; right after it, each other route of the zone must meet it too, and another
    principal (address) must not."""

    id: ClassVar[str] = "rate"
    title: ClassVar[str] = "rate limits"
    attr: ClassVar[str] = "rate_zone"
    finding_title: ClassVar[str] = "rate above the plan"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for z in self.layout(ctx):
            d, cell = z.rep, z.cell
            rate = d.limits.rate if d else None
            if d is None or rate is None or cell is None:
                continue
            n = min(ctx.options.max_burst, rate.burst + math.ceil(rate.rps * 2) + 1)
            lead = None
            for i in range(n):
                base = ctx.case(self.id, d.method, d.path, cell[0], cell[1], "limit", subject=z.key,
                                note=f"burst {i + 1}/{n} (rps {rate.rps:g}, burst {rate.burst})")
                lead = phased(base, 2, ("rate",), burst=z.name)
                yield lead
            k = follow_ups(rate.rps, rate.burst, ctx.options.max_burst)
            for m, s in z.members(ctx):
                if s.why:
                    continue
                for i in range(k):
                    base = ctx.case(self.id, m.method, m.path, cell[0], cell[1], "limit", subject=s.key,
                                    note=f"after the burst on {d.method} {d.path}: {i + 1}/{k}")
                    yield phased(base, 3, ("rate",), burst=z.name)
            if lead is not None:
                yield from self.other_cases(ctx, z, 3, lead)

    def assess_zone(self, ctx: CheckContext, z: ZoneTrial, attempts: list[Attempt]) -> Assessment:
        answered = [a for a in attempts if a.status is not None]
        rate = z.rep.limits.rate if z.rep else None
        n = len(attempts)
        if rate is None or not answered:
            return "not-proven", "no answer to the burst", n
        admitted = [a for a in answered if a.outcome == "reached"]
        took = (max(answered_at(a) for a in admitted) - min(a.sent_at for a in admitted)) if admitted else 0.0
        most = capacity(rate, took)
        plan = f"rps {rate.rps:g} + burst {rate.burst} admit at most {most:.1f}"
        if len(admitted) > most:
            return "failed", (f"{len(admitted)} of {n} burst requests admitted within {took:.2f}s where "
                              f"{plan}: the rate or burst is above the plan, or not enforced (dry run, "
                              "shadow mode)"), n
        limited = [a for a in answered if R.proves("rate", a.status, a.reason)]
        if limited:
            return "proved", (f"{len(admitted)} admitted within {took:.2f}s ({plan}), {len(limited)} "
                              "refused for rate"), n
        bad = next((a for a in answered if a.verdict == "failed"), None)
        if bad is not None:
            return "failed", f"a burst request was refused for another reason: {bad.why}", n
        return "not-proven", (f"{len(admitted)} of {n} admitted within {took:.2f}s, no more than {plan}, and "
                              "none refused for rate: send faster (--concurrency)"), n

    def assess_other(self, ctx: CheckContext, z: ZoneTrial, zone: list[Attempt],
                     attempts: list[Attempt]) -> Assessment:
        n = len(attempts)
        who = "principal" if attempts[0].subject.endswith(OTHER_PRINCIPAL) else "address"
        if any(a.outcome == "reached" for a in attempts):
            return "proved", f"let through while the first {who}'s bucket was empty: a bucket of its own", n
        refused = [a for a in attempts if R.proves("rate", a.status, a.reason)]
        if refused and any(R.proves("rate", a.status, a.reason) for a in zone):
            return "failed", (f"all {n} refused for rate right after the first {who}'s burst emptied its "
                              f"bucket: the zone's bucket is shared, not one per {who}"), n
        return member_failure(attempts) or ("not-proven", "the burst did not empty the first bucket", n)

    def assess_member(self, ctx: CheckContext, z: ZoneTrial, zone: list[Attempt],
                      followers: list[Attempt], attempts: list[Attempt]) -> Assessment:
        n = len(attempts)
        assert z.rep is not None and z.rep.limits.rate is not None
        rate, where = z.rep.limits.rate, f"{z.rep.method} {z.rep.path}"
        refused = any(R.proves("rate", a.status, a.reason) for a in attempts)
        empty = [answered_at(a) for a in zone if R.proves("rate", a.status, a.reason)]
        if not empty:
            if refused:
                return "proved", f"refused for rate once the burst on {where} emptied the bucket", n
            return member_failure(attempts) or ("not-proven", f"the burst on {where} did not empty the "
                                                "bucket", n)
        window = max(answered_at(a) for a in followers) - max(empty)
        refill = refilled(rate, window)
        own = sum(a.outcome == "reached" for a in attempts)
        if own > refill:   # a refusal of its own bucket (a raised rate or burst) proves nothing
            return "failed", (f"{own} of its {n} requests passed right after the burst on {where} emptied "
                              f"the bucket, more than it refills in {window:.2f}s ({refill:.0f})"
                              f"{', before one was refused for rate' if refused else ''}: this route does "
                              "not spend the zone's bucket, or its own is larger"), n
        if refused:
            return "proved", (f"refused for rate once the burst on {where} emptied the bucket ({own} passed, "
                              f"at most {refill:.0f} refilled in {window:.2f}s)"), n
        early = member_failure(attempts)
        if early is not None:
            return early
        passed = sum(a.outcome == "reached" for a in followers)
        if passed > refill:
            return "failed", (f"all {n} requests passed right after the burst on {where} emptied the "
                              f"bucket ({passed} of the zone's follow-ups passed in {window:.2f}s; a refill "
                              f"gives at most {refill:.0f}): this route does not spend the zone's bucket"), n
        return "not-proven", (f"its {n} requests passed within what the bucket may refill in "
                              f"{window:.2f}s ({refill:.0f}): send faster (--concurrency)"), n


def hold_seconds(ctx: CheckContext, d: Decision, n: int) -> float:
    """How long each of ``n`` requests must be held so that all are in flight at once, given
    the pace the rate limit allows (scanner.probe.pace)."""
    rate = d.limits.rate
    if rate is None:
        return 1.5
    # the first is sent when the lane may have no burst left; it must outlast the last one sent
    return (n - 1) / (rate.rps * RATE_SHARE) + 1.5


@register
class Concurrency(ZoneCheck):
    """2 x limit + 2 requests held open at once by the witness must meet a 429 for concurrency
    (NGINX refuses past the limit; Envoy queues up to the limit more, then refuses), and no more
    than the limit may be in flight at once (the witness's ``held_ms``: a request Envoy queued
    arrives after the hold); while they are held, one request to each other route of the zone
    must be refused too, and another principal's (address's) one must not."""

    id: ClassVar[str] = "concurrency"
    title: ClassVar[str] = "concurrency limits"
    attr: ClassVar[str] = "conn_zone"
    finding_title: ClassVar[str] = "concurrency above the plan"

    def zone_subject(self, ctx: CheckContext, z: ZoneTrial) -> Subject:
        s, d = z.subject(), z.rep
        if d is not None and d.limits.concurrency:
            n = self.held(ctx, z)
            hold = hold_seconds(ctx, d, n)
            if hold > MAX_HOLD_S:
                return replace(s, why=f"its rate limit admits {n} requests at once only over {hold:.0f}s "
                                      f"(more than {MAX_HOLD_S:.0f}s)")
        return s

    def layout(self, ctx: CheckContext) -> list[ZoneTrial]:
        """Without a witness a zone with a generation route is exercised on it (the first by path
        whose streams the plan admits, :func:`stream_body`): the client holds streams there."""
        out = super().layout(ctx)
        return out if ctx.witness else [self._streamed(ctx, z) for z in out]

    @staticmethod
    def _streamed(ctx: CheckContext, z: ZoneTrial) -> ZoneTrial:
        found = sorted((d for d in z.decisions if (not d.state_changing or ctx.options.allow_state_changes)
                        and stream_body(d) is not None and ctx.allowed_cell(d)), key=lambda d: d.path)
        if not found or found[0] is z.rep:
            return z
        return replace(z, rep=found[0], cell=ctx.allowed_cells(found[0])[0])

    @staticmethod
    def streams(ctx: CheckContext, z: ZoneTrial) -> bytes | None:
        """The body of the streams the client holds on the zone's route (None: held bodies)."""
        return None if ctx.witness or z.rep is None else stream_body(z.rep)

    def held(self, ctx: CheckContext, z: ZoneTrial) -> int:
        """Requests in flight at once: the held ones and one per checkable member."""
        other = z.other(ctx)
        return self.on_rep(ctx, z) + sum(1 for _m, s in z.members(ctx) if not s.why) + \
            (1 if other is not None and other[1] is not None else 0)

    def on_rep(self, ctx: CheckContext, z: ZoneTrial) -> int:
        """Requests held on the zone's route: with a witness, or streams held by the client, 2 x
        limit + 2 (Envoy queues up to the limit more); else limit + 1 held by the client (a queued
        one is never forwarded)."""
        limit = (z.rep.limits.concurrency if z.rep else 0) or 0
        return 2 * limit + 2 if ctx.witness or self.streams(ctx, z) is not None else limit + 1

    def held_case(self, ctx: CheckContext, case: Case, z: ZoneTrial, hold_ms: int) -> Case:
        """``case`` held ``hold_ms`` by the witness, or without one by the client: on a zone with
        streams, the zone's route a stream read until then and its other routes and the other
        principal sent whole while the streams run; else its body's last byte sent only then (a
        GET gets ``{}``; the request is still vLLM's to answer)."""
        held = phased(case, 1, ("concurrency",), hold_ms=hold_ms, hold_group=z.key)
        if ctx.witness:
            return held
        streamed = self.streams(ctx, z)
        if streamed is not None:   # the zone's route: a stream; the others plain, while the streams run
            if z.rep is None or (case.path, case.subject) != (z.rep.path, z.key):
                return replace(held, hold_ms=0, hold_group="")
            headers = tuple((k, v) for k, v in held.headers if k.lower() != "content-type")
            return replace(held, body=streamed, json_body=True, as_sent=True, stream_hold=True,
                           headers=(*headers, ("Content-Type", "application/json")))
        if held.body is None:
            held = replace(held, body=b"{}", headers=(*held.headers, ("Content-Type", "application/json")))
        return replace(held, dribble=True)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for z in self.layout(ctx):
            d, cell = z.rep, z.cell
            if d is None or cell is None or not d.limits.concurrency:
                continue
            total = self.held(ctx, z)
            hold = hold_seconds(ctx, d, total)
            if hold > MAX_HOLD_S:
                continue
            n, hold_ms = self.on_rep(ctx, z), math.ceil(hold * 1000)
            by = ("" if ctx.witness else ", a stream held by the client" if self.streams(ctx, z)
                  else ", by the client")
            lead = None
            for i in range(n):
                base = ctx.case(self.id, d.method, d.path, cell[0], cell[1], "limit", subject=z.key,
                                note=f"held {i + 1}/{n} (concurrency {d.limits.concurrency}, "
                                     f"{hold:.1f}s{by})")
                lead = self.held_case(ctx, base, z, hold_ms)
                yield lead
            for m, s in z.members(ctx):
                if not s.why:   # after the held ones, in the same lane: the zone is full by then
                    base = ctx.case(self.id, m.method, m.path, cell[0], cell[1], "limit", subject=s.key,
                                    note=f"while {n} requests to {d.method} {d.path} are held")
                    yield self.held_case(ctx, base, z, hold_ms)
            if lead is not None:   # last: the first principal's slots are full by then
                for o in self.other_cases(ctx, z, 1, lead, hold_ms=hold_ms, hold_group=z.key):
                    yield o if ctx.witness else self.held_case(ctx, o, z, hold_ms)

    def in_flight(self, ctx: CheckContext, z: ZoneTrial, attempts: Sequence[Attempt]) -> int:
        """The first principal's requests to the zone's routes that the witness held at once."""
        subjects = {z.key, *(s.key for _m, s in z.members(ctx))}
        return sum(1 for a in attempts if a.subject in subjects and a.outcome == "reached"
                   and a.upstream is not None and a.upstream.held_ms > 0)

    def assessed(self, ctx: CheckContext, results: Results) -> dict[str, tuple[Assessment, list[Attempt]]]:
        out = super().assessed(ctx, results)
        every = [a for _c, a in results]
        if not ctx.witness:
            streamed = {z.key for z in self.layout(ctx) if self.streams(ctx, z) is not None}
            return self.uncounted(out, streamed, self.counts_held(results))
        for z in self.layout(ctx):
            limit = z.rep.limits.concurrency if z.rep else None
            if limit is None or z.key not in out:
                continue
            at_once = self.in_flight(ctx, z, every)
            if at_once > limit:
                _a, attempts = out[z.key]
                why = (f"{at_once} requests were in flight at once at the upstream (witness) where the "
                       f"plan allows {limit}: the limit is above the plan")
                out[z.key] = (("failed", why, len(attempts)), attempts)
        return out

    @staticmethod
    def counts_held(results: Results) -> bool:
        """Did this proxy count a request held open by its client: refuse one for concurrency on its
        head, before the client sent the body's last byte (NGINX's limit_conn)? A refusal after it
        shows nothing of held requests: Envoy, which counts a request once forwarded, refuses held
        bodies the client finished at once, more of them than the limit, under load."""
        return any(c.dribble and R.proves("concurrency", a.status, a.reason) and a.latency_ms < c.hold_ms
                   for c, a in results)

    @staticmethod
    def uncounted(out: dict[str, Assessed], streamed: Collection[str] = (),
                  counted: bool = False) -> dict[str, Assessed]:
        """Without a witness: a zone that let every request held open by the client through fails
        only when this run showed that the proxy counts such requests (``counted``:
        :meth:`counts_held`; a refused stream shows nothing of held bodies); else it is not proven
        (:data:`UNCOUNTED`). The subjects of a zone of ``streamed`` (streams held by the client)
        fail on the upstream's own evidence: left as judged."""
        def held(key: str) -> bool:   # a subject of a zone whose bodies the client held
            return not any(key == s or key.startswith(s + " ") for s in streamed)

        if counted:
            return out
        return {k: ((("not-proven", UNCOUNTED, a[0][2]), a[1]) if a[0][0] == "failed" and held(k) else a)
                for k, a in out.items()}

    @staticmethod
    def answering(streams: Sequence[Attempt], start: float, end: float) -> int:
        """How many of ``streams`` were being answered by the upstream from ``start`` to ``end``."""
        return sum(1 for a in streams if a.open_ms > 0 and answered_at(a) - a.open_ms / 1000 <= start
                   and answered_at(a) >= end)

    @staticmethod
    def answered_at_once(attempts: Sequence[Attempt]) -> int:
        """The most streams whose answers were coming from the upstream at the same moment: each
        from its head (closed at ``sent_at + latency_ms``, open ``open_ms`` before) to its close."""
        edges = sorted(e for a in attempts if a.open_ms > 0 for e in (
            (answered_at(a) - a.open_ms / 1000, 1), (answered_at(a), -1)))
        most = now = 0
        for _at, step in edges:   # a close sorts before an opening at the same instant
            now += step
            most = max(most, now)
        return most

    def assess_zone(self, ctx: CheckContext, z: ZoneTrial, attempts: list[Attempt]) -> Assessment:
        n = len(attempts)
        limited = [a for a in attempts if R.proves("concurrency", a.status, a.reason)]
        limit = (z.rep.limits.concurrency if z.rep else 0) or 0
        if self.streams(ctx, z) is not None:
            at_once = self.answered_at_once(attempts)
            if at_once > limit:
                return "failed", (f"{at_once} streams were being answered by the upstream at once (held "
                                  f"open by the client) where the plan allows {limit}: the limit is above "
                                  "the plan"), n
            if limited:
                return "proved", (f"{len(limited)} of {n} streams held by the client refused for concurrency "
                                  f"(at most {at_once} answered at once)"), n
            ended = sum(1 for a in attempts if a.outcome == "reached" and a.open_ms == 0)
            if ended:
                return "not-proven", SHORT_STREAMS.format(ended=ended, n=n), n
            other = next((a for a in attempts if a.verdict != "proved" or a.outcome != "reached"), None)
            return "not-proven", (other.why if other else "") or (
                f"at most {at_once} streams answered at once and none refused"), n
        if limited:
            return "proved", f"{len(limited)} of {n} held requests refused for concurrency", n
        if all(a.verdict == "proved" and a.outcome == "reached" for a in attempts):
            return "failed", f"all {n} requests held open at once were let through (none refused for "\
                             "concurrency)", n
        other = next((a for a in attempts if a.verdict != "proved"), attempts[0])
        return "not-proven", other.why or "no request was refused for concurrency", n

    def assess_member(self, ctx: CheckContext, z: ZoneTrial, zone: list[Attempt],
                      followers: list[Attempt], attempts: list[Attempt]) -> Assessment:
        n = len(attempts)
        where = f"{z.rep.method} {z.rep.path}" if z.rep else z.name
        if any(R.proves("concurrency", a.status, a.reason) for a in attempts):
            return "proved", f"refused for concurrency while the requests to {where} were held", n
        early = member_failure(attempts)
        if early is not None:
            return early
        limit = (z.rep.limits.concurrency if z.rep else 0) or 0
        if self.streams(ctx, z) is not None:   # let through: was the zone full all the while?
            if all(self.answering(zone, a.sent_at, answered_at(a)) >= limit for a in attempts):
                return "failed", (f"let through while {limit} streams to {where} were being answered (the "
                                  "zone full): this route does not count against the zone's limit"), n
            return "not-proven", f"the streams held on {where} did not fill the zone while it was sent", n
        if not any(R.proves("concurrency", a.status, a.reason) for a in zone):
            return "not-proven", f"the requests held on {where} did not fill the zone", n
        return "failed", (f"let through while the zone was full (requests held on {where} were refused "
                          "for concurrency): this route does not count against the zone's limit"), n

    def assess_other(self, ctx: CheckContext, z: ZoneTrial, zone: list[Attempt],
                     attempts: list[Attempt]) -> Assessment:
        n = len(attempts)
        who = "principal" if attempts[0].subject.endswith(OTHER_PRINCIPAL) else "address"
        if all(a.outcome == "reached" for a in attempts):
            return "proved", (f"let through while the first {who}'s requests filled its slots: slots of "
                              "its own"), n
        if any(R.proves("concurrency", a.status, a.reason) for a in attempts) and \
                any(R.proves("concurrency", a.status, a.reason) for a in zone):
            return "failed", (f"refused for concurrency while the first {who}'s requests were held: the "
                              f"zone's slots are shared, not counted per {who}"), n
        return member_failure(attempts) or ("not-proven", "the held requests did not fill the first slots", n)
