"""Limits inside an allowed request: body size (over, and exactly at it), JSON caps (over, in
every encoding pydantic reads, and exactly at them), forbidden fields. (Rate and concurrency
limits: scanner.probe.checks.load.)

With a witness, a request allowed at the limits is proven only if the upstream received its
body as sent, less the fields the policy strips (and, on a salted route, with the sender's
cache_salt written in): a stripped field is otherwise invisible."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from scanner import reasons as R
from scanner.plan import body as plan_body
from scanner.plan.body import forwarded
from scanner.plan.model import BODY_METHODS, Decision
from scanner.policy.media import MEDIA_KEYS
from scanner.policy.salt import salt as salt_of
from scanner.probe import safe
from scanner.probe.cases import Case, concrete, with_query
from scanner.probe.coverage import Subject, na
from scanner.probe.findings import group, make
from scanner.probe.interface import (
    Attempt,
    Credential,
    Finding,
    Vantage,
    Verdict,
    WitnessRecord,
)
from scanner.probe.registry import BaseCheck, CheckContext, Results, register
from scanner.probe.token_pace import light_body

STATE_CHANGING = ("state-changing: not sent (--allow-state-changes against a staging upstream or "
                  "the stand-in)")


def nested(fields: Mapping[str, object]) -> dict[str, object]:
    """``fields`` with each dotted key (a nested position, ``sampling_params.n``) written as members
    of objects (``{"sampling_params": {"n": ...}}``), merged into an object already there; no
    request field's name holds a dot."""
    out: dict[str, object] = {}
    for key, value in fields.items():
        names = key.split(".")
        where = out
        for name in names[:-1]:
            inner = where.get(name)
            where[name] = dict(inner) if isinstance(inner, dict) else {}
            where = where[name]  # type: ignore[assignment]
        where[names[-1]] = value
    return out


def padded_json(size: int, fields: Mapping[str, object] | None = None, pad: str = "pad") -> bytes:
    """A JSON object of exactly ``size`` bytes holding ``fields`` (dotted keys nested, :func:`nested`)
    and a padding string in the field ``pad``; a run of spaces when ``size`` is too small for JSON
    (body-size checks only)."""
    head = json.dumps(nested({**(fields or {}), pad: ""}), separators=(",", ":")).encode()
    if size < len(head):
        return b" " * size
    return head[:-2] + b"a" * (size - len(head)) + head[-2:]


def pad_field(d: Decision) -> str:
    """A field the route's rules let through as sent (no cap, no budget), to pad bodies with:
    with ``unknown: reject`` an unnamed one would be refused for its name, not its size."""
    budget = set(d.budget.fields) if d.budget else set()
    for name in ("pad", "user", "safety_identifier", *d.fields.names("allow")):
        if d.fields.mode(name) == "allow" and name not in d.limits.json_caps and name not in budget:
            return name
    return "pad"


def multipliers(d: Decision) -> list[tuple[str, Callable[[int], dict[str, object]]]]:
    """The ways a body asks ``d`` for k sequences, one per multiplier its envelope reads
    (scanner/plan/envelope.py) that its rules let through: (name, k -> the fields). Each makes
    scanner.plan.body.envelope count exactly k sequences (with no other multiplier in the body)."""
    spec, rules = d.envelope_spec, d.fields
    out: list[tuple[str, Callable[[int], dict[str, object]]]] = []

    def ok(*names: str) -> bool:   # let through as sent (a media key would be judged as media);
        names = tuple(n.split(".")[0] for n in names)   # a nested position: its top-level field
        return all(rules.mode(n) == "allow" and n not in rules.pins
                   and not (d.media.active and n in MEDIA_KEYS) for n in names)
    for name in spec.per_item:
        if ok(name):
            out.append((name, functools.partial(_count_field, name)))
    for name, _rule in spec.items:
        if ok(name):
            item: object = ["a"] if name == "messages" else "a"
            out.append((f"{name} list", functools.partial(_list_field, name, item)))
    for a, b in spec.pairs:
        if ok(a, b):
            out.append((f"{a}:{b} pairs", functools.partial(_pair_fields, a, b)))
    return out


def _count_field(name: str, k: int) -> dict[str, object]:
    return {name: k}


def _list_field(name: str, item: object, k: int) -> dict[str, object]:
    return {name: [item] * k}


def _pair_fields(a: str, b: str, k: int) -> dict[str, object]:
    return {a: "q", b: ["a"] * k}


