"""What reached the upstream: the normalised path (never the raw target), no client key, no
spoofable or hop-by-hop header, the principal header set by the key check alone. With a
witness upstream each allowed request is compared with what it recorded; without one only
the path can be judged (by the upstream's 404 for a raw dot-segment target), on a sample."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.plan.model import (
    DECISION_HEADER,
    PRINCIPAL_HEADER,
    REASON_HEADER,
    VLLM_REQUEST_HEADERS,
    Decision,
)
from scanner.probe.cases import Case, concrete
from scanner.probe.coverage import Subject, na
from scanner.probe.expect import in_networks
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Finding
from scanner.probe.registry import BaseCheck, CheckContext, Results, register
from scanner.probe.witness import CONNECTION_NAMED
from scanner.reasons import ANY

NO_WITNESS = "needs a witness upstream (verify, or --witness with the stand-in)"
# Harmless spellings of an allowed path that a normalising proxy forwards as the path itself.
NORMALISE_VARIANTS: tuple[tuple[str, str], ...] = (
    ("dot segments /x/..", "/probe-x/..{path}"),
    ("dot segment /.", "/.{path}"),
)
MAX_SAMPLED = 4                # without a witness: routes sampled for the path


def failed(a: Attempt, why: str) -> Attempt:
    return replace(a, verdict="failed", why=why)


# --- the upstream's view of one allowed request ---------------------------------------------

SPOOF_VALUE = "198.51.100.7"   # TEST-NET-2: never a real client
HOSTILE: tuple[tuple[str, str], ...] = (
    ("X-Forwarded-For", SPOOF_VALUE), ("X-Real-IP", SPOOF_VALUE), ("Forwarded", f"for={SPOOF_VALUE}"),
    ("X-Forwarded-Host", "probe.invalid"), ("X-Forwarded-Proto", "gopher"), ("X-Forwarded-Port", "6666"),
    ("X-Forwarded-Prefix", "/probe-prefix"), ("X-Original-URL", "/probe-original"),
    ("X-Rewrite-URL", "/probe-rewrite"), ("X-Original-Method", "PROBE"), ("X-HTTP-Method-Override", "PROBE"),
    ("X-HTTP-Method", "PROBE"), ("X-Method-Override", "PROBE"),
    (PRINCIPAL_HEADER, "probe-mallory"), (DECISION_HEADER, "allow-probe"), (REASON_HEADER, "probe"),
    ("Proxy-Authorization", "Bearer vp-probe-proxy-credential"), ("Proxy-Connection", "vp-probe"),
    ("TE", "vp-probe"), ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"), (CONNECTION_NAMED, "vp-probe"),
    ("Connection", f"close, {CONNECTION_NAMED}"),
    *((name, f"vp-probe-{i}") for i, name in enumerate(VLLM_REQUEST_HEADERS)),
)
# Client-chosen values a trusted proxy may legitimately pass on (X-Forwarded-* from trusted peers).
TRUSTED_PASS = frozenset({"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port",
                          "x-forwarded-prefix"})
UPGRADE: tuple[tuple[str, str], ...] = (
    ("Upgrade", "websocket"), ("Connection", "close, Upgrade"), ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Key", "dnAtcGVyaW1ldGVyLXByb2Jl"),
)


def problems(ctx: CheckContext, case: Case, a: Attempt) -> list[tuple[str, str]]:
    """(rule, what) for what reached the upstream that must not have, for one allowed request."""
    seen = a.upstream
    if seen is None or case.expected != "allow":
        return []
    out: list[tuple[str, str]] = []
    want_path = concrete(case.path)
    if seen.path != want_path:
        out.append(("VP010", f"the upstream received the path {seen.path!r}, not the normalised "
                    f"{want_path!r}"))
    auth = seen.header("authorization")
    if auth is not None and case.credential.fingerprint and auth == case.credential.fingerprint:
        out.append(("VP012", "the client's API key reached the upstream (Authorization)"))
    if ctx.plan.upstream.api_key_file:
        if auth is None:
            out.append(("VP016", "no Authorization reached the upstream (vLLM's key not presented)"))
        elif ctx.options.upstream_key and auth != ctx.options.upstream_key:
            out.append(("VP016", "the upstream received another Authorization than vLLM's key"))
    if seen.header("proxy-authorization") is not None:
        out.append(("VP012", "Proxy-Authorization reached the upstream"))
    trusted = in_networks(ctx.source_address(case.vantage), ctx.plan.trusted_proxies) \
        if ctx.plan.trusted_proxies else False
    sent = {k.lower(): v for k, v in case.headers}
    for name, value in sent.items():
        if name in ("connection", PRINCIPAL_HEADER.lower()) or (trusted and name in TRUSTED_PASS):
            continue
        got = seen.header(name)
        if got is not None and value.split(",")[0].strip() in got:
            out.append(("VP013", f"{name}: {got!r} reached the upstream as the client sent it"))
    principal = seen.header(PRINCIPAL_HEADER.lower()) or ""
    d = ctx.decision(case.method, case.path)
    want = ""
    if d is not None and d.auth == "key":
        want = next((p.name for p in ctx.plan.principals if p.fingerprint == case.credential.fingerprint), "")
    if principal != want:
        out.append(("VP014", f"{PRINCIPAL_HEADER} reached the upstream as {principal!r}, expected {want!r}"))
    return out


@register
class Upstream(BaseCheck):
    """What reaches the upstream for every allowed route.

    With a witness: one request per route spelled with dot segments and carrying spoofable,
    hop-by-hop and perimeter headers, and one asking for a WebSocket upgrade. The upstream
    must receive the normalised path, none of those headers as sent, never the client's
    key, and the principal header only as the key check set it.

    Without a witness only the path can be judged, on a sample of routes: a proxy that
    forwards the raw target makes the upstream route ``/./v1/models`` itself (Starlette:
    404) while the plain request works.
    """

    id: ClassVar[str] = "upstream"
    title: ClassVar[str] = "what the upstream receives"

    def _routes(self, ctx: CheckContext) -> list[tuple[Decision, str, bool]]:
        """(decision, subject key, sent) per allowed route; without a witness a sample is sent."""
        out, picked = [], 0
        for d in ctx.plan.allowed:
            if d.kind == "mount":
                continue
            sent = ctx.witness or (d.kind == "http" and not d.state_changing and picked < MAX_SAMPLED
                                   and ctx.allowed_cell(d) is not None)
            picked += sent and not ctx.witness
            out.append((d, f"upstream view {d.method} {d.path}", sent))
        return out

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for d, key, sent in self._routes(ctx):
            if not sent:
                yield na(key, f"{NO_WITNESS}; without one, {MAX_SAMPLED} routes are sampled for the path "
                         "only (by the upstream's 404)", d.method, d.path)
            else:
                yield Subject(key, d.method, d.path,
                              why="" if ctx.allowed_cell(d) else "no credential and vantage it admits")

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        turn = 0
        for d, key, sent in self._routes(ctx):
            cells = ctx.allowed_cells(d)
            if not sent or not cells:
                continue
            cred, vantage = cells[turn % len(cells)]   # several principals: their limiters in parallel
            turn += 1
            real = concrete(d.path)
            if not ctx.witness:
                yield ctx.case(self.id, d.method, d.path, cred, vantage, "declared", subject=key,
                               note="baseline")
                for note, form in NORMALISE_VARIANTS:
                    yield ctx.case(self.id, d.method, d.path, cred, vantage, "variant", subject=key,
                                   target=form.format(path=real), raw=True, note=note)
                continue
            note, form = NORMALISE_VARIANTS[0]
            yield ctx.case(self.id, d.method, d.path, cred, vantage, "witness", subject=key, raw=True,
                           target=form.format(path=real), headers=HOSTILE,
                           note=f"{note}; spoofable, hop-by-hop and perimeter headers")
            if d.kind == "http":
                c = ctx.case(self.id, d.method, d.path, cred, vantage, "witness", subject=key, raw=True,
                             note="WebSocket upgrade on a plain route", headers=UPGRADE)
                yield replace(c, reasons=(ANY,))   # refusing the upgrade outright is fine too

    def review(self, ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
        found = problems(ctx, case, a)
        return failed(a, "; ".join(what for _r, what in found)) if found else a

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        routed = {(a.method, a.path, a.vantage) for c, a in results
                  if c.role == "declared" and a.outcome == "reached" and a.status != 404}
        flagged: list[tuple[str, Attempt]] = []
        for c, a in results:
            found = problems(ctx, c, a)
            flagged += [(rule, a) for rule in dict.fromkeys(r for r, _w in found)]
            guessed = (c.role == "variant" and a.upstream is None and a.layer == "upstream"
                       and a.status == 404 and (a.method, a.path, a.vantage) in routed)
            if guessed:
                flagged.append(("VP010", a))
            elif not found and a.verdict == "failed":
                flagged.append(("VP015" if a.outcome == "reached" else "VP006", a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            whys = "; ".join(sorted({a.why for a in attempts if a.why}))
            if rule == "VP010" and not whys:
                whys = ("the perimeter let a dot-segment spelling through but the upstream did not route "
                        "it (404): the proxy forwards the raw request target")
            yield make(rule, attempts, f"What the upstream received: {whys}.", extra="upstream")
