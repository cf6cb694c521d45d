"""The built-in checks: matrix, bypass variants, spoofed forwarding headers, known-route
sweep, body and JSON limits, rate bursts. Each generates cases and judges their attempts."""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterable, Iterator
from typing import ClassVar

from scanner import patterns
from scanner.plan.model import Decision
from scanner.probe import safe
from scanner.probe.cases import Case, Role, concrete, with_query
from scanner.probe.expect import expect
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Credential, Finding, Severity, Vantage
from scanner.probe.registry import CheckContext, Results, register

_NO_BODY = ("GET", "HEAD", "DELETE", "OPTIONS")


def _paths(ctx: CheckContext) -> dict[str, list[Decision]]:
    """Plan decisions per path, HTTP and WebSocket routes only (a mount has no exact path)."""
    out: dict[str, list[Decision]] = {}
    for d in ctx.plan.decisions:
        if d.kind != "mount":
            out.setdefault(d.path, []).append(d)
    return out


def _case(ctx: CheckContext, check: str, d_method: str, path: str, declared: tuple[str, ...],
          state_changing: bool, cred: Credential, vantage: Vantage, role: Role, *,
          target: str | None = None, raw: bool = False, note: str = "",
          headers: tuple[tuple[str, str], ...] = (), burst: str = "") -> Case:
    """A case for ``d_method path``, made safe for state-changing routes."""
    exp = expect(ctx.decision(d_method, path), cred, ctx.source_address(vantage))
    req = safe.safe_request(d_method, path, declared, state_changing, ctx.options.allow_state_changes)
    base = target if target is not None else concrete(path)
    if req is None:
        return Case(check, d_method, path, d_method, base, cred, vantage, exp.expected, role=role,
                    state_changing=True, note=note,
                    skip="state-changing; no verified non-acting request (--allow-state-changes)")
    ctype = (("Content-Type", req.content_type),) if req.content_type else ()
    return Case(check, d_method, path, req.method, with_query(base, req.query), cred, vantage,
                exp.expected, headers=ctype + headers, body=req.body, raw=raw, burst=burst,
                role=role, state_changing=state_changing, json_body=req.body is not None,
                note=note or req.how)


def _declared(decisions: list[Decision]) -> tuple[str, ...]:
    return tuple(sorted({d.method for d in decisions}))


def _state_changing(path: str, decisions: list[Decision]) -> bool:
    return safe.is_state_changing(path, any(d.state_changing for d in decisions))


@register
class Matrix:
    """Every plan route x method x credential x vantage, against the plan's expectation."""

    id: ClassVar[str] = "matrix"
    title: ClassVar[str] = "route x method x credential x vantage"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for path, decisions in _paths(ctx).items():
            declared = _declared(decisions)
            sc = _state_changing(path, decisions)
            for method in sorted(set(declared) | set(safe.ALL_METHODS)):
                role: Role = "declared" if method in declared else "undeclared"
                for vantage in ctx.vantages:
                    for cred in ctx.credentials:
                        yield _case(ctx, self.id, method, path, declared, sc, cred, vantage, role)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged: list[tuple[str, Attempt]] = []
        proofs: set[tuple[str, str]] = set()  # (method, path) proved with an undeclared method
        for case, a in results:
            rule = _matrix_rule(ctx, case, a)
            if rule:
                flagged.append((rule, a))
                if rule == "VP001" and case.role == "undeclared":
                    proofs.add((a.method, a.path))
        declared = {p: ",".join(_declared(ds)) for p, ds in _paths(ctx).items()}

        def method_of(rule: str, a: Attempt) -> str:
            # one finding per path for safe proofs and for undeclared methods forwarded
            if (a.method, a.path) in proofs and rule == "VP001":
                return declared.get(a.path, a.method)
            return "*" if rule == "VP008" else a.method

        for (rule, method, path, _v), attempts in group(flagged, method_of).items():
            proof = rule == "VP001" and any((a.method, a.path) in proofs for a in attempts)
            severity, title = _matrix_style(rule, attempts, proof)
            yield make(rule, attempts, _matrix_detail(ctx, rule, method, path, attempts),
                       severity=severity, title=title, method=method)