def combined(d: Decision, k: int) -> dict[str, object]:
    """Every multiplier of ``d`` at once, each asking for as many sequences as its caps let, at
    most ``k``: the most work one body admitted by the route's other caps can ask for."""
    out: dict[str, object] = {}
    for name, fields in multipliers(d):
        out.update(fields(max(1, min(most_sequences(d, name), k))))
    return out


def ceiling_sequences(d: Decision) -> int:
    """The most sequences a body within the route's other caps asks for, as the plan counts them
    (scanner.plan.body.envelope of every multiplier at once, each bounded by max_sequences + 1)."""
    k = (d.limits.max_sequences or 1 << 10) + 1
    return plan_body.envelope(d, json.dumps(nested(combined(d, k))).encode()).sequences


def ceiling_tokens(d: Decision, max_body_bytes: int) -> int:
    """An upper bound of the envelope a body within the route's other limits can have: its most
    sequences x the most output per sequence + its largest body."""
    lim, budget = d.limits, d.budget
    sequences = min(lim.max_sequences or 1 << 62, ceiling_sequences(d))
    output = max(budget.cap, budget.rest) if budget else 0
    return sequences * output + min(lim.body_bytes or max_body_bytes, max_body_bytes)


def base_of(ctx: CheckContext, d: Decision) -> dict[str, object]:
    """The fields every body of ``d`` is built on (its carrier, its budget when absent ones are
    refused): as :meth:`LimitsCheck.generate` builds them."""
    carry = carrier(ctx, d)
    base = dict(carry[1]) if carry else {}
    budget = d.budget
    if budget is not None and budget.when_absent == "reject":
        base[budget.field] = budget.cap
    return base


def most_sequences(d: Decision, name: str) -> int:
    """The most sequences multiplier ``name`` may ask for on ``d`` (its JSON cap, its count cap)."""
    field_name = name.split(" ")[0].split(":")[-1]
    caps = [c for c in (dict(d.cap_paths).get(field_name), d.fields.counts.get(field_name)) if c is not None]
    return min(caps) if caps else 1 << 20


