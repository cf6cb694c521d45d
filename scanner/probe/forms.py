"""The forwarding forms of a route: one body per way the plan forwards a request there.

A proxy forwards an allowed body by one of up to three ways, and each way carries its own copy of
the per-request facts (the upstream timeout, the upstream's 5xx replaced, the headers vLLM
receives): a body no body rule reads (nothing governed in it), a body the rules read and forward
as sent, and a body the rules rewrite (a field stripped, an output budget written in, a pin, the
perimeter's cache salt). NGINX renders them as separate locations (the route's own, ``<up>_checked``
and ``<up>_rewrite``), so a fact proven through one is not proven through the others. The checks
that prove such facts (``upstream``, ``timeout``) send each form :func:`of` returns; which form a
body takes is decided by the plan's body reference (:func:`scanner.plan.body.judge`), never by a
proxy's layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from scanner.plan import body
from scanner.plan.model import Decision

PLACEHOLDER_SALT = "0" * 64   # a salted route's forms are classified with any salt: all rewritten


@dataclass(frozen=True)
class Form:
    name: str      # "plain", "kept", "rewritten"
    body: bytes
    note: str


def _judged(d: Decision, doc: dict[str, object]) -> tuple[bool, bool]:
    """(admitted, forwarded exactly as sent) for ``doc`` on ``d``."""
    raw = json.dumps(doc).encode()
    j = body.judge(d, raw, salt=PLACEHOLDER_SALT if d.salt else "")
    if j.refused:
        return False, False
    return True, j.body is None or j.body == doc


def _governed(d: Decision) -> dict[str, object]:
    """A body the rules must read, at values they admit: the route's output budget field (else
    its first top-level cap) at 1, and each pin at its value."""
    doc: dict[str, object] = {}
    budget = d.enforced_budget
    names = [budget.field] if budget is not None else []
    names += [name for name, _cap in d.cap_paths]
    first = next((n for n in names if "." not in n and d.fields.mode(n) == "allow"), None)
    if first is not None:
        doc[first] = 1
    doc.update(d.fields.pins)
    return doc


def _rewriting(d: Decision) -> dict[str, object] | None:
    """A body the rules admit and rewrite: ``{}`` when they write into it (a budget, a pin, the
    salt), else one carrying a field they strip; None: nothing on this route is rewritten."""
    if _judged(d, {}) == (True, False):
        return {}
    strip = d.fields.names("strip")
    if strip:
        doc = {**_governed(d), strip[0]: 1}
        if _judged(d, doc) == (True, False):
            return doc
    return None


def of(d: Decision) -> tuple[Form, ...]:
    """The forms a request to ``d`` can take, each once: ``plain`` (``{}``), ``kept`` (governed
    keys, forwarded as sent) and ``rewritten``. Empty when there is one way only (the perimeter
    never reads the route's bodies, or reads and forwards every admitted one alike): the route's
    ordinary request proves it."""
    if not body.inspects(d):
        return ()
    out: list[Form] = []
    plain_ok, plain_kept = _judged(d, {})
    if plain_ok and plain_kept:
        out.append(Form("plain", b"{}", "a body with nothing the rules govern"))
    governed = _governed(d)
    if governed and _judged(d, governed) == (True, True):
        out.append(Form("kept", json.dumps(governed).encode(),
                        "a body the rules read and forward as sent"))
    rewriting = _rewriting(d)
    if rewriting is not None:
        out.append(Form("rewritten", json.dumps(rewriting).encode(),
                        "a body the rules rewrite before it is forwarded"))
    return tuple(out) if len(out) > 1 else ()