def _matrix_rule(ctx: CheckContext, case: Case, a: Attempt) -> str:
    if a.expected == "deny" and a.outcome == "guarded":
        return "VP009"
    if a.expected == "allow" and a.outcome in ("denied", "guarded", "absent", "error"):
        return "VP006"
    if a.expected != "deny" or a.outcome != "reached":
        return ""
    if case.role == "undeclared":
        return "VP001" if case.state_changing and _declared_denied(ctx, case) else "VP008"
    exp = expect(ctx.decision(case.method, case.path), case.credential, ctx.source_address(case.vantage))
    return {"plan": "VP001", "auth": "VP001", "role": "VP002", "network": "VP003"}.get(exp.why, "VP001")


def _declared_denied(ctx: CheckContext, case: Case) -> bool:
    """Would every declared method of this state-changing path be denied to this caller?"""
    src = ctx.source_address(case.vantage)
    return all(expect(d, case.credential, src).expected == "deny"
               for d in ctx.plan.decisions if d.path == case.path and d.kind != "mount")


def _matrix_style(rule: str, attempts: list[Attempt], proof: bool) -> tuple[Severity | None, str]:
    if rule == "VP006" and not any(a.outcome == "denied" for a in attempts):
        return "low", ""
    if rule == "VP001" and (proof or attempts[0].method != attempts[0].request_line.split(" ")[0]):
        return None, "state-changing route reachable (proved with a non-acting request)"
    return None, ""


def _matrix_detail(ctx: CheckContext, rule: str, method: str, path: str, attempts: list[Attempt]) -> str:
    d = ctx.decision(method.split(",")[0], path)  # a proof finding names all declared methods
    plan = f"plan: {d.action} ({d.reason})" if d else "plan: no decision for this method (deny)"
    creds = ", ".join(sorted({a.credential for a in attempts}))
    statuses = ", ".join(sorted({f"{a.status or a.error} from {a.layer}" for a in attempts}))
    if rule == "VP009":
        return (f"{plan}. Not reached: the upstream's own key guard answered 401 (not the perimeter) "
                f"for credentials {creds}.")
    if rule == "VP006":
        return f"{plan}. The request was refused or failed ({statuses}) for credentials {creds}."
    return f"{plan}. The upstream answered ({statuses}) for credentials {creds}."


# --- bypass variants ---------------------------------------------------------------------


def path_variants(path: str, host: str) -> list[tuple[str, str]]:
    """(note, raw target) variants of a concrete path that a perimeter must also deny."""
    segs = patterns.segments(path)
    if not segs:
        return []
    last, first = segs[-1], segs[0]
    head = "/" + "/".join(segs[:-1]) + "/" if len(segs) > 1 else "/"
    out = [
        ("pct-encoded last char", f"{head}{last[:-1]}%{ord(last[-1]):02X}"),
        ("pct-encoded first char", f"/%{ord(first[0]):02X}{path[2:]}"),
        ("dot segments /x/..", f"/probe-x/..{path}"),
        ("dot segment /.", f"/.{path}"),
        ("dot segments /v1/..", f"/v1/..{path}"),
        ("repeated slash", f"/{path}"),
        ("trailing slash", f"{path}/"),
        ("upper case", path.upper()),
        ("path parameter ;x", f"{path};x"),
        ("encoded slash %2f", "/" + "%2f".join(segs) if len(segs) > 1 else f"/%2f{first}"),
        ("absolute-form target", f"http://{host}{path}"),
    ]
    return [(n, t) for n, t in out if t != path]