def tokens_body(d: Decision, tokens: int, base: Mapping[str, object], max_bytes: int,
                shape: tuple[str, Callable[[int], dict[str, object]]] | None = None) -> bytes | None:
    """A JSON body whose envelope on ``d`` is exactly ``tokens`` (sequences x output budget +
    bytes), within its caps and ``max_bytes``: as many sequences as ``shape`` (a multiplier, else
    the first one the route has) may ask for, the output budget as high as its caps let, the rest
    padding; None when no such body exists."""
    budget = d.budget
    first = budget.fields[0] if budget else ""
    top = min(budget.cap, dict(d.cap_paths).get(first, budget.cap)) if budget else 0
    shapes = [shape] if shape else multipliers(d)[:1]
    name, fields = shapes[0] if shapes else ("", lambda k: {})
    most = min(d.limits.max_sequences or 1 << 20, most_sequences(d, name) if name else 1, 64)
    for k in range(most, 0, -1):
        extra = {**base, **(fields(k) if k > 1 or not name else {})}
        head = len(json.dumps(nested({**extra, first: top, pad_field(d): ""}), separators=(",", ":")))
        per = max(0, min(top, (tokens - head) // k)) if budget else 0
        if budget:
            extra[first] = per
        for size in range(max(1, tokens - k * per - 4), tokens - k * per + 4):
            if size > max_bytes:
                break
            body = padded_json(size, extra, pad_field(d))
            if body[:1] == b"{" and plan_body.token_cost(d, body) == tokens:
                return body
        if budget and 0 < per < top:
            break   # fewer sequences cannot reach more tokens within the caps (none: a smaller head may)
    return None


def cap_bodies(name: str, cap: int) -> list[tuple[str, bytes]]:
    """Over-cap bodies: the plain integer first, then encodings pydantic also reads as a number
    (its lax reading, scanner.plan.vllm_json.vllm_int: sign, Unicode whitespace, single
    underscores, leading zeros, a fraction of zeros)."""
    over = cap + 1
    escaped = "".join(f"\\u{ord(c):04x}" for c in name)
    spaced = f' +{"_".join(str(over))} '
    return [
        (f"{name}={over} (int)", json.dumps({name: over}).encode()),
        (f'{name}="{over}" (string)', json.dumps({name: str(over)}).encode()),
        (f"{name}={cap + 0.5} (float)", json.dumps({name: cap + 0.5}).encode()),
        (f"{name}=1e9", f'{{"{name}": 1e9}}'.encode()),
        (f"{name} with \\u-escaped key", f'{{"{escaped}": {over}}}'.encode()),
        (f"duplicate {name} key", f'{{"{name}": 1, "{name}": {over}}}'.encode()),
        (f'{name}="{spaced}" (string)', json.dumps({name: spaced}).encode()),
        (f'{name}="00{over}.000" (string)', json.dumps({name: f"00{over}.000"}).encode()),
        (f'{name}="\\u3000{over}\\u00a0" (string)', json.dumps({name: f"\u3000{over}\u00a0"}).encode()),
    ]


# Content types vLLM's FastAPI reads as JSON (scanner.plan.vllm_json.reads_json) that a perimeter
# could take for a form or for no JSON at all: an over-cap body under each is refused too.
JSON_TYPES: tuple[str, ...] = ("application/x-www-form-urlencoded x+json", "application/vnd.api+json")


def body_decisions(ctx: CheckContext) -> list[Decision]:
    return [d for d in ctx.plan.allowed if d.method in BODY_METHODS and d.kind == "http"]


def carrier(ctx: CheckContext, d: Decision) -> tuple[str, dict[str, object]] | None:
    """(query, fields) every body of ``d`` is built on: nothing for a route that does not change
    state (or when state changes are allowed), else its non-acting request; None: cannot send."""
    if not d.state_changing or ctx.options.allow_state_changes:
        return "", {}
    return safe.carrier(d.method, d.path)


# Aspects whose bodies are the fact proven (sizes, caps and budgets at their value): sent as built,
# never lightened on a token budget (scanner/probe/token_pace.py)
AS_SENT = frozenset({"budget", "at-limits", "body-size", "envelope-tokens", "envelope-sequences"})

# A field no policy names (nor any vLLM request model): how the probe sends an unknown field.
UNKNOWN_FIELD = "vp_probe_unknown_field"


def _refused_fields(d: Decision) -> bool:
    """Would a body be refused for a field (a named one, or any it does not name)?"""
    return bool(d.fields.names("reject")) or d.fields.unknown == "reject"


@register
class LimitsCheck(BaseCheck):
    """Body size just over body_bytes (Content-Length and chunked) and exactly at it; JSON caps
    just over the cap and exactly at it; forbidden fields rejected or stripped."""

    id: ClassVar[str] = "limits"
    title: ClassVar[str] = "body size, JSON caps, forbidden fields"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
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
            for name, _ in d.cap_paths:   # each cap at every position it applies to
                yield Subject(f"json-cap {name} {where}", d.method, d.path, why=why)
            for name in sorted(d.fields.counts):
                yield Subject(f"json-count {name} {where}", d.method, d.path, why=why)
            for name in sorted(d.fields.values):
                yield Subject(f"json-values {name} {where}", d.method, d.path, why=why)
            if d.fields.pins:
                yield (Subject(f"pin {where}", d.method, d.path, why=why) if ctx.witness else
                       na(f"pin {where}", "a pinned value is visible only to a witness upstream",
                          d.method, d.path))
            if d.fields.decided:
                key = f"fields {where}"
                if not _refused_fields(d) and not ctx.witness:
                    yield na(key, "a stripped field is visible only to a witness upstream", d.method, d.path)
                else:
                    yield Subject(key, d.method, d.path, why=why)
            if lim.json_caps or lim.body_bytes is not None:
                yield Subject(f"at-limits {where}", d.method, d.path, why=why)
            if d.envelope_capped and lim.max_sequences is not None:
                most = ceiling_sequences(d)
                key = f"envelope-sequences {where}"
                yield (Subject(key, d.method, d.path, why=why) if most > lim.max_sequences else
                       na(key, f"the route's other caps keep every body at {most} sequences at most "
                               f"(max_sequences {lim.max_sequences})", d.method, d.path))
            if d.envelope_capped and lim.max_request_tokens is not None:
                most, key = ceiling_tokens(d, ctx.options.max_body_bytes), f"envelope-tokens {where}"
                yield (Subject(key, d.method, d.path, why=why or (
                    "" if tokens_body(d, lim.max_request_tokens + 1, base_of(ctx, d),
                                      min(lim.body_bytes or 1 << 30, ctx.options.max_body_bytes))
                    else "no body over it fits body_bytes and --max-body-bytes"))
                       if most > lim.max_request_tokens else
                       na(key, f"the route's other limits keep every body's envelope at {most} tokens at "
                               f"most (max_request_tokens {lim.max_request_tokens})", d.method, d.path))
            if d.salt:   # not proven (never passed) unless the salt can be seen and computed
                yield Subject(f"salt {where}", d.method, d.path, why=why or (
                    "the cache_salt written is visible only to a witness upstream" if not ctx.witness else
                    "the expected cache_salt needs the policy's secret (--salt-secret-file)"
                    if not ctx.options.salt_secret else ""))
            budget = d.budget
            if budget is not None:
                key = f"budget {where}"
                if budget.when_absent == "pass":
                    yield na(key, f"the policy passes requests without {' or '.join(budget.fields)} "
                             "(when_absent: pass): vLLM then generates up to the rest of the context window",
                             d.method, d.path)
                elif budget.when_absent == "inject" and not ctx.witness:
                    yield na(key, "an injected output budget is visible only to a witness upstream",
                             d.method, d.path)
                else:
                    yield Subject(key, d.method, d.path, why=why)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        encoded: set[str] = set()   # cap names already sent in every numeric encoding
        for d in body_decisions(ctx):
            cells = ctx.allowed_cells(d)
            carry = carrier(ctx, d)
            if not cells or carry is None:
                continue
            query, base = carry
            budget = d.budget
            if budget is not None and budget.when_absent == "reject":   # every other body carries it
                base = {**base, budget.field: budget.cap}
            out = Out(self.id, d, Spread(cells), query, base)
            yield from self._body(ctx, d, out)
            # every cap over and at it on every route; each cap name also in every encoding pydantic
            # reads as a number (the parser is shared: once per name, on a route without a carrier)
            fresh = set() if base else set(d.limits.json_caps) - encoded
            encoded |= fresh
            yield from self._caps(d, out, fresh)
            # every named field on every route it applies to (a field allowed on one route only is
            # a deviation there), a field it does not name, and one body with every field it allows
            names = [f for f in d.fields.named if d.fields.named[f] == "reject" or
                     (d.fields.named[f] == "strip" and ctx.witness)]
            if d.fields.decided:
                yield from self._fields(ctx, d, out, names)
            yield from self._budget(ctx, d, out)
            yield from self._salt(ctx, d, out, len(cells))
            yield from self._counts(ctx, d, out)
            yield from self._values(ctx, d, out)
            yield from self._pins(ctx, d, out)
            yield from self._envelope(ctx, d, out)

    def _envelope(self, ctx: CheckContext, d: Decision, out: Out) -> Iterator[Case]:
        """Each per-request cap by every multiplier the route reads: one sequence over
        ``max_sequences`` refused (envelope-sequences), exactly at it let through; a body of
        ``max_request_tokens`` + 1 tokens refused (envelope-tokens), one of exactly that many let
        through (scanner.plan.body.envelope is the plan's count)."""
        lim = d.limits
        if not d.envelope_capped:
            return
        max_bytes = min(lim.body_bytes or 1 << 30, ctx.options.max_body_bytes)
        if lim.max_sequences is not None:
            k, alone = lim.max_sequences, 0
            for name, fields in multipliers(d):
                if most_sequences(d, name) < k + 1:
                    yield from self._partnered(d, out, name, fields, k)
                    continue
                alone += 1
                over, at = out.json(fields(k + 1)), out.json(fields(k))
                yield out.case("envelope-sequences", "deny", ("envelope-sequences",), over,
                               f"{name}: {k + 1} sequences > max_sequences {k}")
                yield out.case("envelope-sequences", "allow", (), at, f"{name}: exactly {k} sequences")
            together = out.json(combined(d, k + 1))
            n = plan_body.envelope(d, together).sequences
            if not alone and n > k:   # no multiplier alone may exceed it, together they do
                yield out.case("envelope-sequences", "deny", ("envelope-sequences",), together,
                               f"every multiplier at once: {n} sequences > max_sequences {k}")
        if lim.max_request_tokens is not None:
            t = lim.max_request_tokens
            for tokens, expected in ((t + 1, "deny"), (t, "allow")):
                body = tokens_body(d, tokens, out.base, max_bytes)
                if body is None:
                    continue
                reasons = ("envelope-tokens",) if expected == "deny" else ()
                yield out.case("envelope-tokens", expected, reasons, body,
                               f"{tokens} tokens ({plan_body.envelope(d, body).sequences} sequences) "
                               f"{'>' if expected == 'deny' else '='} max_request_tokens {t}")

    @staticmethod
    def _partnered(d: Decision, out: Out, name: str, fields: Callable[[int], dict[str, object]],
                   k: int) -> Iterator[Case]:
        """A multiplier whose caps keep it alone within ``max_sequences`` (``n`` capped at 4 under
        16) still counts: at its most, with another multiplier of the route that multiplies it
        (items x sequences per item), over the cap where the other one alone stays within it
        (refused; a proxy ignoring ``name`` lets it through), and the same at most ``k`` in all
        (let through). The first partner that does it; none: nothing (the ceiling says why)."""
        a = min(most_sequences(d, name), k)
        if a < 2:
            return
        mine = fields(a)
        for other, more in multipliers(d):
            b = k // a + 1
            if other == name or most_sequences(d, other) < b:
                continue
            over, alone, at = {**more(b), **mine}, more(b), {**more(k // a), **mine}
            seq, solo, both = (plan_body.envelope(d, out.json(x)).sequences for x in (over, alone, at))
            if seq <= k or solo > k or both > k:
                continue   # not multiplied (n and best_of: the larger counts), or over without it
            yield out.case("envelope-sequences", "deny", ("envelope-sequences",), out.json(over),
                           f"{name} {a} x {other} {b}: {seq} sequences > max_sequences {k} "
                           f"({other} alone: {solo})")
            yield out.case("envelope-sequences", "allow", (), out.json(at),
                           f"{name} {a} x {other} {k // a}: {both} sequences")
            return

    def _counts(self, ctx: CheckContext, d: Decision, out: Out) -> Iterator[Case]:
        """Each count cap: one item over it refused, exactly at it let through (as a list: the
        perimeter counts a list's items and an object's keys alike)."""
        for name, n in sorted(d.fields.counts.items()):
            yield out.case(f"json-count {name}", "deny", (R.token("json-cap", name),),
                           out.json({name: ["x"] * (n + 1)}), f"{name} with {n + 1} items > count cap {n}")
            yield out.case(f"json-count {name}", "allow", (), out.json({name: ["x"] * n}),
                           f"{name} with exactly {n} items")

    def _values(self, ctx: CheckContext, d: Decision, out: Out) -> Iterator[Case]:
        """Each listed-values field: a value outside the list refused (the first listed one in
        another JSON type, and a string no list holds), each listed value let through."""
        for name, listed in sorted(d.fields.values.items()):
            first = listed[0]
            other = str(first) if not isinstance(first, str) else "probe-x1-" + first
            for bad in (other, "probe-not-listed"):
                if bad not in listed:
                    yield out.case(f"json-values {name}", "deny", (R.token("json-cap", name),),
                                   out.json({name: bad}), f"{name} = {bad!r}: not one of {list(listed)}")
            for good in listed:
                if good is not None:
                    yield out.case(f"json-values {name}", "allow", (), out.json({name: good}),
                                   f"{name} = {good!r}: listed")

    def _pins(self, ctx: CheckContext, d: Decision, out: Out) -> Iterator[Case]:
        """Pinned fields: a client's other value and no value both reach vLLM as the pin (witness)."""
        if not d.fields.pins or not ctx.witness:
            return
        other = {k: ("probe-x1" if not isinstance(v, str) else "probe_x1") for k, v in d.fields.pins.items()}
        yield out.case("pin", "allow", (), out.json(other), "a client's own value of each pinned field")
        yield out.case("pin", "allow", (), out.json({}), "no pinned field: the pins written in")

    def _salt(self, ctx: CheckContext, d: Decision, out: Out, cells: int) -> Iterator[Case]:
        """A salted route: a body with a client's cache_salt and one without, from each of two
        senders (two principals where the plan admits two): the upstream must receive exactly
        the salt of the principal (or audience), never the client's (see :meth:`review`)."""
        if not d.salt or not ctx.witness or not ctx.options.salt_secret:
            return
        for _ in range(2 if cells > 1 else 1):
            yield out.case("salt", "allow", (), out.json({"cache_salt": "probe-x1"}),
                           f"a client's cache_salt: replaced by the {d.salt}'s")
            yield out.case("salt", "allow", (), out.json({}), f"no cache_salt: the {d.salt}'s written in")

    def _body(self, ctx: CheckContext, d: Decision, out: Out) -> Iterator[Case]:
        limit = d.limits.body_bytes
        caps = dict(d.cap_paths)
        if limit is not None and limit + 1 <= ctx.options.max_body_bytes:
            over = padded_json(limit + 1, out.base, pad_field(d))
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
            at = padded_json(size, fields, pad_field(d)) if size else out.json(caps)
            if size and len(at) != size:    # too small to hold the caps: two separate cases
                yield out.case("at-limits", "allow", (), padded_json(size, out.base, pad_field(d)),
                               f"body exactly body_bytes {size}")
                at = out.json(caps)
            listed = ", ".join(f"{k}={v}" for k, v in caps.items())
            note = f"exactly at every cap ({listed})" if caps else ""
            note = " and ".join(x for x in (note, f"body exactly {len(at)} bytes" if size else "") if x)
            yield out.case("at-limits", "allow", (), at, note)

    def _caps(self, d: Decision, out: Out, encoded: set[str]) -> Iterator[Case]:
        for name, cap in d.cap_paths:   # a nested position (dotted): the plain integer over it
            bodies = cap_bodies(name, cap) if name in encoded else [(f"{name}={cap + 1} (int)",
                                                                     out.json({name: cap + 1}))]
            for j, (note, body) in enumerate(bodies):
                # another encoding may also be refused as malformed JSON: still a refusal
                reasons = (R.token("json-cap", name),) if j == 0 else (R.token("json-cap", name), "bad-json")
                yield out.case(f"json-cap {name}", "deny", reasons, body, f"json cap: {note} > {cap}")
            for ctype in JSON_TYPES if name in encoded else ():
                case = out.case(f"json-cap {name}", "deny", (R.token("json-cap", name),),
                                out.json({name: cap + 1}), f"json cap: {name}={cap + 1} > {cap} as {ctype}")
                yield replace(case, headers=(("Content-Type", ctype),))

    def _fields(self, ctx: CheckContext, d: Decision, out: Out, names: Sequence[str]) -> Iterator[Case]:
        rules = d.fields
        for name in names:
            body = out.json({name: "probe-x1" if name != "chat_template_kwargs" else {}})
            if rules.named[name] == "reject":
                yield out.case("fields", "deny", (R.token("forbidden-field", name),), body,
                               f"forbidden field {name}")
            else:
                yield out.case("fields", "allow", (), body, f"field {name} to be stripped")
        if rules.unknown == "reject":
            yield out.case("fields", "deny", (R.token("unknown-field", UNKNOWN_FIELD),),
                           out.json({UNKNOWN_FIELD: "probe-x1"}), "a field the policy does not name")
        elif rules.unknown == "strip" and ctx.witness:
            yield out.case("fields", "allow", (), out.json({UNKNOWN_FIELD: "probe-x1"}),
                           "a field the policy does not name, to be stripped")
        # (a field naming a stored response under responses: owned: the ownership check's)
        skip = {*d.limits.json_caps, *(d.budget.fields if d.budget else ()), *out.base,
                *(k for k, n in d.fields.counts.items() if n < 1), *d.owner_fields}
        # a field with listed values holds its first one (the json-values cases try the others)
        allowed = {f: rules.values[f][0] if f in rules.values else "probe-x1" for f in rules.names("allow")
                   if f not in skip}
        if allowed and rules.unknown != "pass":   # over-blocking: every field it allows passes
            yield out.case("fields", "allow", (), out.json(allowed),
                           f"every field the policy allows here ({len(allowed)})")

    def _budget(self, ctx: CheckContext, d: Decision, out: Out) -> Iterator[Case]:
        """Bodies without the route's output budget (absent, null, a null last copy of a duplicated
        key, which is the one Python keeps): refused, or let through with the budget the plan
        writes in for its size (Budget.written: the cap, fitted into the context length when the
        serve arguments give it; nothing where vLLM's own default is within the cap); the witness
        shows which."""
        budget = d.enforced_budget
        if budget is None or (budget.when_absent == "inject" and not ctx.witness):
            return
        rest = {k: v for k, v in out.base.items() if k not in budget.fields}
        first = budget.fields[0]
        parent, _, name = first.rpartition(".")   # a nested budget: written into its parent object
        bare = rest
        if parent:
            rest = nested({**rest, parent: {}})
        head = json.dumps(rest)[1:-1]
        dup = f'"{name}": 1, "{name}": null'
        dup = f'"{parent}": {{{dup}}}' if parent else dup
        if parent:
            head = json.dumps({k: v for k, v in rest.items() if k != parent})[1:-1]
        bodies = [
            ("absent", json.dumps(rest).encode()),
            ("null", json.dumps(nested({**rest, **{f: None for f in budget.fields}})).encode()),
            (f"duplicate {first} key, null last", ("{" + (head + ", " if head else "") + dup + "}").encode()),
        ]
        if budget.window and budget.cap > 1:   # a long body: the budget fitted into the context length
            size = budget.window - budget.cap // 2
            if size <= (d.limits.body_bytes or size):
                bodies.append((f"{size} bytes of a {budget.window}-token context",
                               padded_json(size, rest, pad_field(d))))
        if parent:   # no object to write it into: forwarded as sent (vLLM refuses it)
            bodies.append((f"absent, no {parent} object", json.dumps(bare).encode()))
        for note, body in bodies:
            if budget.when_absent == "reject":
                yield out.case("budget", "deny", (R.token("json-cap", budget.field),), body,
                               f"output budget {note}: refused")
            else:
                fit = budget.written(len(body)) if budget.writable(json.loads(body)) else None
                yield out.case("budget", "allow", (), body, f"output budget {note}: " + (
                    f"{budget.field}={fit} written in" if fit is not None else "vLLM's own default applies"))

    def review(self, ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
        return review_forwarded(ctx, case, a)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = []
        for c, a in results:
            if a.verdict != "failed":
                continue
            if c.expected == "allow" and a.outcome != "reached":
                flagged.append(("VP006", a))      # refused at (not over) a limit: over-blocking
            elif c.expected == "allow":
                flagged.append(("VP015", a))      # reached, but not as the plan says
            elif c.expected == "deny":
                flagged.append(("VP005", a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = "; ".join(a.note for a in attempts[:8])
            if rule == "VP006":
                yield make(rule, attempts, f"Requests exactly at the plan's limits were refused: {notes}.",
                           title="request at the plan's limits refused", extra="limits")
            elif rule == "VP015":
                whys = "; ".join(sorted({a.why for a in attempts if a.why}))
                yield make(rule, attempts, f"The upstream received another body than the plan says: {whys}.",
                           extra="limits")
            elif all(a.outcome == "reached" for a in attempts):
                yield make(rule, attempts, f"Requests over the plan's limits reached the upstream: {notes}.",
                           extra="limits")
            else:
                whys = "; ".join(sorted({a.why for a in attempts if a.why and a.outcome != "reached"}))
                yield make(rule, attempts, f"Requests over the plan's limits were let past them: {notes} "
                           f"({whys}).", extra="limits")


def review_forwarded(ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
    """An allowed body case proved only if the witness saw the body the plan says reaches vLLM."""
    if case.expected != "allow" or a.verdict != "proved" or a.upstream is None or case.body is None:
        return a
    d = ctx.plan.decision(case.method, case.path)
    try:
        obj = json.loads(case.body)
    except ValueError:
        obj = None
    want = None
    if d is not None and isinstance(obj, dict):
        salt = expected_salt(ctx, d, case.credential, a.upstream)
        if salt is None:
            return replace(a, verdict="inconclusive",
                           why=f"the sender of a {d.salt}-salted request is unknown")
        want = forwarded(d, obj, salt, len(case.body))
    verdict, why = body_received(case.body, a.upstream, want)
    return a if verdict == "proved" else replace(a, verdict=verdict, why=why)


def expected_salt(ctx: CheckContext, d: Decision, cred: Credential, seen: WitnessRecord) -> str | None:
    """The cache_salt the upstream must receive on ``d`` from ``cred`` ("" none; None: unknown
    sender). Without the secret: whatever 64-hex salt the witness saw (the "salt" subject then
    stays not proven), so the other fields of the body are still checked."""
    if not d.salt:
        return ""
    principal = ""
    if d.salt == "principal" and cred.kind == "cert":
        principal = cred.principal
        if not principal:
            return None
    elif d.salt == "principal":
        digest = hashlib.sha256(cred.secret.encode()).hexdigest() if cred.secret else ""
        principal = next((p.name for p in ctx.plan.principals if p.key_sha256.lower() == digest), "")
        if not principal:
            return None
    if ctx.options.salt_secret:
        return salt_of(ctx.options.salt_secret.encode(), d.salt_subject(principal))
    try:
        got = json.loads(seen.body) if seen.body is not None else (seen.outline or {}).get("short")
    except ValueError:
        got = None
    value = got.get("cache_salt") if isinstance(got, dict) else None
    return value if isinstance(value, str) and _HEX64.match(value) else "?"


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def body_received(sent: bytes, seen: WitnessRecord, want: Mapping[str, object] | None) -> tuple[Verdict, str]:
    """("proved" | "failed" | "inconclusive", why): did the upstream receive what the plan says
    for ``sent``: ``want`` (the JSON object :meth:`Plan.forwarded_body` gives), or ``sent``
    byte for byte when the plan changes nothing in it?"""
    try:
        obj = json.loads(sent)
    except ValueError:
        obj = None
    if want is None or not isinstance(obj, dict) or want == obj:   # forwarded byte for byte
        if seen.body_sha256 == hashlib.sha256(sent).hexdigest():
            return "proved", ""
        return "failed", (f"the body was changed on the way ({len(sent)} bytes sent, "
                          f"{seen.body_bytes} received)")
    changed = sorted(set(obj) ^ set(want) | {k for k in set(obj) & set(want) if obj[k] != want[k]})
    if seen.body is None and seen.outline is not None:
        return _outline_received(seen.outline, want, changed)
    if seen.body is None:
        return "inconclusive", ("the witness keeps the text of JSON bodies up to 64 KiB only: whether "
                                f"{', '.join(changed)} reached the upstream as the plan says is unknown")
    try:
        got = json.loads(seen.body)
    except ValueError:
        return "failed", "the upstream received a body that is not JSON"
    if not isinstance(got, dict):
        return "failed", "the upstream received a body that is not a JSON object"
    wrong = sorted(k for k in set(got) | set(want) if got.get(k, _MISSING) != want.get(k, _MISSING))
    if wrong:
        shown = "; ".join(f"{k}: {_shown(got, k)} reached the upstream, the plan says {_shown(want, k)}"
                          for k in wrong[:4])
        return "failed", shown
    return "proved", ""


_MISSING = object()


def _outline_received(outline: Mapping[str, Any], want: Mapping[str, object],
                      changed: Sequence[str]) -> tuple[Verdict, str]:
    """A large body seen in outline: the names must be the plan's, and each field the plan
    changes must hold the plan's value (a long one cannot be compared: inconclusive)."""
    keys, short = set(outline.get("keys", ())), outline.get("short", {})
    if keys != set(want):
        extra, missing = sorted(keys - set(want)), sorted(set(want) - keys)
        return "failed", "; ".join([*(f"{k}: reached the upstream, the plan says absent" for k in extra[:4]),
                                    *(f"{k}: absent upstream, the plan says {_shown(want, k)}"
                                      for k in missing[:4])])
    for k in changed:
        if k not in want:
            continue
        if k not in short:
            return "inconclusive", f"{k} is too long for the witness's outline of a large body"
        if short[k] != want[k]:
            return "failed", f"{k}: {_shown(short, k)} reached the upstream, the plan says {_shown(want, k)}"
    return "proved", ""


def _shown(body: Mapping[str, object], key: str) -> str:
    if key not in body:
        return "absent"
    return json.dumps(body[key])[:40]


class Spread:
    """Round-robin over the cells a decision admits: different principals and addresses are
    different limiter buckets, so their cases run in parallel."""

    def __init__(self, cells: Sequence[tuple[Credential, Vantage]]) -> None:
        self.cells, self.i = list(cells), 0

    def next(self) -> tuple[Credential, Vantage]:
        cell = self.cells[self.i % len(self.cells)]
        self.i += 1
        return cell


class Out:
    """The cases of one decision: spread over its cells, built on its carrier (query, fields)."""

    def __init__(self, check: str, d: Decision, spread: Spread, query: str,
                 base: dict[str, object]) -> None:
        self.check, self.d, self.spread, self.query, self.base = check, d, spread, query, base

    def json(self, fields: Mapping[str, object]) -> bytes:
        """The carrier's fields and ``fields`` (dotted keys nested, :func:`nested`)."""
        return json.dumps(nested({**self.base, **fields})).encode()

    def case(self, aspect: str, expected: str, reasons: tuple[str, ...], body: bytes, note: str,
             chunked: bool = False) -> Case:
        d = self.d
        if expected == "allow" and aspect == "envelope-sequences":   # the sequences at the cap, each
            body = light_body(d, body) or body   # asking for one token where a budget charges them
        # a body the route's per-request caps refuse (its envelope over max_sequences or
        # max_request_tokens) is expected refused for that, whatever else it was sent for
        over = plan_body.envelope_refusal(d, body) if expected == "allow" and d.envelope_capped else ""
        if over:
            expected, reasons, note = "deny", (over.rsplit(":", 1)[0],), f"{note} (envelope: {over})"
        cred, vantage = self.spread.next()
        return Case(self.check, d.method, d.path, d.method, with_query(concrete(d.path), self.query), cred,
                    vantage, expected, reasons, f"{aspect} {d.method} {d.path}",  # type: ignore[arg-type]
                    body=body, chunked=chunked, role="limit", json_body=True,
                    state_changing=d.state_changing, note=note, as_sent=aspect in AS_SENT)
