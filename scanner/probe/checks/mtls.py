"""Client certificates (``auth: cert``, issue 20): on every allowed route of a cert audience, from
a vantage inside its networks: no certificate (401 cert-missing), one from another CA and an
expired one (refused by the listener: the TLS handshake, or 401 cert-invalid), one naming no
principal (403 cert-unknown), a principal of a role the route does not admit (403 role): all
refused; a certificate principal of an admitted role is admitted, the witness seeing its name in
the principal header.

The expired and unknown certificates, and the principals' own, need the listener's CA
(``probe --cert-ca CERT,KEY``; verify: its test CA). Without it the ``--cert`` certificates are
sent (each where its role is or is not admitted) and what needs the CA is not proven: VP011."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.plan.credential import judge_certificate
from scanner.plan.model import Decision
from scanner.policy.model import CertPrincipal
from scanner.probe import certs_cases
from scanner.probe.cases import Case
from scanner.probe.checks.identity import CredentialCheck, vantage_for
from scanner.probe.expect import ALLOW, Expectation
from scanner.probe.interface import Credential
from scanner.probe.registry import CheckContext, register
from scanner.probe.testca import TestCa

NO_CA = ("no --cert-ca (the listener's client CA and its key) and no --cert of a role the route admits: "
         "the admitted certificate is not sent")


def routes(ctx: CheckContext) -> list[Decision]:
    return [d for d in ctx.plan.allowed if d.auth == "cert" and d.kind == "http"]


def _admits(d: Decision, role: str) -> bool:
    return not d.roles or role in d.roles


def _issued(label: str, p: CertPrincipal | None, files: certs_cases.Issued) -> Credential:
    return Credential(label=f"cert:{label}", kind="cert", role=p.role if p else "",
                      principal=p.name if p else "", cert_file=files.cert, key_file=files.key)


def _cases(ctx: CheckContext, d: Decision) -> Iterator[tuple[Credential, Expectation]]:
    """(credential, expectation) of one route's certificate cases."""
    admitted = next((c for c in ctx.plan.certs if _admits(d, c.role)), None)
    other = next((c for c in ctx.plan.certs if not _admits(d, c.role)), None)
    yield Credential(label="cert:none", kind="none"), Expectation("deny", ("cert-missing",))
    invalid = Expectation("deny", ("cert-invalid",))
    foreign = _issued("other-ca", admitted, certs_cases.other_ca(admitted))
    yield replace(foreign, refused_in_handshake=True), invalid
    spec = ctx.options.cert_ca
    if spec:
        ca = certs_cases.listener_ca(spec)
        if admitted is not None:
            expired = _issued("expired", admitted, certs_cases.issued(ca, admitted, expired=True))
            yield replace(expired, refused_in_handshake=True), invalid
            yield _issued(f"principal:{admitted.name}", admitted, certs_cases.issued(ca, admitted)), ALLOW
        yield _issued("unknown", None, certs_cases.unknown(ca)), Expectation("deny", ("cert-unknown",))
        yield from _revoked_san(ctx, d, ca)
        if other is not None:
            yield (_issued(f"principal:{other.name}", other, certs_cases.issued(ca, other)),
                   Expectation("deny", ("role",)))
    for cred in ctx.credentials:
        if cred.kind != "cert":
            continue
        if not cred.principal:
            yield cred, Expectation("deny", ("cert-unknown",))
        elif _admits(d, cred.role):
            yield cred, ALLOW
        else:
            yield cred, Expectation("deny", ("role",))


def _revoked_san(ctx: CheckContext, d: Decision, ca: TestCa) -> Iterator[tuple[Credential, Expectation]]:
    """A certificate whose URI SAN is not listed (a revoked SPIFFE ID) and whose subject is a listed
    subject principal's (one the route admits, if any): refused as the reference judges it
    (cert-unknown: a certificate with a URI SAN is named by it alone, never by its subject)."""
    listed = sorted((c for c in ctx.plan.certs if c.subject), key=lambda c: (not _admits(d, c.role), c.name))
    if not listed:
        return
    p = listed[0]
    v = judge_certificate(ctx.plan.certs, True, True, (certs_cases.REVOKED_SAN,), p.subject, d.roles)
    if not v.admitted:
        yield (_issued(f"revoked-san:{p.name}", None, certs_cases.revoked(ca, p)),
               Expectation("deny", (v.reason,)))


@register
class Mtls(CredentialCheck):
    """Per route of an auth "cert" audience: every certificate case refused with its reason, a
    certificate principal of an admitted role admitted with its name."""

    id: ClassVar[str] = "mtls"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "client certificates (auth: cert): refusals and the admitted principal"
    refused_rule: ClassVar[str] = "VP021"
    sent: ClassVar[str] = "Client certificates on an auth: cert route"
    noun: ClassVar[str] = "certificate"

    def routes(self, ctx: CheckContext) -> list[Decision]:
        return routes(ctx)

    def unsent(self, ctx: CheckContext, d: Decision) -> str:
        return "" if any(exp is ALLOW for _c, exp in _cases(ctx, d)) else NO_CA

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for d in routes(ctx):
            vantage = vantage_for(ctx, d)
            if vantage is None:
                continue
            refused, admitted = self.subject_names(d)
            for cred, exp in _cases(ctx, d):
                allow = exp is ALLOW
                yield ctx.case(self.id, d.method, d.path, cred, vantage, "witness" if allow else "variant",
                               subject=admitted if allow else refused, exp=exp, note=cred.label)
