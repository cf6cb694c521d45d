"""What reached the upstream: the normalised path (never the raw target), no client key, no
spoofable or hop-by-hop header, the principal header set by the key check alone. With a
witness upstream each allowed request is compared with what it recorded; without one only
the path can be judged (by the upstream's 404 for a raw dot-segment target), on a sample."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner import patterns
from scanner.plan.model import (
    DECISION_HEADER,
    PRINCIPAL_HEADER,
    REASON_HEADER,
    VLLM_REQUEST_HEADERS,
    Decision,
)
from scanner.probe import forms
from scanner.probe.cases import PARAM_VALUE, Case, concrete
from scanner.probe.checks.access import VARIANT_REASONS
from scanner.probe.coverage import Subject, na
from scanner.probe.expect import Expectation, in_networks
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Credential, Finding, Vantage
from scanner.probe.interface import WitnessRecord as Seen
from scanner.probe.registry import BaseCheck, CheckContext, Results, register
from scanner.probe.safe import NEUTRAL_JSON
from scanner.probe.witness import CONNECTION_NAMED, UNDERSCORED
from scanner.reasons import ANY
from scanner.witness_asgi import LEAK_MARKER, error_body

NO_WITNESS = "needs a witness upstream (verify, or --witness with the stand-in)"
# Harmless spellings of an allowed path that a normalising proxy forwards as the path itself.
NORMALISE_VARIANTS: tuple[tuple[str, str], ...] = (
    ("dot segments /x/..", "/probe-x/..{path}"),
    ("dot segment /.", "/.{path}"),
)
MAX_SAMPLED = 4                # without a witness: routes sampled for the path


def failed(a: Attempt, why: str) -> Attempt:
    return replace(a, verdict="failed", why=why)


def resent(arrivals: int) -> str:
    return (f"the upstream received this one request {arrivals} times: the proxy resent it (the plan "
            "forwards a request once; vLLM would do its work again)")


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
    *((name, f"vp-probe-underscore-{i}") for i, name in enumerate(UNDERSCORED)),
)
# Client-chosen values a trusted proxy may legitimately pass on (X-Forwarded-* from trusted peers).
TRUSTED_PASS = frozenset({"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port",
                          "x-forwarded-prefix"})
# The client's Host and an absolute-form target's host: vLLM must get the plan's Host instead.
CLIENT_HOST = "probe-client-host.invalid"
ABSOLUTE_HOST = "probe-absolute-form.invalid"
UPGRADE: tuple[tuple[str, str], ...] = (
    ("Upgrade", "websocket"), ("Connection", "close, Upgrade"), ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Key", "dnAtcGVyaW1ldGVyLXByb2Jl"),
)


UPGRADE_NOTE = "WebSocket upgrade on a plain route"


def problems(ctx: CheckContext, case: Case, a: Attempt) -> list[tuple[str, str]]:
    """(rule, what) for what reached the upstream that must not have, for one allowed request."""
    seen = a.upstream
    if seen is None or case.expected != "allow":
        return []
    out: list[tuple[str, str]] = []
    if seen.arrivals > 1:
        out.append(("VP015", resent(seen.arrivals)))
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
    out += identity(ctx, case, seen, trusted)
    for name, value in sent.items():
        if name in ("connection", "host", "x-forwarded-for", PRINCIPAL_HEADER.lower()) or \
                (trusted and name in TRUSTED_PASS):
            continue
        got = seen.header(name)
        if got is not None and value.split(",")[0].strip() in got:
            out.append(("VP013", f"{name}: {got!r} reached the upstream as the client sent it"))
    principal = seen.header(PRINCIPAL_HEADER.lower()) or ""
    d = ctx.decision(case.method, case.path)
    want = ""
    if d is not None and d.auth == "key":
        want = next((p.name for p in ctx.plan.principals if p.fingerprint == case.credential.fingerprint), "")
    elif d is not None and ((d.auth == "jwt" and case.credential.kind == "token")
                            or (d.auth == "cert" and case.credential.kind == "cert")):
        want = case.credential.principal
    if principal != want:
        out.append(("VP014", f"{PRINCIPAL_HEADER} reached the upstream as {principal!r}, expected {want!r}"))
    return out


def failed_on_problems(ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
    """``a`` failed with every :func:`problems` of it, or as it was when there are none."""
    found = problems(ctx, case, a)
    return failed(a, "; ".join(what for _r, what in found)) if found else a


def problem_rules(ctx: CheckContext, case: Case, a: Attempt) -> list[str]:
    """The rules of :func:`problems`, each once, in their order."""
    return list(dict.fromkeys(rule for rule, _what in problems(ctx, case, a)))


def identity(ctx: CheckContext, case: Case, seen: Seen, trusted: bool) -> list[tuple[str, str]]:
    """(rule, what) for the proxy's own headers on one forwarded request: Host exactly the plan's
    (:attr:`scanner.plan.model.Plan.host_header`), X-Forwarded-For exactly the client address the
    proxy saw (the vantage's source; a trusted proxy's chain is the plan's to pass), X-Request-Id
    present and the proxy's own (never a value the client sent)."""
    out: list[tuple[str, str]] = []
    sent = {k.lower(): v for k, v in case.headers}
    host, want = seen.header("host"), ctx.plan.host_header
    if host != want:
        client = (CLIENT_HOST, ABSOLUTE_HOST, ctx.target.url.host)
        chosen = host is not None and any(h in host for h in client)
        out.append(("VP013" if chosen else "VP015",
                     f"Host: {host!r} reached the upstream, not the plan's {want!r}"
                     + (" (the client's)" if chosen else "")))
    source = ctx.source_address(case.vantage)
    xff = seen.header("x-forwarded-for")
    if source is not None and not trusted and not _same_address(xff, source):
        spoofed = xff is not None and "x-forwarded-for" in sent and sent["x-forwarded-for"] in xff
        out.append(("VP013" if spoofed else "VP015",
                    f"X-Forwarded-For: {xff!r} reached the upstream, not the client address {source!r}"
                    + (" (the client's value kept)" if spoofed else "")))
    rid = seen.header("x-request-id")
    if not rid:
        out.append(("VP015", "no X-Request-Id reached the upstream (the proxy sets its own)"))
    elif "x-request-id" in sent and sent["x-request-id"] in rid:
        out.append(("VP013", f"X-Request-Id: {rid!r} reached the upstream as the client sent it"))
    return out


def _same_address(value: str | None, source: str) -> bool:
    try:
        return value is not None and ipaddress.ip_address(value.strip()) == ipaddress.ip_address(source)
    except ValueError:
        return False


# --- control characters in path parameters -------------------------------------------------

# (note, parameter value) the plan's parameter pattern refuses: the proxy must refuse them (or
# the upstream would see another request line than the plan's); raw ones written byte for byte.
PARAM_VARIANTS: tuple[tuple[str, str], ...] = (
    *((f"encoded {e} in a parameter", f"probe{e}x1") for e in ("%0A", "%0D", "%00", "%0D%0A")),
    ("raw CR in a parameter", "probe\rx1"), ("raw NUL in a parameter", "probe\x00x1"),
)
PATH_SUFFIXES: tuple[str, ...] = ("%0A", "%0D%0A", "%0D", "%00")
# A raw LF ends the request line where it stands (NGINX reads the rest as HTTP/0.9, Envoy answers
# 426): no marked refusal to prove it; with a witness, proved by nothing reaching the upstream.
RAW_LF = ("raw LF in a parameter", "probe\nx1")


def _with_param(path: str, value: str) -> str:
    """``path`` with its first parameter set to ``value`` and the others to the safe value."""
    segs, done = [], False
    for s in patterns.segments(path):
        if patterns.is_param(s):
            segs.append(PARAM_VALUE if done else value)
            done = True
        else:
            segs.append(s)
    return "/" + "/".join(segs)


def _control_subject(d: Decision) -> str:
    return f"control characters {d.method} {d.path}"


# --- what the client sees of the upstream's errors -----------------------------------------

ERROR_ANSWERS: tuple[int, ...] = (500, 400)   # a 5xx must be replaced, a 4xx pass byte for byte


def _error_subject(d: Decision) -> str:
    return f"error body {d.method} {d.path}"


def error_verdict(case: Case, a: Attempt) -> Attempt:
    """A case the witness answered itself with ``case.answer`` (:func:`error_body`, whose text
    holds :data:`LEAK_MARKER`): a 5xx must reach the client as the perimeter's JSON error, the
    status kept, with the X-Request-Id the upstream received and none of the upstream's text; a
    4xx exactly as the upstream sent it."""
    if a.upstream is None:
        return replace(a, verdict="inconclusive", why="it did not reach the upstream; nothing to judge")
    if a.upstream.arrivals > 1:
        return failed(a, resent(a.upstream.arrivals))
    got = a.answer_body
    if case.answer >= 500:
        if LEAK_MARKER in got or "vp-error" in got:
            return failed(a, f"the upstream's {case.answer} text reached the client: {got[:120]!r}")
        rid = a.upstream.header("x-request-id") or ""
        if a.status != case.answer or a.decision != "error" or not rid or rid not in got:
            return failed(a, f"the upstream's {case.answer} came back as {a.status} "
                          f"(decision {a.decision or 'none'}), not the perimeter's error with the "
                          f"request id: {got[:120]!r}")
        return replace(a, verdict="proved", why=f"the upstream's {case.answer} text was replaced by the "
                       "perimeter's error with the request id")
    if a.status == case.answer and got.encode("latin-1") == error_body(case.answer, a.probe_id):
        return replace(a, verdict="proved",
                       why=f"the upstream's {case.answer} reached the client byte for byte")
    return failed(a, f"the upstream's {case.answer} answer did not reach the client unchanged "
                  f"({a.status}, decision {a.decision or 'none'}: {got[:120]!r})")


def in_forms(d: Decision, case: Case) -> Iterator[Case]:
    """``case`` once per forwarding form of ``d`` (:mod:`scanner.probe.forms`): each way the
    proxy forwards a body carries its own copy of the fact; the case as it is where there is one
    way, or where its body is not the ordinary one (a state-changing route's safe request)."""
    shapes = forms.of(d) if case.body == NEUTRAL_JSON and not case.skip else ()
    if not shapes:
        yield case
    for f in shapes:
        yield replace(case, body=f.body, note=f"{case.note}; {f.note}")


@register
class UpstreamCheck(BaseCheck):
    """What reaches the upstream for every allowed route.

    With a witness: one request per route spelled with dot segments and carrying the client's
    own Host, spoofable, hop-by-hop and perimeter headers, one with an absolute-form target
    naming another host, and one asking for a WebSocket upgrade. The upstream must receive the
    normalised path, none of those headers as sent, never the client's key, the principal
    header only as the key check set it, and the proxy's own Host (the plan's), X-Forwarded-For
    (the client address) and X-Request-Id (see :func:`identity`).

    With or without one: each route with a ``{parameter}`` gets it with CR, LF and NUL (raw
    and encoded), and its path followed by an encoded control character; the plan's parameter
    pattern refuses them all, so the proxy must.

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
        for d in self._templated(ctx):
            yield Subject(_control_subject(d), d.method, d.path,
                          why="" if ctx.allowed_cell(d) else "no credential and vantage it admits")
        for d in self._answering(ctx):
            if not ctx.witness:
                yield na(_error_subject(d), f"{NO_WITNESS}: it answers a 5xx and a 4xx itself",
                         d.method, d.path)
            else:
                yield Subject(_error_subject(d), d.method, d.path,
                              why="" if ctx.allowed_cell(d) else "no credential and vantage it admits")

    @staticmethod
    def _answering(ctx: CheckContext) -> list[Decision]:
        """The routes whose error answers are proved: every allowed HTTP route."""
        return [d for d in ctx.plan.allowed if d.kind == "http"]

    @staticmethod
    def _templated(ctx: CheckContext) -> list[Decision]:
        return [d for d in ctx.plan.allowed if d.kind != "mount" and not patterns.is_exact(d.path)]

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        turn = 0
        for d in self._templated(ctx):
            cells = ctx.allowed_cells(d)
            if cells:
                cred, vantage = cells[turn % len(cells)]
                turn += 1
                yield from self._control(ctx, d, cred, vantage)
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
            view = ctx.case(self.id, d.method, d.path, cred, vantage, "witness", subject=key, raw=True,
                            target=form.format(path=real), headers=(("Host", CLIENT_HOST), *HOSTILE),
                            note=f"{note}; the client's Host, spoofable, hop-by-hop and perimeter headers")
            yield from in_forms(d, view)
            yield ctx.case(self.id, d.method, d.path, cred, vantage, "witness", subject=key, raw=True,
                           target=f"http://{ABSOLUTE_HOST}{real}",
                           note="absolute-form target naming another host")
            if d.kind == "http":
                c = ctx.case(self.id, d.method, d.path, cred, vantage, "witness", subject=key, raw=True,
                             note=UPGRADE_NOTE, headers=UPGRADE)
                yield replace(c, reasons=(ANY,))   # refusing the upgrade outright is fine too
                for status in ERROR_ANSWERS:
                    c = ctx.case(self.id, d.method, d.path, cred, vantage, "witness",
                                 subject=_error_subject(d), note=f"the upstream answers {status} itself")
                    yield from in_forms(d, replace(c, answer=status))

    def _control(self, ctx: CheckContext, d: Decision, cred: Credential, vantage: Vantage) -> Iterator[Case]:
        """The route's parameter with CR, LF and NUL (encoded, raw) and the path with an encoded
        control character after it, from a cell the plan admits: only the path is refused."""
        exp = Expectation("deny", VARIANT_REASONS)
        real = concrete(d.path)
        forms = [(note, _with_param(d.path, value)) for note, value in PARAM_VARIANTS]
        forms += [(f"{e} after the path", real + e) for e in PATH_SUFFIXES]
        if ctx.witness:
            forms.append((RAW_LF[0], _with_param(d.path, RAW_LF[1])))
        if ctx.options.transport_factory is not None:   # tests' httpx transports: no raw bytes
            forms = [(note, target) for note, target in forms if not note.startswith("raw ")]
        for note, target in forms:
            c = ctx.case(self.id, d.method, d.path, cred, vantage, "variant", subject=_control_subject(d),
                         exp=exp, target=target, raw=True, note=note)
            yield replace(c, reasons=(ANY,)) if note == RAW_LF[0] else c

    def review(self, ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
        if case.answer:
            return error_verdict(case, a)
        if case.note == UPGRADE_NOTE and a.status is None and a.verdict == "inconclusive":
            # neither refused nor answered as HTTP/1.1: the proxy took the upgrade and waits for the
            # upgraded stream (Envoy with upgrade_configs on the route): a plain route passes upgrades
            return failed(a, f"no answer to a WebSocket upgrade on a plain route ({a.error or 'timeout'}): "
                          "the proxy accepted the upgrade instead of refusing it or serving plain HTTP/1.1")
        if case.note == RAW_LF[0]:
            return self._raw_lf(a)
        return failed_on_problems(ctx, case, a)

    @staticmethod
    def _raw_lf(a: Attempt) -> Attempt:
        """A raw LF: the witness must have no record of it and no upstream success came back."""
        if a.upstream is not None or a.verdict == "skipped":
            return a     # seen_verdict failed it already
        if a.layer == "upstream" and a.status is not None and a.status < 400:
            return failed(a, f"the upstream answered {a.status} to a request line cut at a raw LF")
        return replace(a, verdict="proved", why="the request line ended at the LF; nothing of it "
                       f"reached the upstream (witness); answer: {a.status or a.error or 'none'}")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        routed = {(a.method, a.path, a.vantage) for c, a in results
                  if c.role == "declared" and a.outcome == "reached" and a.status != 404}
        flagged: list[tuple[str, Attempt]] = []
        controls: list[tuple[str, Attempt]] = []
        for c, a in results:
            if c.subject.startswith("control characters "):
                controls += [("VP004", a)] if a.verdict == "failed" else []
                continue
            if c.answer:
                if a.verdict == "failed":
                    resent_it = a.upstream is not None and a.upstream.arrivals > 1
                    flagged.append(("VP015" if resent_it else "VP018" if c.answer >= 500 else "VP006", a))
                continue
            found = problem_rules(ctx, c, a)
            flagged += [(rule, a) for rule in found]
            guessed = (c.role == "variant" and a.upstream is None and a.layer == "upstream"
                       and a.status == 404 and (a.method, a.path, a.vantage) in routed)
            if guessed:
                flagged.append(("VP010", a))
            elif not found and a.verdict == "failed" and c.note == UPGRADE_NOTE:
                flagged.append(("VP013", a))
            elif not found and a.verdict == "failed":
                flagged.append(("VP015" if a.outcome == "reached" else "VP006", a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            whys = "; ".join(sorted({a.why for a in attempts if a.why}))
            if rule == "VP010" and not whys:
                whys = ("the perimeter let a dot-segment spelling through but the upstream did not route "
                        "it (404): the proxy forwards the raw request target")
            yield make(rule, attempts, f"What the upstream received: {whys}.", extra="upstream")
        for (rule, _m, _p, _v), attempts in group(controls).items():
            notes = ", ".join(sorted({a.note for a in attempts}))
            yield make(rule, attempts, f"A path parameter with control characters the plan's pattern refuses "
                       f"reached the upstream ({notes}): anchor the route's pattern at the very end "
                       "(NGINX: \\z, not $) and refuse CR, LF and NUL before routing.",
                       title="control characters in a path parameter reached the upstream",
                       extra="control")
