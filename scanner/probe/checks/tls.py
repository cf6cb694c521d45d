"""The listener's TLS: on an https target, one handshake per offer of
:data:`scanner.probe.send.OFFERS` (TLS 1.0 alone, TLS 1.1 alone, TLS 1.2 with broken cipher suites
only), each on a fresh connection, each of which the listener must refuse: the generated configs
speak TLS 1.2 and 1.3 (NGINX ``ssl_protocols TLSv1.2 TLSv1.3``, Envoy
``tls_minimum_protocol_version: TLSv1_2``) with their library's default suites. A handshake that
is answered by the upstream fails the subject (VP022); one this host's TLS library cannot offer
is not proven, and says so (scanner.probe.send.CANNOT_OFFER)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.probe.cases import Case
from scanner.probe.coverage import Subject, na
from scanner.probe.findings import make
from scanner.probe.interface import Finding
from scanner.probe.registry import BaseCheck, CheckContext, Results, register
from scanner.probe.send import OFFERS
from scanner.probe.verdict import TLS_OFFER

PLAIN = "the target is plain HTTP: no TLS listener to offer old versions or weak suites to"
INJECTED = "needs real connections: an injected transport has no TLS handshake"


def _key(offer: str) -> str:
    return f"tls {offer}"


@register
class Tls(BaseCheck):
    """Legacy TLS versions and broken cipher suites refused in the handshake."""

    id: ClassVar[str] = "tls"
    title: ClassVar[str] = "TLS versions and cipher suites of the listener"
    stable: ClassVar[bool] = True

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        why = PLAIN if ctx.target.url.scheme != "https" else INJECTED if ctx.options.transport_factory else ""
        for offer in OFFERS:
            yield na(_key(offer), why) if why else Subject(_key(offer), "*", "*")

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        if ctx.target.url.scheme != "https" or ctx.options.transport_factory:
            return
        ranked = sorted(ctx.plan.allowed, key=lambda d: (d.state_changing, d.method != "GET", d.path))
        d = next((d for d in ranked if d.kind == "http" and ctx.allowed_cell(d)), None)
        if d is None:
            return
        cred, vantage = ctx.allowed_cell(d) or (None, None)
        assert cred is not None and vantage is not None
        for offer in OFFERS:
            case = ctx.case(self.id, d.method, d.path, cred, vantage, "variant", subject=_key(offer),
                            note=f"a handshake offering {offer} only")
            yield replace(case, tls_offer=offer, expected="deny", reasons=(TLS_OFFER,))

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        bad = [a for _c, a in results if a.verdict == "failed"]
        if bad:
            whys = "; ".join(sorted({a.why for a in bad}))
            yield make("VP022", bad, f"Legacy TLS accepted: {whys}.", extra=self.id)
