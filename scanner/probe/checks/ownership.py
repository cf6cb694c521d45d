"""Ownership of stored responses (``body: responses: owned``; scanner/plan/owner.py): with two
principals A and B that a route admits, from one vantage inside its networks,

* A creates stored responses (a JSON answer and a stream) and every response id in the answers is
  sealed to A (with the policy's secret: A's MAC verified; without it: the seal's form);
* B names A's response (A's seal of a probe id) in the path (``GET /v1/responses/{id}``, cancel)
  and in ``previous_response_id``: each refused, 403 ``not-owner``; so are the raw id and a
  forged seal, from B and from A;
* A names its own: admitted, and the witness shows vLLM received the raw id, never the seal.

The MAC is stateless, so A's seal of a probe id is what A would be handed for a response of that
id: the refusals do not depend on a stored response (none of another tenant is ever named). The
cases that need a seal need the secret (``probe --responses-secret-file``; verify: its throwaway
one); without it the raw and forged ids are still refused. The cases that create stored responses
(POST .../responses with ``store``) are state-changing: sent with ``--allow-state-changes`` (verify,
against the stand-in).

Every case that names an id (in the path, cancel included, or in ``previous_response_id``) names
:data:`PROBE_ID`, which is never a stored response (vLLM's ids are ``resp_`` and 16 hex): vLLM
0.29 answers a cancel of it and a create continuing from it 404 before it acts (``cancel_responses``
and ``_create_responses`` look the id up first), so these cases are sent by default, a cancel too:
a proxy that forwards another principal's cancel as sent fails the run without a witness."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.plan import owner
from scanner.plan.model import Decision
from scanner.probe.cases import Case
from scanner.probe.coverage import Subject, na
from scanner.probe.expect import ALLOW, Expectation
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Credential, Finding, Vantage
from scanner.probe.owned import principal_of
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

PROBE_ID = "resp_probe-owned-1"       # never a vLLM id (resp_ + 16 hex): no tenant's response
FORGED = PROBE_ID + owner.SEPARATOR + "A" * owner.TAG_CHARS
NO_SECRET = ("needs the policy's responses secret (probe --responses-secret-file; verify makes one): "
             "without it no principal's seal can be made")
NO_PAIR = ("needs two principals the route admits from one vantage (two --key of its roles; "
           "verify makes them)")
NOT_SENT = "state-changing (creates a stored response): sent with --allow-state-changes"
RESP = re.compile(r'"(resp_[A-Za-z0-9_.:~-]+)"')    # any response-id-like string token of an answer


def routes(ctx: CheckContext) -> list[Decision]:
    return [d for d in ctx.plan.allowed if d.owned and d.kind == "http"]


def pair(ctx: CheckContext, d: Decision) -> tuple[Credential, Credential, Vantage] | None:
    """Two credentials of different principals that ``d`` admits from one vantage (A, B)."""
    cells = ctx.allowed_cells(d)
    for vantage in dict.fromkeys(v for _c, v in cells):
        creds = {principal_of(ctx, c): c for c, v in cells if v == vantage and principal_of(ctx, c)}
        if len(creds) >= 2:
            a, b = sorted(creds)[:2]
            return creds[a], creds[b], vantage
    return None


def _key(d: Decision) -> str:
    return f"ownership {d.method} {d.path}"


def _sealed_key(d: Decision) -> str:
    return f"sealed answers {d.method} {d.path}"


def _creates(d: Decision) -> bool:
    """Does the route create stored responses: vLLM's POST .../responses (its answers sealed)?"""
    return d.owner_seal and not d.owner_param and d.method == "POST" and d.path.endswith("/responses")


def _ids(text: str) -> tuple[str, ...]:
    """The response ids where vLLM writes them in one JSON text (none: not JSON)."""
    try:
        return owner.answer_ids(json.loads(text))
    except ValueError:
        return ()


