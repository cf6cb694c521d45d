"""Bearer tokens (``auth: jwt``, issue 20): on every allowed route of a jwt audience, from a
vantage inside its networks, each token case (scanner/probe/tokens_jwt.py) is refused with its
reason (no token, expired, not yet valid, another issuer, another audience, ``alg: none``, HS256
keyed with the RSA public key, a kid not in the JWKS, a tampered payload, an oversized token, a
missing required claim, a role not mapped), and a valid one is admitted: the upstream answers,
the witness sees the token's principal (``jwt:ID:CLAIM``, scanner/plan/jwt.py) in the principal
header and never the token itself; so does a valid token whose principal claim is a key or
certificate principal's name (one principal namespace: never named as that principal).

The cases that need a signature (the valid token among them) need the issuer's private key
(``probe --jwt-signing-key``; verify: its test issuer's). Without it the refusals that need
none are proven, and the admission is not: VP011."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

from scanner.errors import UsageError
from scanner.plan import jwt as plan_jwt
from scanner.plan.model import Decision
from scanner.policy.jwt import JwtAuth
from scanner.policy.keys import fingerprint
from scanner.probe import tokens_jwt
from scanner.probe.cases import Case
from scanner.probe.checks.upstream import failed_on_problems, problem_rules
from scanner.probe.coverage import Subject
from scanner.probe.expect import ALLOW, Expectation, in_networks
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Credential, Finding, Vantage
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

SUBJECT = "perimeter-probe"
NO_KEY = ("no --jwt-signing-key whose public key is in the audience's JWKS: the signed cases "
          "(the valid token admitted, expired, issuer, audience, kid, tampered, claims) are not sent")


def routes(ctx: CheckContext) -> list[Decision]:
    return [d for d in ctx.plan.allowed if d.jwt is not None and d.kind == "http"]


def role_for(d: Decision) -> str:
    """A role the route admits that a token of its audience can have."""
    t = d.jwt
    assert t is not None
    given = sorted({*t.roles.values(), *((t.role,) if t.role else ())})
    return next((r for r in given if not d.roles or r in d.roles), given[0] if given else "")


_SIGNERS: dict[tuple[str, tuple[str, ...]], tokens_jwt.Signer | None] = {}


def _signer(path: str, t: JwtAuth) -> tokens_jwt.Signer | None:
    """The signer of ``path`` for the audience whose JWKS is ``t.keys`` (None: its public key is
    not there, or the file is not a key), read once per key file and JWKS."""
    key = (path, tuple(k.spki for k in t.keys))
    if key not in _SIGNERS:
        try:
            _SIGNERS[key] = tokens_jwt.signer_from_file(path, t)
        except UsageError:
            _SIGNERS[key] = None
    return _SIGNERS[key]


def signer(ctx: CheckContext, d: Decision) -> tokens_jwt.Signer | None:
    path = ctx.options.jwt_signing_key
    return _signer(path, d.jwt) if path and d.jwt is not None else None


def vantage_for(ctx: CheckContext, d: Decision) -> Vantage | None:
    return next((v for v in ctx.vantages if in_networks(ctx.source_address(v), d.networks)), None)


class CredentialCheck(BaseCheck):
    """A check of one kind of credential on the routes that take it: every credential the route
    must refuse is refused (:attr:`refused_rule` otherwise), and the admitted one is admitted with
    what reaches the upstream as the plan says (scanner.probe.checks.upstream.problems)."""

    refused_rule: ClassVar[str] = ""
    sent: ClassVar[str] = ""        # what the findings say was sent: "Bearer tokens on an auth: jwt route"
    noun: ClassVar[str] = ""        # the credential in the subjects' names: "token", "certificate"

    def routes(self, ctx: CheckContext) -> list[Decision]:
        """The routes that take this kind of credential."""
        raise NotImplementedError

    def unsent(self, ctx: CheckContext, d: Decision) -> str:
        """Why the admitted credential of ``d`` is not sent ("": it is)."""
        raise NotImplementedError

    def subject_names(self, d: Decision) -> tuple[str, str]:
        """The subjects of one route: its refusals, and its admitted credential."""
        return (f"{self.noun} refusals {d.method} {d.path}", f"{self.noun} admitted {d.method} {d.path}")

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for d in self.routes(ctx):
            refused, admitted = self.subject_names(d)
            if vantage_for(ctx, d) is None:
                why = f"no vantage inside its networks ({', '.join(d.networks)})"
                yield Subject(refused, d.method, d.path, why=why)
                yield Subject(admitted, d.method, d.path, why=why)
                continue
            yield Subject(refused, d.method, d.path)
            yield Subject(admitted, d.method, d.path, why=self.unsent(ctx, d))

    def review(self, ctx: CheckContext, case: Case, attempt: Attempt) -> Attempt:
        if case.expected != "allow" or attempt.verdict != "proved":
            return attempt
        return failed_on_problems(ctx, case, attempt)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged: list[tuple[str, Attempt]] = []
        for c, a in results:
            if a.verdict != "failed":
                continue
            if c.expected == "deny":
                flagged.append((self.refused_rule, a))
            else:
                flagged += [(r, a) for r in problem_rules(ctx, c, a)] or [("VP006", a)]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            whys = "; ".join(sorted({f"{a.note}: {a.why or a.error or a.status}" for a in attempts}))
            yield make(rule, attempts, f"{self.sent}: {whys}.", extra=self.id)


@register
class Identity(CredentialCheck):
    """Per route of an auth "jwt" audience: every token case refused with its reason, a valid
    token admitted with its principal (the token never reaching the upstream)."""

    id: ClassVar[str] = "identity"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "bearer tokens (auth: jwt): refusals and the admitted principal"
    refused_rule: ClassVar[str] = "VP019"
    sent: ClassVar[str] = "Bearer tokens on an auth: jwt route"
    noun: ClassVar[str] = "token"

    def routes(self, ctx: CheckContext) -> list[Decision]:
        return routes(ctx)

    def unsent(self, ctx: CheckContext, d: Decision) -> str:
        return "" if signer(ctx, d) else NO_KEY

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for d in routes(ctx):
            vantage = vantage_for(ctx, d)
            t = d.jwt
            if vantage is None or t is None:
                continue
            refused, admitted = self.subject_names(d)
            role = role_for(d)
            who = f"{SUBJECT}-{role}"
            named = plan_jwt.principal(t, t.issuers[0], who)
            for tc in tokens_jwt.cases(t, role, signer(ctx, d), who):
                cred = Credential(label=f"jwt:{tc.name}", kind="token" if tc.token else "none", role=role,
                                  secret=tc.token, fingerprint=fingerprint(tc.token) if tc.token else "",
                                  audiences=(d.audience,) if not tc.expect else (), principal=named,
                                  scheme=tc.scheme)
                exp = ALLOW if not tc.expect else Expectation("deny", (tc.expect,))
                yield ctx.case(self.id, d.method, d.path, cred, vantage,
                               "witness" if not tc.expect else "variant",
                               subject=admitted if not tc.expect else refused, exp=exp, note=tc.name)
            yield from self._namesake(ctx, d, vantage, role)

    def _namesake(self, ctx: CheckContext, d: Decision, vantage: Vantage, role: str) -> Iterator[Case]:
        """One principal namespace: a valid token whose principal claim is a key (or certificate)
        principal's name is admitted as its own principal (jwt:ID:NAME), never as that one: the
        witness must see the token principal in the principal header (VP014 otherwise)."""
        sign, t = signer(ctx, d), d.jwt
        name = min([p.name for p in ctx.plan.principals] + [c.name for c in ctx.plan.certs], default="")
        if sign is None or t is None or not name:
            return
        token = sign.sign(tokens_jwt.valid_claims(t, role, name))
        cred = Credential(label="jwt:namesake", kind="token", role=role, secret=token,
                          fingerprint=fingerprint(token), audiences=(d.audience,),
                          principal=plan_jwt.principal(t, t.issuers[0], name))
        yield ctx.case(self.id, d.method, d.path, cred, vantage, "witness", subject=self.subject_names(d)[1],
                       exp=ALLOW, note=f"a subject named as the principal {name!r}")
