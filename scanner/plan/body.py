"""The body rules of one decision, as one reference: what the perimeter must do with a raw request
body on a route, refuse it (with which reason, :mod:`scanner.reasons`) or forward it (which body:
fields stripped, output budget written in, cache salt, pins), reading the body exactly as vLLM
does (:mod:`scanner.plan.vllm_json`).

njs (``templates/nginx-perimeter.js``) and Lua (``templates/envoy_json.lua.j2``,
``envoy_perimeter.lua.j2``) implement the same rules; ``tests/differential`` holds all three (and
vLLM's own request models) to this judge over a corpus of bodies. The checks, in the order their
reasons are given (one body may break several):

1. the body is nested at most :data:`scanner.rules.BODY_DEPTH` levels (:func:`nesting`, counted on its
   bytes before it is read: ``bad-json:depth-over-31``), then a JSON object (``bad-json``; valid
   JSON of another type: ``bad-json:not-an-object``);
2. each capped field (``limits.json_caps``, by name, at the top level and at each nested position of
   the request model with that name, :attr:`Decision.cap_paths`, sorted by path) is null or an
   integer pydantic reads as at most its cap (``json-cap:NAME``, ``json-cap:sampling_params.n``):
   a value vLLM would refuse is refused here too;
3. each top-level field in document order (a duplicated key once, with its last value): refused
   by name (``forbidden-field:NAME``), unnamed under ``unknown: reject`` (``unknown-field:NAME``),
   or holding more items than its count (``json-cap:NAME:count-over-N``);
4. media anywhere in the body (:func:`scanner.policy.media.reason`);
5. the output budget absent (every field it is read from absent or null) under ``when_absent:
   reject`` (``json-cap:FIELD:absent``); under ``inject`` it is written in, at a nested position
   only into an object already there (a body without one, vLLM refuses as sent);
6. a salted route without a salt for the sender (``bad-request:no-salt``);
7. the admitted envelope over the route's per-request caps (:func:`envelope_refusal`);
8. under ``responses: owned``, each field naming a stored response (:attr:`Decision.owner_fields`,
   present, not null, not stripped) sealed for the sender (``not-owner:FIELD``, 403,
   :mod:`scanner.plan.owner`); it leaves with vLLM's own id.

Bodies that are not inspected are forwarded as sent: empty ones, form bodies (:func:`is_form`:
``multipart/form-data`` and ``application/x-www-form-urlencoded``, which vLLM does not read as
JSON) and every body of a route with no body rule. The body is read strictly (:func:`document`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from scanner import reasons
from scanner.plan import interpret
from scanner.plan.envelope import Envelope
from scanner.plan.model import Decision
from scanner.plan.program import compile_decision, envelope_step, inspects

__all__ = ["DEPTH_REASON", "FORM_TYPES", "Judgement", "document", "envelope", "envelope_refusal", "forwarded",
           "inspects", "is_form", "judge", "nesting", "token_cost", "violations"]
from scanner.plan.vllm_json import at, vllm_int
from scanner.policy import media
from scanner.policy.model import count_of
from scanner.rules import BODY_DEPTH, EnvelopeStep, Program, Values

FORM_TYPES: tuple[str, ...] = ("multipart/form-data", "application/x-www-form-urlencoded")
HTTP_WS = " \t\n\x0b\x0c\r"   # what NGINX's \s and Lua's %s strip around a media type


@dataclass(frozen=True)
class Judgement:
    """The perimeter's answer to one body: refused (``reason``), or forwarded as ``body`` (the JSON
    object the upstream must receive; None: the bytes as sent, not inspected)."""

    reason: str = ""
    body: dict[str, object] | None = None
    cost: int = 0                  # the token charge (route with a token budget; else 0)

    @property
    def refused(self) -> bool:
        return bool(self.reason)

    @property
    def kind(self) -> tuple[str, str]:
        """The refusal's kind and field (``("json-cap", "max_tokens")``); ("", "") forwarded."""
        return reasons.parse(self.reason) if self.reason else ("", "")


DEPTH_REASON = reasons.token("bad-json", f"depth-over-{BODY_DEPTH}")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_BRACKET = re.compile(rb"[][{}]")


