"""Near-miss keys: a key check weakened so that it admits a string that is not a key.

The matrix sends one random wrong key; a key check weakened by hand (the bearer's sha256 hex taken
as its own digest, only a prefix of the bearer hashed, the last character ignored, a
case-insensitive compare) refuses that and still admits strings close to a real key. For each key
the probe was given (``--key``), on one allowed route of each ``auth: key`` audience and from a
vantage inside its networks, every near-miss form of that key (scanner/probe/key_forms.py: its
sha256 hex in lower and upper case, the key with its last character dropped, one character
appended, its last or first character changed, its case swapped, its first half, the key twice,
its principal's name) must be refused as an unknown key (401 ``unknown-key``). Admitted (the
upstream answered) or refused only by a later check (``role``, a body reason: the key check let
it past) fails the case: VP001.

Bounded: forms x keys x key audiences (10 x 3 x 3 with the bundled policy and verify's keys),
refused before any limiter. A form is named in its case ("sha256-hex of role:user"), never
printed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.plan.model import Decision
from scanner.policy.keys import fingerprint
from scanner.probe import key_forms, safe
from scanner.probe.cases import Case
from scanner.probe.checks.identity import vantage_for
from scanner.probe.coverage import Subject
from scanner.probe.findings import group, make
from scanner.probe.interface import Credential, Finding
from scanner.probe.owned import principal_of
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

NO_KEY = "no --key: no real key to derive near-miss forms from"
UNSENDABLE = ("its key routes are all state-changing, with no verified non-acting request of their own "
              "method (--allow-state-changes against a staging upstream or the stand-in)")
REMEDIATION = ("Look every bearer up by the sha256 of the whole key exactly as sent: no prefix or "
               "truncation, no case folding, never a digest taken as its own hash; regenerate the "
               "proxy config and reload.")


def _keys(ctx: CheckContext) -> list[Credential]:
    return [c for c in ctx.credentials if c.kind == "role" and c.secret]


def _sendable(ctx: CheckContext, d: Decision) -> bool:
    """Can ``d`` be sent its own method (a state-changing route: a request vLLM rejects before
    acting)? Another method would be refused for it before the key is read."""
    declared = tuple(sorted({x.method for x in ctx.plan.routes().get(d.path, ())}))
    req = safe.safe_request(d.method, d.path, declared, d.state_changing, ctx.options.allow_state_changes)
    return req is not None and req.method == d.method


def routes(ctx: CheckContext) -> dict[str, Decision]:
    """One allowed HTTP route per ``auth: key`` audience: sendable with its own method first, then
    not state-changing, bodiless (GET, HEAD), a path without parameters, by path."""
    out: dict[str, Decision] = {}
    order = sorted((d for d in ctx.plan.allowed if d.auth == "key" and d.kind == "http"),
                   key=lambda d: (d.audience, not _sendable(ctx, d), d.state_changing,
                                  d.method not in ("GET", "HEAD"), "{" in d.path, d.path, d.method))
    for d in order:
        out.setdefault(d.audience, d)
    return out


def subject_of(audience: str, d: Decision) -> str:
    """The subject names the one route the forms go to: what it proves is that route's key check
    (the lookup every route of the proxy shares), not each route of the audience."""
    return f"near-miss keys {audience} via {d.method} {d.path}"


@register
class NearMiss(BaseCheck):
    """Per ``auth: key`` audience: every near-miss form of every given key refused as unknown."""

    id: ClassVar[str] = "near-miss"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "near-miss forms of the given keys (sha256 hex, a character off, case): refused"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        keys = _keys(ctx)
        for audience, d in routes(ctx).items():
            why = "" if keys else NO_KEY
            if not why and vantage_for(ctx, d) is None:
                why = f"no vantage inside its networks ({', '.join(d.networks)}): add a --vantage there"
            if not why and not _sendable(ctx, d):
                why = UNSENDABLE
            yield Subject(subject_of(audience, d), d.method, d.path, why=why)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        keys = _keys(ctx)
        real = {p.key_sha256 for p in ctx.plan.principals}    # a form that is a real key is left out,
        given = {c.secret for c in ctx.credentials if c.secret}   # and one that is a given credential
        near = [(cred, form) for cred in keys
                for form in key_forms.forms(cred.secret, principal_of(ctx, cred), real)
                if form.value not in given]
        for audience, d in routes(ctx).items():
            vantage = vantage_for(ctx, d)
            if vantage is None or not _sendable(ctx, d):
                continue
            for cred, form in near:
                label = f"{form.name} of {cred.label}"
                miss = Credential(label=label, kind="wrong", role=cred.role, secret=form.value,
                                  fingerprint=fingerprint(form.value))
                long = ("missing-key",) if len(form.value) > key_forms.BEARER_MAX else ()
                yield ctx.case(self.id, d.method, d.path, miss, vantage, "variant",
                               subject=subject_of(audience, d), note=label, extra_reasons=long)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [("VP001", a) for c, a in results if c.expected == "deny" and a.verdict == "failed"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            whys = "; ".join(sorted({f"{a.credential}: {a.why or a.error or a.status}" for a in attempts}))
            found = make(rule, attempts, "A string close to a real API key was taken for a key (the "
                         "key check compares less than the whole key, or takes the stored digest itself): "
                         f"{whys}.",
                         title="a near-miss of a real API key was accepted", extra=self.id)
            yield replace(found, remediation=REMEDIATION)
