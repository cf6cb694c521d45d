"""Limits inside an allowed request: body size (over, and exactly at it), JSON caps (over, in
every encoding pydantic reads, and exactly at them), forbidden fields, the rate limit (a
burst that must meet 429) and the concurrency limit (requests held open by the witness)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import ClassVar

from scanner import reasons as R
from scanner.plan.model import BODY_METHODS, Decision
from scanner.probe import coverage as cov
from scanner.probe import safe
from scanner.probe.cases import Case, concrete, with_query
from scanner.probe.coverage import Subject, na
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Coverage, CoverageStatus, Credential, Finding, Vantage
from scanner.probe.pace import RATE_SHARE
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

MAX_HOLD_S = 30.0
STATE_CHANGING = ("state-changing: not sent (--allow-state-changes against a staging upstream or "
                  "the stand-in)")


def padded_json(size: int, fields: Mapping[str, object] | None = None) -> bytes:
    """A JSON object of exactly ``size`` bytes holding ``fields`` and a padding string; a run
    of spaces when ``size`` is too small for JSON (body-size checks only)."""
    head = json.dumps({**(fields or {}), "pad": ""}, separators=(",", ":")).encode()
    if size < len(head):
        return b" " * size
    return head[:-2] + b"a" * (size - len(head)) + head[-2:]


def cap_bodies(name: str, cap: int) -> list[tuple[str, bytes]]:
    """Over-cap bodies: the plain integer first, then encodings pydantic also reads as a number."""
    over = cap + 1
    escaped = "".join(f"\\u{ord(c):04x}" for c in name)
    return [
        (f"{name}={over} (int)", json.dumps({name: over}).encode()),
        (f'{name}="{over}" (string)', json.dumps({name: str(over)}).encode()),
        (f"{name}={cap + 0.5} (float)", json.dumps({name: cap + 0.5}).encode()),
        (f"{name}=1e9", f'{{"{name}": 1e9}}'.encode()),
        (f"{name} with \\u-escaped key", f'{{"{escaped}": {over}}}'.encode()),
        (f"duplicate {name} key", f'{{"{name}": 1, "{name}": {over}}}'.encode()),
    ]


def body_decisions(ctx: CheckContext) -> list[Decision]:
    return [d for d in ctx.plan.allowed if d.method in BODY_METHODS and d.kind == "http"]


def carrier(ctx: CheckContext, d: Decision) -> tuple[str, dict[str, object]] | None:
    """(query, fields) every body of ``d`` is built on: nothing for a route that does not change
    state (or when state changes are allowed), else its non-acting request; None: cannot send."""
    if not d.state_changing or ctx.options.allow_state_changes:
        return "", {}
    return safe.carrier(d.method, d.path)


@register
class Limits(BaseCheck):
    """Body size just over body_bytes (Content-Length and chunked) and exactly at it; JSON caps
    just over the cap and exactly at it; forbidden fields rejected or stripped."""

    id: ClassVar[str] = "limits"
    title: ClassVar[str] = "body size, JSON caps, forbidden fields"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        fields = ctx.plan.field_modes()
        for d in body_decisions(ctx):
            where = f"{d.method} {d.path}"
            blocked = carrier(ctx, d) is None
            why = STATE_CHANGING if blocked else ("" if ctx.allowed_cell(d) else
                                                  "no credential and vantage the plan admits here")
            lim = d.limits
            if lim.body_bytes is None:
                yield na(f"body-size {where}", "no body_bytes limit in the plan", d.method, d.path)
            elif lim.body_bytes + 1 > ctx.options.max_body_bytes:
                yield Subject(f"body-size {where}", d.method, d.path,
                              why=f"body_bytes {lim.body_bytes} is over the probe's --max-body-bytes")
            else:
                yield Subject(f"body-size {where}", d.method, d.path, why=why)
            for name in sorted(lim.json_caps):
                yield Subject(f"json-cap {name} {where}", d.method, d.path, why=why)
            if fields:
                key = f"fields {where}"
                if set(fields.values()) == {"strip"} and not ctx.witness:
                    yield na(key, "a stripped field is visible only to a witness upstream", d.method, d.path)
                else:
                    yield Subject(key, d.method, d.path, why=why)
            if lim.json_caps or lim.body_bytes is not None:
                yield Subject(f"at-limits {where}", d.method, d.path, why=why)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        fields = ctx.plan.field_modes()
        variants_done: set[tuple[tuple[str, int], ...]] = set()
        names = sorted(f for f, mode in fields.items() if mode == "reject" or ctx.witness)
        for n, d in enumerate(body_decisions(ctx)):
            cells = ctx.allowed_cells(d)
            carry = carrier(ctx, d)
            if not cells or carry is None:
                continue
            query, base = carry
            out = _Out(self.id, d, _Spread(cells), query, base)
            caps_key = tuple(sorted(d.limits.json_caps.items()))
            encodings = caps_key not in variants_done and not base
            variants_done.add(caps_key)
            yield from self._body(ctx, d, out)
            yield from self._caps(d, out, encodings)
            # every field on the first route, then one per route in turn: a field check that
            # is gone everywhere shows on the first, one gone from a route on that route
            yield from self._fields(out, fields, names if n == 0 else names[n % len(names):][:1])

    def _body(self, ctx: CheckContext, d: Decision, out: _Out) -> Iterator[Case]:
        limit = d.limits.body_bytes
        caps = dict(sorted(d.limits.json_caps.items()))
        if limit is not None and limit + 1 <= ctx.options.max_body_bytes:
            over = padded_json(limit + 1, out.base)
            for chunked in (False, True):
                how = "chunked" if chunked else "Content-Length"
                case = out.case("body-size", "deny", ("body-too-large",), over,
                                f"body {limit + 1} bytes > body_bytes {limit} ({how})", chunked)
                # a declared length over the limit is refused on the request head (NGINX before
                # its limiters, Envoy's Lua before its rate filter); a chunked body only once read
                yield replace(case, before_limits=not chunked)
        if caps or limit is not None:
            size = limit if limit is not None and limit <= ctx.options.max_body_bytes else 0
            fields = {**out.base, **caps}
            at = padded_json(size, fields) if size else out.json(caps)
            if size and len(at) != size:    # too small to hold the caps: two separate cases
                yield out.case("at-limits", "allow", (), padded_json(size, out.base),
                               f"body exactly body_bytes {size}")
                at = out.json(caps)
            listed = ", ".join(f"{k}={v}" for k, v in caps.items())
            note = f"exactly at every cap ({listed})" if caps else ""
            note = " and ".join(x for x in (note, f"body exactly {len(at)} bytes" if size else "") if x)
            yield out.case("at-limits", "allow", (), at, note)

    def _caps(self, d: Decision, out: _Out, encodings: bool) -> Iterator[Case]:
        for i, (name, cap) in enumerate(sorted(d.limits.json_caps.items())):
            bodies = cap_bodies(name, cap) if not out.base else [(f"{name}={cap + 1} (int)",
                                                                 out.json({name: cap + 1}))]
            for j, (note, body) in enumerate(bodies if (encodings and i == 0) else bodies[:1]):
                # another encoding may also be refused as malformed JSON: still a refusal
                reasons = (R.token("json-cap", name),) if j == 0 else (R.token("json-cap", name), "bad-json")
                yield out.case(f"json-cap {name}", "deny", reasons, body, f"json cap: {note} > {cap}")

    def _fields(self, out: _Out, fields: dict[str, str], names: Sequence[str]) -> Iterator[Case]:
        for name in names:
            body = out.json({name: "probe-x1" if name != "chat_template_kwargs" else {}})
            if fields[name] == "reject":
                yield out.case("fields", "deny", (R.token("forbidden-field", name),), body,
                               f"forbidden field {name}")
            else:
                yield out.case("fields", "allow", (), body, f"field {name} to be stripped")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = []
        for c, a in results:
            if a.verdict != "failed":
                continue
            if c.expected == "allow" and a.outcome != "reached":
                flagged.append(("VP006", a))      # refused at (not over) a limit: over-blocking
            elif c.expected == "deny":
                flagged.append(("VP005", a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = "; ".join(a.note for a in attempts[:8])
            if rule == "VP006":
                yield make(rule, attempts, f"Requests exactly at the plan's limits were refused: {notes}.",
                           title="request at the plan's limits refused", extra="limits")
            else:
                yield make(rule, attempts, f"Requests over the plan's limits reached the upstream: {notes}.",
                           extra="limits")


class _Spread:
    """Round-robin over the cells a decision admits: different principals and addresses are
    different limiter buckets, so their cases run in parallel."""

    def __init__(self, cells: Sequence[tuple[Credential, Vantage]]) -> None:
        self.cells, self.i = list(cells), 0

    def next(self) -> tuple[Credential, Vantage]:
        cell = self.cells[self.i % len(self.cells)]
        self.i += 1
        return cell


class _Out:
    """The cases of one decision: spread over its cells, built on its carrier (query, fields)."""

    def __init__(self, check: str, d: Decision, spread: _Spread, query: str,
                 base: dict[str, object]) -> None:
        self.check, self.d, self.spread, self.query, self.base = check, d, spread, query, base

    def json(self, fields: Mapping[str, object]) -> bytes:
        return json.dumps({**self.base, **fields}).encode()

    def case(self, aspect: str, expected: str, reasons: tuple[str, ...], body: bytes, note: str,
             chunked: bool = False) -> Case:
        d = self.d
        cred, vantage = self.spread.next()
        return Case(self.check, d.method, d.path, d.method, with_query(concrete(d.path), self.query), cred,
                    vantage, expected, reasons, f"{aspect} {d.method} {d.path}",  # type: ignore[arg-type]
                    body=body, chunked=chunked, role="limit", json_body=True,
                    state_changing=d.state_changing, note=note)


def _representative(ctx: CheckContext, decisions: Sequence[Decision]) -> Decision | None:
    """The decision a limit is exercised on: not state-changing (unless allowed), GET first."""
    usable = [d for d in decisions if not d.state_changing or ctx.options.allow_state_changes]
    usable.sort(key=lambda d: (d.method != "GET", d.method not in ("POST", "GET"), d.path))
    return next((d for d in usable if ctx.allowed_cell(d)), None)


def _zones(ctx: CheckContext, attr: str) -> dict[str, list[Decision]]:
    out: dict[str, list[Decision]] = {}
    for d in ctx.plan.allowed:
        zone = getattr(d, attr)
        if zone and d.kind == "http":
            out.setdefault(zone, []).append(d)
    return dict(sorted(out.items()))


def _zone_subject(ctx: CheckContext, check: str, zone: str, decisions: Sequence[Decision],
                  extra_why: str = "") -> Subject:
    d = _representative(ctx, decisions)
    if d is None:
        why = ("every route in it changes state (--allow-state-changes against a staging upstream)"
               if all(x.state_changing for x in decisions) else "no credential and vantage it admits")
        return Subject(f"{check} {zone}", "*", "*", why=why)
    return Subject(f"{check} {zone}", d.method, d.path, why=extra_why)


@register
class RateBurst(BaseCheck):
    """A bounded burst (burst + 2 x rps + 1 requests) per rate zone must meet a 429 for rate."""

    id: ClassVar[str] = "rate"
    title: ClassVar[str] = "rate limits"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for zone, ds in _zones(ctx, "rate_zone").items():
            yield _zone_subject(ctx, self.id, zone, ds)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for zone, ds in _zones(ctx, "rate_zone").items():
            d = _representative(ctx, ds)
            rate = d.limits.rate if d else None
            if d is None or rate is None:
                continue
            cell = ctx.allowed_cell(d)
            assert cell is not None
            n = min(ctx.options.max_burst, rate.burst + math.ceil(rate.rps * 2) + 1)
            for i in range(n):
                base = ctx.case(self.id, d.method, d.path, cell[0], cell[1], "limit",
                                subject=f"{self.id} {zone}", note=f"burst {i + 1}/{n} (rps {rate.rps:g}, "
                                f"burst {rate.burst})")
                yield _phase(base, 2, ("rate",), burst=zone)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        for attempts in _by_subject(results).values():
            status, why, _n = self._assess(ctx, attempts)
            if status == "failed":
                yield make("VP005", attempts, why, title="rate limit not enforced", extra="rate")

    def cover(self, ctx: CheckContext, subjects: Sequence[Subject], results: Results,
              interrupted: bool = False) -> Iterable[Coverage]:
        by = _by_subject(results)
        for s in subjects:
            attempts = by.get(s.key, [])
            if not attempts:
                yield cov.of_attempts(self.id, s, [], interrupted)
                continue
            yield cov.status_of(self.id, s, *self._assess(ctx, attempts))

    def _assess(self, ctx: CheckContext, attempts: list[Attempt]) -> tuple[CoverageStatus, str, int]:
        answered = [a for a in attempts if a.status is not None]
        d = ctx.decision(attempts[0].method, attempts[0].path)
        rate = d.limits.rate if d else None
        n = len(attempts)
        if rate is None or not answered:
            return "not-proven", "no answer to the burst", n
        limited = [a for a in answered if R.proves("rate", a.status, a.reason)]
        if limited:
            return "proved", f"{len(limited)} of {n} refused for rate", n
        if any(a.verdict == "failed" for a in answered):
            bad = next(a for a in answered if a.verdict == "failed")
            return "failed", f"a burst request was refused for another reason: {bad.why}", n
        took = max(a.sent_at + a.latency_ms / 1000 for a in answered) - min(a.sent_at for a in answered)
        capacity = rate.burst + rate.rps * took
        if len(answered) > capacity + 1:
            return "failed", (f"{len(answered)} requests in {took:.2f}s (rps {rate.rps:g}, burst "
                              f"{rate.burst}: at most {capacity:.0f} allowed) met no 429 for rate"), n
        return "not-proven", (f"{len(answered)} requests took {took:.2f}s, within what rps {rate.rps:g} + "
                              f"burst {rate.burst} allows ({capacity:.0f}): raise --concurrency"), n


def _phase(case: Case, phase: int, reasons: tuple[str, ...], burst: str = "", hold_ms: int = 0) -> Case:
    return replace(case, phase=phase, expected="allow", reasons=reasons, burst=burst,  # type: ignore[arg-type]
                   hold_ms=hold_ms)


def _by_subject(results: Results) -> dict[str, list[Attempt]]:
    out: dict[str, list[Attempt]] = {}
    for _c, a in results:
        out.setdefault(a.subject, []).append(a)
    return out


def hold_seconds(ctx: CheckContext, d: Decision, n: int) -> float:
    """How long each of ``n`` requests must be held so that all are in flight at once, given
    the pace the rate limit allows (scanner.probe.pace)."""
    rate = d.limits.rate
    if rate is None:
        return 1.5
    # the first is sent when the lane may have no burst left; it must outlast the last one sent
    return (n - 1) / (rate.rps * RATE_SHARE) + 1.5


@register
class Concurrency(BaseCheck):
    """2 x limit + 2 requests held open at once by the witness must meet a 429 for concurrency
    (NGINX refuses past the limit; Envoy queues up to the limit more, then refuses)."""

    id: ClassVar[str] = "concurrency"
    title: ClassVar[str] = "concurrency limits"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for zone, ds in _zones(ctx, "conn_zone").items():
            if not ctx.witness:
                yield na(f"{self.id} {zone}", "holding requests open needs a witness upstream "
                         "(verify, or --witness with the stand-in)")
                continue
            s = _zone_subject(ctx, self.id, zone, ds)
            d = ctx.decision(s.method, s.path)
            if d is not None and d.limits.concurrency:
                hold = hold_seconds(ctx, d, 2 * d.limits.concurrency + 2)
                if hold > MAX_HOLD_S:
                    n = 2 * d.limits.concurrency + 2
                    s = Subject(s.key, s.method, s.path, why=f"its rate limit admits {n} requests at once "
                                f"only over {hold:.0f}s (more than {MAX_HOLD_S:.0f}s)")
            yield s

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        if not ctx.witness:
            return
        for zone, ds in _zones(ctx, "conn_zone").items():
            d = _representative(ctx, ds)
            if d is None or not d.limits.concurrency:
                continue
            n = 2 * d.limits.concurrency + 2
            hold = hold_seconds(ctx, d, n)
            cells = ctx.allowed_cells(d)
            if hold > MAX_HOLD_S or not cells:
                continue
            cell = cells[-1]   # another principal than the rate burst's, when there are several: in parallel
            for i in range(n):
                base = ctx.case(self.id, d.method, d.path, cell[0], cell[1], "limit",
                                subject=f"{self.id} {zone}",
                                note=f"held {i + 1}/{n} (concurrency {d.limits.concurrency}, {hold:.1f}s)")
                yield _phase(base, 1, ("concurrency",), hold_ms=math.ceil(hold * 1000))

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        for attempts in _by_subject(results).values():
            status, why, _n = self._assess(attempts)
            if status == "failed":
                yield make("VP005", attempts, why, title="concurrency limit not enforced",
                           extra="concurrency")

    def cover(self, ctx: CheckContext, subjects: Sequence[Subject], results: Results,
              interrupted: bool = False) -> Iterable[Coverage]:
        by = _by_subject(results)
        for s in subjects:
            attempts = by.get(s.key, [])
            if not s.applies or not attempts:
                yield from cov.generic(self.id, [s], [], interrupted)
                continue
            yield cov.status_of(self.id, s, *self._assess(attempts))

    def _assess(self, attempts: list[Attempt]) -> tuple[CoverageStatus, str, int]:
        n = len(attempts)
        limited = [a for a in attempts if R.proves("concurrency", a.status, a.reason)]
        if limited:
            return "proved", f"{len(limited)} of {n} held requests refused for concurrency", n
        if all(a.verdict == "proved" and a.outcome == "reached" for a in attempts):
            return "failed", f"all {n} requests held open at once were let through (none refused for "\
                             "concurrency)", n
        other = next((a for a in attempts if a.verdict != "proved"), attempts[0])
        return "not-proven", other.why or "no request was refused for concurrency", n