def nesting(raw: bytes) -> int:
    """The most brackets open at once in ``raw`` outside its strings (a string: from a ``"`` to the
    next ``"`` not escaped by a backslash, or to the end), whether or not ``raw`` is valid JSON:
    the one count every interpreter makes the same way, so a body too deep gets one reason from
    all of them, before (or whatever) their readers would say of it."""
    depth = most = 0
    for m in _BRACKET.finditer(_STRING.sub(b"", raw)):
        if m.group() in b"[{":
            depth += 1
            most = max(most, depth)
        else:
            depth -= 1
    return most


def is_form(content_type: str | None) -> bool:
    """Is a body with this Content-Type a form (not inspected): all of it before the first ``;``,
    whitespace stripped and case folded, one of :data:`FORM_TYPES`. Nothing vLLM's FastAPI
    reads as JSON is a form: ``application/x-www-form-urlencoded x+json`` is JSON to it (its
    subtype ends with ``+json``), and inspected here."""
    return (content_type or "").partition(";")[0].strip(HTTP_WS).lower() in FORM_TYPES


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(doc: object) -> bool:
    """Does a name or a string of ``doc`` (as Python's json read it) hold a lone surrogate? Only a
    ``\\u`` escape of one not paired (a high one not followed at once by a low one, a low one
    alone) gives one: strict UTF-8 holds none, and a pair of escapes is one character."""
    todo = [doc]
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return True
        elif isinstance(value, dict):
            todo.extend(value)
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
    return False


def document(raw: bytes) -> object:
    """The body as the perimeter reads it: RFC 8259 JSON in UTF-8 (no byte order mark, no
    ``NaN`` / ``Infinity``, which Python's json, and so vLLM, would also take), no name or string
    holding a lone surrogate (Python's json reads ``"\\ud800"`` as one, vLLM too; njs reads it as
    U+FFFD and Lua as a byte of its own, so two such names were one to them: a count of names
    under its cap to them and over it to vLLM); ValueError else. A stricter reading than vLLM's
    refuses more, never less."""
    def constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")
    text = raw.decode("utf-8")
    doc = json.loads(text, parse_constant=constant)
    if "\\u" in text and lone_surrogate(doc):
        raise ValueError("a lone surrogate is not read alike by every reader")
    return doc


def forwarded(d: Decision, doc: Mapping[str, object], salt: str = "",
              size: int = 0, unsealed: Mapping[str, str] | None = None) -> dict[str, object] | None:
    """The JSON object the upstream must receive when ``doc`` passes ``d``'s checks: what the
    route's program writes (:mod:`scanner.plan.program`: fields stripped, the output budget, on a
    salted route ``cache_salt`` = ``salt``, the pins, on a settled stream asking for its usage),
    the fields naming stored responses replaced by ``unsealed``; ``size``: the bytes it was
    received as; None: refused for its absent budget."""
    if d.salt and not salt:
        raise ValueError(f"{d.method} {d.path} writes its own cache_salt: give the expected salt")
    r = interpret.Run(dict(doc), size, salt)
    _, out = interpret.run(compile_decision(d), r, stop=False)
    if out is None or "budget" in r.refused_by:
        return None
    return {**out, **unsealed} if unsealed else out


def judge(d: Decision, raw: bytes, salt: str = "",
          content_type: str | None = "application/json",
          owner_key: tuple[bytes, str] | None = None) -> Judgement:
    """What the perimeter must do with ``raw`` sent to ``d`` (an allowed route) with this
    Content-Type: the route's compiled program run by the Python interpreter
    (:mod:`scanner.plan.interpret`); ``salt``: the perimeter's cache salt for the sender on a
    salted route ("" none known: refused); ``owner_key``: (the responses secret, the sender's
    principal) on a route with owned fields (None there: every id refused)."""
    form = is_form(content_type)
    if not inspects(d) or not raw or form:
        # not read as JSON: the body's bytes (the input estimate), as both proxies charge it
        return Judgement(cost=max(1, len(raw)) if d.token_zone else 0)
    if raw.count(b"[") + raw.count(b"{") > BODY_DEPTH and nesting(raw) > BODY_DEPTH:
        return Judgement(DEPTH_REASON)
    try:
        doc = document(raw)
    except (ValueError, RecursionError):
        return Judgement("bad-json")
    if not isinstance(doc, dict):
        return Judgement("bad-json:not-an-object")
    r = interpret.Run(doc, len(raw), salt, owner_key)
    why, body = interpret.run(compile_decision(d), r)
    if why:
        return Judgement(why)
    return Judgement(body=body, cost=max(1, r.tokens) if d.token_zone else 0)