@register
class Bypass:
    """Denied routes must stay denied under encodings, dot segments, slashes, case, path
    parameters, absolute-form targets, method-override and URL-override headers, preflight."""

    id: ClassVar[str] = "bypass"
    title: ClassVar[str] = "request variants of denied routes"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        cred = ctx.credentials[0]
        host = ctx.target.url.netloc.decode("ascii")
        for path, decisions in _paths(ctx).items():
            declared = _declared(decisions)
            sc = _state_changing(path, decisions)
            for vantage in ctx.vantages:
                src = ctx.source_address(vantage)
                denied = [d for d in decisions if expect(d, cred, src).expected == "deny"]
                if not denied or len(denied) < len(decisions):
                    continue  # only paths fully denied to this caller
                method = denied[0].method
                if sc and safe.safe_request(method, path, declared, True,
                                            ctx.options.allow_state_changes) is None:
                    method = safe.wrong_method(declared)
                yield from self._variants(ctx, path, method, declared, sc, cred, vantage, host)

    def _variants(self, ctx: CheckContext, path: str, method: str, declared: tuple[str, ...], sc: bool,
                  cred: Credential, vantage: Vantage, host: str) -> Iterator[Case]:
        real = concrete(path)
        yield _case(ctx, self.id, method, path, declared, sc, cred, vantage, "declared", note="baseline")
        for note, target in path_variants(real, host):
            yield _case(ctx, self.id, method, path, declared, sc, cred, vantage, "variant",
                        target=target, raw=True, note=note)
        override = "POST" if method != "POST" else "GET"
        yield _case(ctx, self.id, method, path, declared, sc, cred, vantage, "variant",
                    note="X-HTTP-Method-Override",
                    headers=(("X-HTTP-Method-Override", override), ("X-Method-Override", override)))
        yield _case(ctx, self.id, method, path, declared, sc, cred, vantage, "variant", target="/",
                    note="X-Original-URL / X-Rewrite-URL",
                    headers=(("X-Original-URL", real), ("X-Rewrite-URL", real)))
        if method != "OPTIONS":
            yield Case(self.id, method, path, "OPTIONS", real, cred, vantage, "deny", role="variant",
                       note="CORS preflight (vLLM's key check skips OPTIONS)",
                       headers=(("Origin", "https://probe.invalid"),
                                ("Access-Control-Request-Method", method)))

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        # A path whose plain request already got through is the matrix's finding, not a bypass.
        open_paths = {(a.path, a.vantage) for c, a in results
                      if c.role == "declared" and a.outcome == "reached"}
        flagged = [("VP008" if "preflight" in a.note else "VP004", a) for c, a in results
                   if c.role == "variant" and a.expected == "deny" and a.outcome == "reached"
                   and (a.path, a.vantage) not in open_paths]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = ", ".join(sorted({a.note for a in attempts}))
            yield make(rule, attempts, f"The upstream answered these variants of a denied route: {notes}.",
                       extra="bypass")


# --- spoofed forwarding headers ------------------------------------------------------------


def _inside(cidrs: tuple[str, ...]) -> str | None:
    """An address inside one of ``cidrs`` (to spoof), IPv4 only."""
    for c in cidrs:
        net = ipaddress.ip_network(c, strict=False)
        if net.prefixlen < net.max_prefixlen and net.version == 4:
            return str(next(net.hosts()))
    return None