@register
class Ownership(BaseCheck):
    """Stored responses stay their creator's: sealed on the way out, the seal checked on the way
    in (path and body), refused as not-owner to anyone else."""

    id: ClassVar[str] = "ownership"
    title: ClassVar[str] = "stored responses owned by their principal (responses: owned)"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for d in routes(ctx):
            keys = ([_sealed_key(d)] if _creates(d) else []) + ([_key(d)] if d.owner_param or d.owner_fields
                                                                 else [])
            why = NO_PAIR if pair(ctx, d) is None else ""
            for key in keys:
                yield Subject(key, d.method, d.path, why=why)
        if not ctx.plan.body.owned:
            yield na("ownership", "the policy shares stored responses (body: responses: shared)")

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        secret = ctx.options.owner_secret.encode()
        for d in routes(ctx):
            found = pair(ctx, d)
            if found is None:
                continue
            a, b, vantage = found
            sealed = owner.seal(secret, principal_of(ctx, a), PROBE_ID) if secret else ""
            if _creates(d):
                for stream in (False, True):
                    body = {"input": "ownership probe", "max_output_tokens": 1, "store": True,
                            **({"stream": True} if stream else {})}
                    yield self._case(ctx, d, a, vantage, ALLOW, _sealed_key(d), body=body, read=True,
                                     note=f"A creates a stored response ({'streamed' if stream else 'JSON'})")
            wrong = [(b, sealed, "B names A's response"), (b, PROBE_ID, "B names the raw id"),
                     (b, FORGED, "B names a forged seal"), (a, PROBE_ID, "A names the raw id"),
                     (a, FORGED, "A names a forged seal")]
            for cred, value, note in wrong:
                if value:
                    yield from self._naming(ctx, d, cred, vantage, value, note, deny=True)
            if sealed:
                yield from self._naming(ctx, d, a, vantage, sealed, "A names its own response", deny=False)

    def _naming(self, ctx: CheckContext, d: Decision, cred: Credential, vantage: Vantage, value: str,
                note: str, deny: bool) -> Iterator[Case]:
        if d.owner_param:
            target = "/".join(value if i == d.owner_segment else part
                              for i, part in enumerate(d.path.split("/")))
            exp = Expectation("deny", ("not-owner",)) if deny else ALLOW
            yield self._case(ctx, d, cred, vantage, exp, _key(d), target=target, note=note)
        for name in d.owner_fields:
            exp = Expectation("deny", (f"not-owner:{name}",)) if deny else ALLOW
            body = {"input": "ownership probe", "max_output_tokens": 1, name: value}
            yield self._case(ctx, d, cred, vantage, exp, _key(d), body=body, note=f"{note} ({name})")

    def _case(self, ctx: CheckContext, d: Decision, cred: Credential, vantage: Vantage, exp: Expectation,
              subject: str, *, target: str | None = None, body: dict[str, object] | None = None,
              read: bool = False, note: str = "") -> Case:
        # only creating acts: a case naming PROBE_ID (a cancel, previous_response_id) meets vLLM's 404
        changes = d.method == "POST" and read
        case = ctx.case(self.id, d.method, d.path, cred, vantage, "witness" if exp.expected == "allow"
                        else "variant", subject=subject, exp=exp, target=target, note=note,
                        state_changing=changes)
        if changes and not ctx.options.allow_state_changes:
            return replace(case, skip=NOT_SENT)
        if body is not None:
            case = replace(case, body=json.dumps(body).encode(), json_body=True,
                           headers=(("Content-Type", "application/json"),))
        return replace(case, read_answer=read)

    def review(self, ctx: CheckContext, case: Case, attempt: Attempt) -> Attempt:
        if case.expected != "allow" or attempt.verdict != "proved":
            return attempt
        if case.read_answer and attempt.status != 200:   # (an engine-less vLLM's 500, say)
            return replace(attempt, verdict="inconclusive",
                           why=f"no stored response was created (status {attempt.status}): no id to check")
        why = (self._answer_why(ctx, case, attempt) if case.read_answer
               else self._upstream_why(ctx, case, attempt))
        return replace(attempt, verdict="failed", why=why) if why else attempt

    def _answer_why(self, ctx: CheckContext, case: Case, a: Attempt) -> str:
        """Why A's created answer is not sealed to A ("" it is): a raw response id, a seal not A's."""
        text = a.answer_body
        docs = [text] + [line[5:] for line in text.split("\n") if line.startswith("data:")]
        found = list(dict.fromkeys([*RESP.findall(text), *(i for t in docs for i in _ids(t))]))
        if not found:
            return "the answer carried no response id to check"
        secret = ctx.options.owner_secret.encode()
        who = principal_of(ctx, case.credential)
        for value in found:
            if owner.SEPARATOR not in value:
                return f"a response id left unsealed ({value})"
            if secret and owner.unseal(secret, who, value) is None:
                return f"a response id sealed to someone else than its principal ({value})"
        return ""

    def _upstream_why(self, ctx: CheckContext, case: Case, a: Attempt) -> str:
        """Why what reached the upstream for A's own id is not vLLM's own id ("" it is)."""
        seen = a.upstream
        if seen is None:
            return ""
        if owner.SEPARATOR in seen.path or (seen.body and owner.SEPARATOR + "A" in seen.body):
            return f"the upstream received the sealed id ({seen.path})"
        d = ctx.decision(case.method, case.path)
        if d is not None and d.owner_param and not seen.path.endswith("/" + PROBE_ID) and \
                f"/{PROBE_ID}/" not in seen.path:
            return f"the upstream received {seen.path!r}, not vLLM's id {PROBE_ID}"
        if d is not None and d.owner_fields and seen.body is not None:
            try:
                doc = json.loads(seen.body)
            except ValueError:
                return ""
            for name in d.owner_fields:
                if isinstance(doc, dict) and doc.get(name) not in (None, PROBE_ID):
                    return f"the upstream received {name} {doc.get(name)!r}, not vLLM's id {PROBE_ID}"
        return ""

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged: list[tuple[str, Attempt]] = []
        for c, a in results:
            if a.verdict != "failed":
                continue
            reached = a.outcome == "reached" or a.upstream is not None
            flagged.append(("VP020" if c.expected == "deny" or reached else "VP006", a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            whys = "; ".join(sorted({f"{a.note}: {a.why or a.error or a.status}" for a in attempts}))
            yield make(rule, attempts, f"Stored responses and their owners: {whys}.", extra=self.id)