def _through_envelope(d: Decision, raw: bytes) -> tuple[interpret.Run, str] | None:
    """The run of ``raw`` through ``d``'s program up to its envelope instruction (every step before
    it run, refusals or not: the keys' strips, the budget written in, the pins), and that
    instruction's refusal; None for a body that is not a JSON object. A route without the
    instruction (no token budget, no per-request cap) is run with one (its envelope is still
    asked for: the probe's shapes)."""
    try:
        doc = document(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    steps = compile_decision(d).steps
    at_ = next((i for i, s in enumerate(steps) if isinstance(s, EnvelopeStep)), None)
    step = steps[at_] if at_ is not None else envelope_step(d)
    r = interpret.Run(doc, len(raw))
    interpret.run(Program(steps=steps[:at_] if at_ is not None else steps), r, stop=False)
    return r, interpret.op_envelope(step, r)  # type: ignore[arg-type]


def envelope(d: Decision, raw: bytes) -> Envelope:
    """The admitted envelope of a request of ``d`` with body ``raw`` (scanner/plan/envelope.py), as
    the route's program computes it, in one place for the judge, the probe's expectations and
    the proxies' interpreters: the sequences it runs, the output budget per sequence (what the
    budget step wrote in, else the first budget field present, else vLLM's default), its input
    estimate (the body's bytes) and its ``model``; a body that is not a JSON object: 1 sequence,
    no output."""
    ran = _through_envelope(d, raw)
    if ran is None:
        return Envelope(sequences=1, output=0, input=len(raw))
    model = ran[0].doc.get("model")
    return Envelope(sequences=ran[0].sequences, output=ran[0].output, input=len(raw),
                    model=model if isinstance(model, str) else "")


def envelope_refusal(d: Decision, raw: bytes) -> str:
    """The refusal of ``raw`` by ``d``'s per-request caps (``envelope-sequences:over-N``,
    ``envelope-tokens:over-N``): the envelope instruction's own; "" admitted (or no cap)."""
    ran = _through_envelope(d, raw) if d.envelope_capped else None
    return ran[1] if ran is not None else ""


def token_cost(d: Decision, raw: bytes) -> int:
    """What a request of ``d`` with ``raw`` is charged against its token budget at admission: its
    envelope's tokens (sequences x output budget + the body's bytes), at least 1."""
    return max(1, envelope(d, raw).tokens)


def violations(d: Decision, doc: object, salt: str = "") -> tuple[str, ...]:
    """How a body that reached the upstream (``doc``, as vLLM reads it) breaks ``d``'s rules:
    a capped field vLLM reads as over its cap (a value it refuses, it refuses: no more work), a
    field refused or stripped by the rules, a count over, a pin or the salt not the perimeter's,
    media the rules refuse, no output budget where the plan decides its absence. Empty: nothing
    more than the plan allows reached vLLM."""
    if not isinstance(doc, dict):
        return ()
    out = [f"cap {n}: {at(doc, n)!r}" for n, cap in d.cap_paths if (vllm_int(at(doc, n)) or 0) > cap]
    rules = d.fields
    for key, value in doc.items():
        mode = rules.mode(key)
        if mode != "allow" and not (key == "cache_salt" and d.salt):
            out.append(f"field {key}: {mode}")
        if key in rules.counts and count_of(value) > rules.counts[key]:
            out.append(f"count {key}: {count_of(value)} > {rules.counts[key]}")
    out += [f"pin {k}: {doc.get(k)!r}" for k, v in rules.pins.items() if doc.get(k, object()) != v]
    out += [f"value {k}: {doc[k]!r}" for k, vs in rules.values.items()
            if interpret.op_values(Values(field=k, values=list(vs)), interpret.Run(doc, 0))]
    if d.salt and doc.get("cache_salt") != salt:
        out.append("salt: not the perimeter's")
    why = media.reason(doc, d.media)
    if why:
        out.append(f"media: {why}")
    budget = d.enforced_budget
    # without a budget vLLM's own default applies; fine where the plan lets it (within the cap,
    # or a body too long to fit one into the context length), not where the cap is always written
    # (a nested budget with no object to write it into: vLLM refuses the body, its model says)
    if budget is not None and budget.absent(doc) and (budget.when_absent == "reject" or not (
            budget.quiet or budget.window or not budget.writable(doc))):
        out.append(f"budget: {'/'.join(budget.fields)} absent")
    return tuple(out)