@register
class Spoof:
    """Routes allowed only from other networks must not open up to X-Forwarded-For & co."""

    id: ClassVar[str] = "spoof"
    title: ClassVar[str] = "forwarding-header spoofing"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for d in ctx.plan.allowed:
            if d.kind == "mount" or safe.is_state_changing(d.path, d.state_changing):
                continue
            addr = _inside(d.networks)
            for vantage in ctx.vantages:
                src = ctx.source_address(vantage)
                cred = _fitting_credential(ctx, d)
                if addr is None or cred is None or src is None or expect(d, cred, src).why != "network":
                    continue
                headers = (("X-Forwarded-For", addr), ("X-Real-IP", addr), ("Forwarded", f"for={addr}"))
                yield _case(ctx, self.id, d.method, d.path, (d.method,), False, cred, vantage, "spoof",
                            note=f"X-Forwarded-For/X-Real-IP/Forwarded: {addr}", headers=headers)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [("VP003", a) for _c, a in results if a.outcome == "reached"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            yield make(rule, attempts, "A spoofed forwarding header let a request from outside the "
                       "route's networks through.", title="disallowed network reached (spoofed header)",
                       extra="spoof")


def _fitting_credential(ctx: CheckContext, d: Decision) -> Credential | None:
    for cred in ctx.credentials:
        if expect(d, cred, None).expected == "allow":
            return cred
    return None


def _allowed_cell(ctx: CheckContext, d: Decision) -> tuple[Credential, Vantage] | None:
    for vantage in ctx.vantages:
        for cred in ctx.credentials:
            if expect(d, cred, ctx.source_address(vantage)).expected == "allow":
                return cred, vantage
    return None


# --- what the upstream sees ------------------------------------------------------------------

# Harmless spellings of an allowed path that a normalising proxy forwards as the path itself.
NORMALISE_VARIANTS: tuple[tuple[str, str], ...] = (
    ("dot segment /.", "/.{path}"),
    ("dot segments /x/..", "/probe-x/..{path}"),
)
MAX_NORMALISE_ROUTES = 4


@register
class Normalise:
    """The upstream must receive the path the perimeter decided on, never the raw target.

    For a few allowed, non-state-changing routes, a dot-segment spelling is sent with a
    fitting key from an allowed vantage. A normalising proxy forwards ``/v1/models`` and
    the upstream answers as it does for the plain request; a proxy that forwards the raw
    target makes the upstream route ``/./v1/models`` itself (Starlette: 404). That gap
    between what the proxy decides on and what the upstream routes is what bypasses use.
    """

    id: ClassVar[str] = "normalise"
    title: ClassVar[str] = "path the upstream receives"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        picked = 0
        for d in ctx.plan.allowed:
            if picked >= MAX_NORMALISE_ROUTES:
                return
            cell = _allowed_cell(ctx, d)
            if d.kind != "http" or cell is None or safe.is_state_changing(d.path, d.state_changing):
                continue
            picked += 1
            cred, vantage = cell
            real = concrete(d.path)
            yield _case(ctx, self.id, d.method, d.path, (d.method,), False, cred, vantage, "declared",
                        note="baseline")
            for note, form in NORMALISE_VARIANTS:
                yield _case(ctx, self.id, d.method, d.path, (d.method,), False, cred, vantage, "variant",
                            target=form.format(path=real), raw=True, note=note)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        routed = {(a.method, a.path, a.vantage) for c, a in results
                  if c.role == "declared" and a.outcome == "reached" and a.status != 404}
        flagged = [("VP010", a) for c, a in results
                   if c.role == "variant" and a.layer == "upstream" and a.status == 404
                   and (a.method, a.path, a.vantage) in routed]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = ", ".join(sorted({a.note for a in attempts}))
            yield make(rule, attempts, "The perimeter let these spellings through but the upstream "
                       f"did not route them to the same handler ({notes}): the proxy forwards the raw "
                       "request target instead of the normalised path.", extra="normalise")


@register
class Mounts:
    """A mounted sub-app (``/metrics`` is one in vLLM) answers every path below it; the plan
    never allows a mount, so a path under it must be denied even when the mount's own path
    is allowed as an exact route."""

    id: ClassVar[str] = "mounts"
    title: ClassVar[str] = "paths under mounted sub-apps"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for d in ctx.plan.decisions:
            if d.kind != "mount":
                continue
            target = d.path.rstrip("/") + "/probe-sub"
            for vantage in ctx.vantages:
                for cred in ctx.credentials:
                    yield Case(self.id, "GET", d.path, "GET", target, cred, vantage, "deny",
                               role="variant", note="a path under the mount")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [("VP001", a) for _c, a in results if a.outcome == "reached"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            yield make(rule, attempts, "A path under a mounted sub-app reached the upstream: allow "
                       "only the exact route, never a prefix.", extra="mount")


# --- known-route sweep ----------------------------------------------------------------------


@register
class Sweep:
    """Known vLLM routes (bundled catalogs) that the plan does not list must be denied."""

    id: ClassVar[str] = "sweep"
    title: ClassVar[str] = "known routes not in the plan"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        planned = {d.path for d in ctx.plan.decisions}
        cred = ctx.credentials[0]
        for path, methods in ctx.catalog_paths:
            if path in planned:
                continue
            sc = safe.is_state_changing(path)
            method = methods[0]
            if sc and safe.safe_request(method, path, methods, True, ctx.options.allow_state_changes) is None:
                method = safe.wrong_method(methods)  # router 405 proves the route, acts on nothing
            for vantage in ctx.vantages:
                yield _case(ctx, self.id, method, path, methods, sc, cred, vantage, "sweep")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [("VP007", a) for _c, a in results if a.outcome == "reached"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            yield make(rule, attempts, "A known vLLM route that is not in the plan answered from the "
                       "upstream: the inventory is stale or the perimeter is not default-deny.")


# --- limits -------------------------------------------------------------------------------


def padded_json(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes (size >= 12)."""
    base = b'{"pad":""}'
    return base[:-2] + b"a" * max(0, size - len(base)) + base[-2:]


def cap_bodies(name: str, cap: int) -> list[tuple[str, bytes]]:
    over = cap + 1
    escaped = "".join(f"\\u{ord(c):04x}" for c in name)
    return [
        (f"{name}={over} (int)", json.dumps({name: over}).encode()),
        (f'{name}="{over}" (string)', json.dumps({name: str(over)}).encode()),
        (f"{name}={cap + 0.5} (float)", json.dumps({name: cap + 0.5}).encode()),
        (f"{name}=1e9", f'{{"{name}": 1e9}}'.encode()),
        (f"{name} with \\u-escaped key", f'{{"{escaped}": {over}}}'.encode()),
        (f"duplicate {name} key", f'{{"{name}": 1, "{name}": {over}}}'.encode()),
    ]


@register
class Limits:
    """Body size just over body_bytes (Content-Length and chunked), JSON caps just over the cap."""

    id: ClassVar[str] = "limits"
    title: ClassVar[str] = "body size and JSON caps"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for d in ctx.plan.allowed:
            if d.method in _NO_BODY or d.kind != "http":
                continue
            if safe.is_state_changing(d.path, d.state_changing) and not ctx.options.allow_state_changes:
                continue
            cell = _allowed_cell(ctx, d)
            if cell is None:
                continue
            yield from self._body(ctx, d, *cell)
            yield from self._caps(d, *cell)

    def _body(self, ctx: CheckContext, d: Decision, cred: Credential, vantage: Vantage) -> Iterator[Case]:
        limit = d.limits.body_bytes
        if limit is None or limit + 1 > ctx.options.max_body_bytes or limit < 12:
            return
        body = padded_json(limit + 1)
        for chunked in (False, True):
            yield Case(self.id, d.method, d.path, d.method, concrete(d.path), cred, vantage, "deny",
                       body=body, chunked=chunked, role="limit", json_body=True,
                       note=f"body {limit + 1} bytes > body_bytes {limit}"
                            + (" (chunked)" if chunked else " (Content-Length)"))

    def _caps(self, d: Decision, cred: Credential, vantage: Vantage) -> Iterator[Case]:
        caps = sorted(d.limits.json_caps.items())
        for i, (name, cap) in enumerate(caps):
            bodies = cap_bodies(name, cap) if i == 0 else cap_bodies(name, cap)[:1]
            for note, body in bodies:
                yield Case(self.id, d.method, d.path, d.method, concrete(d.path), cred, vantage, "deny",
                           body=body, role="limit", json_body=True, note=f"json cap: {note} > {cap}")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [("VP005", a) for _c, a in results if a.outcome == "reached"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = "; ".join(a.note for a in attempts[:8])
            yield make(rule, attempts, f"Requests over the plan's limits reached the upstream: {notes}.",
                       extra="limits")


@register
class RateBurst:
    """A bounded burst (burst + 2 x rps requests) per rate-limited audience expects some 429."""

    id: ClassVar[str] = "rate"
    title: ClassVar[str] = "rate limits"

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        seen: set[str] = set()
        for d in sorted(ctx.plan.allowed, key=lambda d: (d.method != "GET", d.path)):
            rate = d.limits.rate
            if rate is None or d.audience in seen or d.kind != "http":
                continue
            if safe.is_state_changing(d.path, d.state_changing) and not ctx.options.allow_state_changes:
                continue
            cell = _allowed_cell(ctx, d)
            if cell is None:
                continue
            n = min(ctx.options.max_burst, rate.burst + math.ceil(rate.rps * 2) + 1)
            if n <= rate.burst + 1:
                continue  # the cap would not even exceed the burst: not verifiable here
            seen.add(d.audience)
            for i in range(n):
                yield _case(ctx, self.id, d.method, d.path, (d.method,), False, cell[0], cell[1], "limit",
                            burst=d.audience, note=f"burst {i + 1}/{n} (rps {rate.rps}, burst {rate.burst})")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        by_burst: dict[str, list[Attempt]] = {}
        for c, a in results:
            by_burst.setdefault(c.burst, []).append(a)
        for audience, attempts in by_burst.items():
            answered = [a for a in attempts if a.outcome != "error"]
            d = ctx.decision(attempts[0].method, attempts[0].path)
            if not answered or d is None or d.limits.rate is None or any(a.status == 429 for a in answered):
                continue
            rate = d.limits.rate
            took = max(a.sent_at + a.latency_ms / 1000 for a in answered) - min(a.sent_at for a in answered)
            capacity = rate.burst + rate.rps * took
            if len(answered) > capacity:
                yield make("VP005", answered, f"{len(answered)} requests in {took:.2f}s for audience "
                           f"{audience!r} (rps {rate.rps:g}, burst {rate.burst}: at most "
                           f"{capacity:.0f} allowed) got no 429.", title="rate limit not enforced",
                           extra="rate")
            else:
                yield make("VP005", answered[:1],
                           f"Inconclusive: {len(answered)} requests took {took:.2f}s, within what "
                           f"rps {rate.rps:g} + burst {rate.burst} allows ({capacity:.0f}); "
                           "raise --concurrency or --pipeline to test this limit.",
                           severity="info", title="rate limit not verified", extra="rate")
