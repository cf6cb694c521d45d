"""The rule program: a route's body rules compiled once, by the plan, into instructions that small
interpreters run. The same document drives the Python reference (:mod:`scanner.plan.interpret`),
njs (``templates/nginx-perimeter.js``, ``run``) and Lua (``templates/envoy_perimeter.lua.j2``,
``run``); none of them knows a route or a policy, only the instruction set. Its JSON Schema is
``schemas/rule-program.schema.json``; goldens of the bundled policies are under
``tests/plan/golden/``.

A program is a list of steps, run in order over a JSON object body. Each step may refuse the body
with its reason (:mod:`scanner.reasons`; the first refusal ends the run) and may write into the
body: every step reads and writes one working copy, so a field ``keys`` strips is gone for the
steps after it and the budget ``budget`` writes in (or a pin) is what ``envelope`` reads. The body
that leaves is that copy once every step passed. What the steps share besides it:

* ``size``: the body's bytes as received;
* ``salt``: the cache salt of the sender ("" none known), ``owner``: (secret, principal);
* ``strip``: the fields ``keys`` stripped (``owned`` skips them).

The order the compiler emits: cap, keys, count, values, media, budget, salt, pin, envelope, owned,
ask_usage.

The instructions (``op``), what each refuses, what each writes:

========== ================================================= ===========================================
op         refuses                                           writes
========== ================================================= ===========================================
cap        ``json-cap:PATH``: the value at PATH (a dotted     nothing
           path) not null and not an integer vLLM reads as
           at most ``max``
keys       each top-level field in document order:           deletes the fields it strips
           ``forbidden-field:NAME`` (``modes`` says reject),
           ``unknown-field:NAME`` (not named, ``unknown``
           reject; a name not ``[A-Za-z0-9_]{1,64}``:
           ``unknown-field:not-a-plain-name``)
count      ``json-cap:FIELD:count-over-MAX``: the field holds nothing
           more items (a list's length, an object's keys, 1
           for any other value, 0 for null)
values     ``json-cap:FIELD:not-listed``: the field present,  nothing
           not null, and equal to none of ``values`` (JSON
           equality: types too, 1 is not "1" nor true)
media      media anywhere in the body (scanner/policy/media)  nothing
budget     ``json-cap:FIELD:absent``: every field in          ``absent: inject``: FIELD = min(cap,
           ``fields`` absent or null and ``absent: reject``   window - size) (cap without a window) when
                                                             all are absent, the value >= 1 and FIELD's
                                                             parent an object
salt       ``bad-request:no-salt``: no salt for the sender    ``cache_salt`` = the sender's salt
envelope   ``envelope-sequences:over-N``,                    nothing (its tokens are the charge: sequences
                                                             x output per sequence + size; output: the
                                                             first ``out`` field not null, whole, else
                                                             ``rest``; no ``out``: 0)
           ``envelope-tokens:over-N`` (the admitted
           envelope over ``max_sequences`` / ``max_tokens``)
owned      ``not-owner:FIELD``: a field (present, not null,  each such field = vLLM's own id
           not stripped) not sealed for the sender
pin        nothing                                           FIELD = VALUE
ask_usage  nothing                                           a stream that does not ask for its usage
                                                             asks (scanner/plan/settle.asking_usage)
========== ================================================= ===========================================

Adding a kind of rule: a step model in :mod:`scanner.rules`, its line in
:func:`compile_decision`, and one function per interpreter (``OPS`` in each).
"""

from __future__ import annotations

from collections.abc import Iterable

from scanner.plan.model import BODY_METHODS, Decision
from scanner.rules import (
    AskUsage,
    BudgetStep,
    Cap,
    Count,
    EnvelopeStep,
    Keys,
    Media,
    Owned,
    PinStep,
    Program,
    RuleProgram,
    Salt,
    Step,
    Values,
)


def compile_decision(d: Decision) -> Program:
    """The program of ``d``'s body rules (:func:`scanner.plan.body.inspects` says whether the
    proxy runs one at all)."""
    steps: list[Step] = [Cap(path=p, max=n) for p, n in sorted(d.cap_paths)]
    rules = d.fields
    if rules.decided:
        modes = {n: m for n, m in sorted(rules.named.items()) if n not in rules.pins}
        modes.update({n: "allow" for n in sorted(rules.pins)})
        steps.append(Keys(unknown=rules.unknown, modes=modes))  # type: ignore[arg-type]
        steps += [Count(field=f, max=n) for f, n in sorted(rules.counts.items())]
        steps += [Values(field=f, values=list(v)) for f, v in sorted(rules.values.items())]
    if d.media.active:
        m = d.media
        steps.append(Media(urls=m.urls, domains=list(m.domains), data=m.data_max_bytes, items=m.max_items,
                           embeds=m.embeds))
    budget = d.enforced_budget
    if budget is not None:
        steps.append(BudgetStep(fields=list(budget.fields), field=budget.field,
                                absent=budget.when_absent,  # type: ignore[arg-type]
                                cap=budget.write_cap, window=budget.window))
    if d.salt:
        steps.append(Salt())
    steps += [PinStep(field=f, value=v) for f, v in sorted(rules.pins.items())]
    if d.token_zone or d.envelope_capped:
        steps.append(envelope_step(d))
    if d.owner_fields:
        steps.append(Owned(fields=list(d.owner_fields)))
    if d.token_zone and d.envelope_spec.ask_usage:
        steps.append(AskUsage())
    return Program(steps=steps)


def envelope_step(d: Decision) -> EnvelopeStep:
    """``d``'s envelope instruction: its request model's multipliers, its output budget's fields
    (none present: ``rest``, vLLM's own default) and its per-request caps."""
    out = d.budget
    return EnvelopeStep(items=[(f, r) for f, r in d.envelope_spec.items],
                        pairs=[(a, b) for a, b in d.envelope_spec.pairs],
                        per=list(d.envelope_spec.per_item),
                        out=list(out.fields) if out else [], rest=out.rest if out else 0,
                        max_sequences=d.limits.max_sequences, max_tokens=d.limits.max_request_tokens)


def inspects(d: Decision) -> bool:
    """Does the perimeter read this route's bodies at all (both generators decide it so)?"""
    return (d.kind != "websocket" and d.method in BODY_METHODS
            and bool(d.limits.json_caps or d.fields.decided or d.media.active or d.token_zone
                     or d.owner_fields))


class Programs:
    """The programs of one generated config, each once (two route groups with the same rules share
    one), with ids ``r1``, ``r2``, ... in the order they are first added: deterministic."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}
        self._programs: dict[str, Program] = {}

    def add(self, program: Program) -> str:
        key = program.model_dump_json()
        if key not in self._ids:
            pid = f"r{len(self._ids) + 1}"
            self._ids[key] = pid
            self._programs[pid] = program
        return self._ids[key]

    def document(self) -> RuleProgram:
        return RuleProgram(programs=dict(self._programs))


def compile_plan(decisions: Iterable[Decision]) -> RuleProgram:
    """The rule program of every inspected decision (in order; the goldens' form)."""
    out = Programs()
    for d in decisions:
        if d.allowed and inspects(d):
            out.add(compile_decision(d))
    return out.document()
