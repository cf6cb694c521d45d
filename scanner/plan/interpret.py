"""The Python interpreter of the rule program (:mod:`scanner.plan.program`): the reference the
differential corpus holds njs and Lua to. It knows the instructions, nothing of routes or
policies; :func:`scanner.plan.body.judge` runs a decision's compiled program with it.

Each instruction is one function in :data:`OPS`: ``(step, run) -> reason`` ("" passes). The steps
read and write one working copy of the body (``run.doc``), in program order: a field ``keys`` strips
is gone for the steps after it, the budget ``budget`` writes in is what ``envelope`` reads. The body
that leaves is that copy once every step passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scanner import reasons
from scanner.plan import envelope as env_mod
from scanner.plan import owner, settle
from scanner.plan.budget import write_budget
from scanner.plan.model import whole
from scanner.plan.vllm_json import at, within
from scanner.policy import media as media_mod
from scanner.policy.model import count_of
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
    Salt,
    Values,
)

_PLAIN = re.compile(r"[A-Za-z0-9_]{1,64}")


@dataclass
class Run:
    """One body's run through a program."""

    doc: dict[str, Any]
    size: int
    salt: str = ""
    owner: tuple[bytes, str] | None = None
    strip: set[str] = field(default_factory=set)
    sequences: int = 1
    output: int = 0
    refused_by: list[str] = field(default_factory=list)    # the ops that refused (run(stop=False))

    @property
    def tokens(self) -> int:
        return self.sequences * self.output + self.size


def op_cap(s: Cap, r: Run) -> str:
    return "" if within(at(r.doc, s.path), s.max) else reasons.token("json-cap", s.path)


def op_keys(s: Keys, r: Run) -> str:
    for key in r.doc:
        mode = s.modes.get(key) or ("allow" if s.unknown == "pass" else s.unknown)
        if mode == "reject":
            if key in s.modes:
                return reasons.token("forbidden-field", key)
            return reasons.token("unknown-field", key if _PLAIN.fullmatch(key) else "not-a-plain-name")
        if mode == "strip":
            r.strip.add(key)
    r.doc = {k: v for k, v in r.doc.items() if k not in r.strip}
    return ""


def op_count(s: Count, r: Run) -> str:
    return f"json-cap:{s.field}:count-over-{s.max}" if count_of(r.doc.get(s.field)) > s.max else ""


def _json_type(v: object) -> str:
    return "bool" if isinstance(v, bool) else "number" if isinstance(v, int | float) else type(v).__name__


def _same(a: object, b: object) -> bool:
    """JSON equality: the same JSON type (a bool is no number, 1 is not "1") and value (1 is 1.0)."""
    return _json_type(a) == _json_type(b) and a == b


def op_values(s: Values, r: Run) -> str:
    v = r.doc.get(s.field)
    if v is None or any(_same(v, x) for x in s.values):
        return ""
    return f"json-cap:{s.field}:not-listed"


def op_media(s: Media, r: Run) -> str:
    rules = media_mod.MediaRules(urls=s.urls, domains=tuple(s.domains), data_max_bytes=s.data,
                                 max_items=s.items, embeds=s.embeds)
    return media_mod.reason(r.doc, rules)


def op_budget(s: BudgetStep, r: Run) -> str:
    if any(at(r.doc, f) is not None for f in s.fields):
        return ""
    if s.absent == "reject":
        return f"json-cap:{s.field}:absent"
    fit = (min(s.cap, s.window - r.size) if s.window else s.cap) if s.cap else 0
    parent = s.field.rpartition(".")[0]
    if fit < 1 or (parent and not isinstance(at(r.doc, parent), dict)):
        return ""        # nothing written: vLLM's own default (or it refuses the body as sent)
    r.doc = write_budget(r.doc, s.field.split("."), s.fields, fit)
    return ""


def op_salt(s: Salt, r: Run) -> str:
    if not r.salt:
        return "bad-request:no-salt"
    r.doc["cache_salt"] = r.salt
    return ""


def op_envelope(s: EnvelopeStep, r: Run) -> str:
    spec = env_mod.EnvelopeSpec(items=tuple(s.items), pairs=tuple(s.pairs), per_item=tuple(s.per))
    r.sequences = env_mod.sequences(spec, r.doc, whole)
    value = next((at(r.doc, f) for f in s.out if at(r.doc, f) is not None), None)
    r.output = (whole(value) if value is not None else s.rest) if s.out else 0
    if s.max_sequences is not None and r.sequences > s.max_sequences:
        return f"envelope-sequences:over-{s.max_sequences}"
    if s.max_tokens is not None and r.tokens > s.max_tokens:
        return f"envelope-tokens:over-{s.max_tokens}"
    return ""


def op_owned(s: Owned, r: Run) -> str:
    ids: dict[str, str] = {}
    for name in s.fields:
        value = r.doc.get(name)
        if value is None or name in r.strip:
            continue
        rid = owner.unseal(r.owner[0], r.owner[1], value) if r.owner else None
        if rid is None:
            return reasons.token("not-owner", name)
        ids[name] = rid
    r.doc.update(ids)
    return ""


def op_pin(s: PinStep, r: Run) -> str:
    r.doc[s.field] = s.value
    return ""


def op_ask_usage(s: AskUsage, r: Run) -> str:
    r.doc = settle.asking_usage(r.doc) or r.doc
    return ""


OPS: dict[str, Callable[[Any, Run], str]] = {
    "cap": op_cap, "keys": op_keys, "count": op_count, "values": op_values, "media": op_media,
    "budget": op_budget, "salt": op_salt, "envelope": op_envelope, "owned": op_owned, "pin": op_pin,
    "ask_usage": op_ask_usage,
}


def run(program: Program, r: Run, stop: bool = True) -> tuple[str, dict[str, Any] | None]:
    """(the first refusal's reason, None) or ("", the body that leaves); ``r.doc`` must be the
    run's own copy. ``stop=False``: every step runs, refusals are kept in ``r.refused_by``, and the
    body is returned with what the steps wrote (the probe's expectation of an admitted body)."""
    first = ""
    for step in program.steps:
        why = OPS[step.op](step, r)
        if why:
            r.refused_by.append(step.op)
            first = first or why
            if stop:
                return why, None
    return first, r.doc
