"""Who may reach what: the matrix (route x method x credential x vantage), request variants
of denied routes, spoofed forwarding headers, paths under mounts, the known-route sweep."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import ClassVar

from scanner import patterns
from scanner.plan.model import Decision
from scanner.probe import safe
from scanner.probe.cases import Case, concrete
from scanner.probe.coverage import Subject, na
from scanner.probe.expect import NOT_ALLOWLISTED, Expectation, expect, in_networks, rule_for
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Coverage, Credential, Finding, Vantage
from scanner.probe.registry import BaseCheck, CheckContext, Results, register
from scanner.severity import Severity
from scanner.state_changing import is_state_changing


def _declared(decisions: Iterable[Decision]) -> tuple[str, ...]:
    return tuple(sorted({d.method for d in decisions}))


def forwarded_rule(case: Case, a: Attempt) -> str:
    """The rule for a request the perimeter had to refuse but forwarded (verdict failed)."""
    if a.outcome == "guarded":
        return "VP009"
    if a.outcome == "absent":
        return "VP008"             # forwarded; the upstream has nothing there
    return rule_for(Expectation(case.expected, case.reasons))


@register
class Matrix(BaseCheck):
    """Every plan route x method x credential x vantage, against the plan's expectation."""

    id: ClassVar[str] = "matrix"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "route x method x credential x vantage"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for path, decisions in ctx.plan.routes().items():
            for d in decisions:
                yield Subject(f"{d.method} {path}", d.method, path)
            yield Subject(f"other methods {path}", "*", path)

    def cover(self, ctx: CheckContext, subjects: Sequence[Subject], results: Results,
              interrupted: bool = False) -> Iterable[Coverage]:
        """An allowed decision is proved only when an allowed cell was too: denials alone say
        nothing about whether the route works for those it is meant for."""
        for c in super().cover(ctx, subjects, results, interrupted):
            d = ctx.decision(c.method, c.path) if c.method != "*" else None
            why = ctx.no_cell(d) if d is not None and d.allowed and c.status == "proved" else ""
            yield replace(c, status="not-proven", why=f"never sent as allowed: {why}") if why else c

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        slots = ctx.slots()
        turn = [0] * len(slots)    # the keys of one role take turns (their buckets run in parallel)
        for path, decisions in ctx.plan.routes().items():
            declared = _declared(decisions)
            for method in sorted(set(declared) | set(safe.ALL_METHODS)):
                known = method in declared
                subject = f"{method} {path}" if known else f"other methods {path}"
                for vantage in ctx.vantages:
                    for i, slot in enumerate(slots):
                        cred = slot[turn[i] % len(slot)]
                        turn[i] += 1
                        yield ctx.case(self.id, method, path, cred, vantage,
                                       "declared" if known else "undeclared", subject=subject)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged: list[tuple[str, Attempt]] = []
        proofs: set[tuple[str, str]] = set()  # (method, path) proved with an undeclared method
        for case, a in results:
            if a.verdict != "failed":
                continue
            rule = _matrix_rule(ctx, case, a)
            flagged.append((rule, a))
            if rule == "VP001" and case.role == "undeclared":
                proofs.add((a.method, a.path))
        declared = {p: ",".join(_declared(ds)) for p, ds in ctx.plan.routes().items()}

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
    if case.expected == "allow":
        return "VP006"
    if case.role == "undeclared" and case.state_changing and a.outcome == "reached" \
            and _declared_denied(ctx, case):
        return "VP001"             # the router's 405 proves the state-changing route is reachable
    if case.role == "undeclared" and a.outcome == "reached":
        return "VP008"
    return forwarded_rule(case, a)


def _declared_denied(ctx: CheckContext, case: Case) -> bool:
    """Would every declared method of this state-changing path be denied to this caller?"""
    return all(ctx.expect(d.method, case.path, case.credential, case.vantage).denied
               for d in ctx.plan.routes().get(case.path, ()))


def _matrix_style(rule: str, attempts: list[Attempt], proof: bool) -> tuple[Severity | None, str]:
    if rule == "VP006" and not any(a.layer == "proxy" for a in attempts):
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
        whys = "; ".join(sorted({a.why for a in attempts}))
        return f"{plan}. The request was refused or failed ({whys}) for credentials {creds}."
    if rule == "VP008":
        return f"{plan}. The perimeter forwarded it and the upstream answered ({statuses}) for {creds}."
    return f"{plan}. The upstream answered ({statuses}) for credentials {creds}."


# --- bypass variants ---------------------------------------------------------------------

# A variant the perimeter does not recognise as the route is refused as an unknown path, or
# as a request it will not parse or route (encoded slashes): both prove the denial too.
VARIANT_REASONS = ("not-allowlisted", "bad-request")


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


def neighbours(path: str) -> list[tuple[str, str]]:
    """(note, target) spellings next to a concrete allowed path that name another path: a
    perimeter matching the route exactly and case-sensitively refuses them as unknown; a
    prefix, case-insensitive, unanchored or catch-all match forwards them."""
    return [("upper case", path.upper()), ("trailing slash", f"{path}/"), ("a suffix", f"{path}-probe"),
            ("a path below", f"{path}/probe-sub")]


def _neighbour_subject(path: str) -> str:
    return f"neighbours {path}"


@register
class Bypass(BaseCheck):
    """Denied routes must stay denied under encodings, dot segments, slashes, case, path
    parameters, absolute-form targets, method-override and URL-override headers, preflight;
    and the paths next to an allowed route (its upper case, a trailing slash, a suffix, a path
    below) are not that route: sent as it admits them, they must be refused as unknown."""

    id: ClassVar[str] = "bypass"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "request variants of denied routes"

    def _denied_at(self, ctx: CheckContext, path: str) -> list[Vantage]:
        cred = ctx.credentials[0]
        return [v for v in ctx.vantages
                if all(ctx.expect(d.method, path, cred, v).denied for d in ctx.plan.routes()[path])]

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for path in ctx.plan.routes():
            key = f"variants {path}"
            if self._denied_at(ctx, path):
                yield Subject(key, "*", path)
            else:
                yield na(key, f"allowed to {ctx.credentials[0].label} from every vantage", "*", path)
        for d, _cell in self._admitted(ctx):
            yield Subject(_neighbour_subject(d.path), d.method, d.path)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        cred = ctx.credentials[0]
        host = ctx.target.url.netloc.decode("ascii")
        pathless: set[str] = set()   # vantages OPTIONS * was sent from
        for path, decisions in ctx.plan.routes().items():
            declared = _declared(decisions)
            sc = any(d.state_changing for d in decisions)
            for vantage in self._denied_at(ctx, path):
                method = declared[0]
                if sc and safe.safe_request(method, path, declared, True,
                                            ctx.options.allow_state_changes) is None:
                    method = safe.wrong_method(declared)
                yield from self._variants(ctx, path, method, cred, vantage, host)
                if vantage.name not in pathless:
                    pathless.add(vantage.name)
                    yield from self._pathless(ctx, path, method, cred, vantage)
        yield from self._neighbours(ctx)

    def _pathless(self, ctx: CheckContext, path: str, method: str, cred: Credential,
                  vantage: Vantage) -> Iterator[Case]:
        """The asterisk-form target (``OPTIONS *``, once per vantage, under the first denied route's
        subject): it names no path, so no route admits it; it must be refused with a reason (Envoy
        1.40 answered it with its own 404 and no reason: a refusal the probe cannot prove). Not
        sent through an injected transport (an http client cannot write it)."""
        if ctx.options.transport_factory is not None:
            return
        yield Case(self.id, method, path, "OPTIONS", "*", cred, vantage, "deny", VARIANT_REASONS,
                   f"variants {path}", raw=True, role="variant", note="asterisk-form OPTIONS *")

    def _admitted(self, ctx: CheckContext) -> list[tuple[Decision, tuple[Credential, Vantage]]]:
        """Each allowed HTTP path once (its first allowed method), with a cell the plan admits."""
        out: dict[str, tuple[Decision, tuple[Credential, Vantage]]] = {}
        for d in sorted(ctx.plan.allowed, key=lambda d: (d.path, d.state_changing, d.method)):
            cell = ctx.allowed_cell(d) if d.kind == "http" and d.path not in out else None
            if cell is not None:
                out[d.path] = (d, cell)
        return list(out.values())

    def _neighbours(self, ctx: CheckContext) -> Iterator[Case]:
        planned = [re.compile(patterns.to_regex(p)) for p in ctx.plan.routes()]
        for d, (cred, vantage) in self._admitted(ctx):
            for note, target in neighbours(concrete(d.path)):
                if any(rx.fullmatch(target) for rx in planned):
                    continue    # another route of the plan (or this template's parameter)
                yield ctx.case(self.id, d.method, d.path, cred, vantage, "variant",
                               subject=_neighbour_subject(d.path), exp=NOT_ALLOWLISTED, target=target,
                               raw=True, note=note, extra_reasons=VARIANT_REASONS)

    def _variants(self, ctx: CheckContext, path: str, method: str, cred: Credential, vantage: Vantage,
                  host: str) -> Iterator[Case]:
        real = concrete(path)
        subject = f"variants {path}"
        yield ctx.case(self.id, method, path, cred, vantage, "declared", subject=subject, note="baseline")
        for note, target in path_variants(real, host):
            yield ctx.case(self.id, method, path, cred, vantage, "variant", subject=subject, target=target,
                           raw=True, note=note, extra_reasons=VARIANT_REASONS)
        override = "POST" if method != "POST" else "GET"
        yield ctx.case(self.id, method, path, cred, vantage, "variant", subject=subject,
                       note="X-HTTP-Method-Override",
                       headers=(("X-HTTP-Method-Override", override), ("X-Method-Override", override)))
        yield ctx.case(self.id, method, path, cred, vantage, "variant", subject=subject, target="/",
                       note="X-Original-URL / X-Rewrite-URL", extra_reasons=VARIANT_REASONS,
                       headers=(("X-Original-URL", real), ("X-Rewrite-URL", real)))
        if method != "OPTIONS":
            exp = ctx.expect(method, path, cred, vantage)
            reasons = exp.reasons + tuple(r for r in ("method-not-allowed", "not-allowlisted")
                                          if r not in exp.reasons)
            yield Case(self.id, method, path, "OPTIONS", real, cred, vantage, "deny", reasons, subject,
                       role="variant", note="CORS preflight (vLLM's key check skips OPTIONS)",
                       headers=(("Origin", "https://probe.invalid"),
                                ("Access-Control-Request-Method", method)))

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        # A path whose plain request already got through is the matrix's finding, not a bypass.
        open_paths = {(a.path, a.vantage) for c, a in results
                      if c.role == "declared" and a.verdict == "failed"}
        flagged = []
        for c, a in results:
            if c.role != "variant" or a.verdict != "failed" or (a.path, a.vantage) in open_paths:
                continue
            rule = forwarded_rule(c, a)
            flagged.append(("VP008" if "preflight" in a.note else ("VP004" if rule not in ("VP008", "VP009")
                                                                  else rule), a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = ", ".join(sorted({a.note for a in attempts}))
            what = "paths next to an allowed route" if attempts[0].note in dict(neighbours("/")) \
                else "variants of a denied route"
            yield make(rule, attempts, f"The upstream answered these {what}: {notes}.", extra="bypass")


# --- spoofed forwarding headers ------------------------------------------------------------


def inside(cidrs: tuple[str, ...]) -> str | None:
    """An address inside one of ``cidrs`` to claim in a forwarding header: the network's first
    host, or the address itself for a single-host network (/32, /128). IPv4 first."""
    nets = sorted((ipaddress.ip_network(c, strict=False) for c in cidrs), key=lambda n: (n.version, str(n)))
    for net in nets:
        if net.prefixlen == net.max_prefixlen:
            return str(net.network_address)
        return str(next(net.hosts(), net.network_address))
    return None


def _forwarded_for(addr: str) -> str:
    return f'for="[{addr}]"' if ":" in addr else f"for={addr}"


# Headers a proxy or an app may take the client address from (NGINX real_ip_header, Envoy's
# original IP detection, CDNs' own): each is also sent alone and single-valued.
CLIENT_ADDRESS_HEADERS: tuple[str, ...] = (
    "X-Forwarded-For", "X-Real-IP", "True-Client-IP", "X-Client-IP", "CF-Connecting-IP",
    "X-Cluster-Client-IP", "Fastly-Client-IP", "X-Original-Forwarded-For", "Client-IP",
    "X-Envoy-External-Address",
)


def single_headers(addr: str) -> tuple[tuple[str, str], ...]:
    """(name, value): each client-address header alone, claiming ``addr`` once; and Forwarded."""
    return (*((name, addr) for name in CLIENT_ADDRESS_HEADERS), ("Forwarded", _forwarded_for(addr)))


@register
class Spoof(BaseCheck):
    """Routes allowed only from some networks must not open up to X-Forwarded-For & co."""

    id: ClassVar[str] = "spoof"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "forwarding-header spoofing"

    def _cells(self, ctx: CheckContext, d: Decision) -> tuple[list[tuple[Credential, Vantage]], str]:
        """(credential, vantage outside the networks) cells to spoof from, or why there are none."""
        cred = next((c for c in ctx.credentials if not expect(d, c, None).denied), None)
        if cred is None:
            return [], f"no --key with a role this route admits ({', '.join(d.roles) or 'any'})"
        outside = [v for v in ctx.vantages
                   if (src := ctx.source_address(v)) is not None and not in_networks(src, d.networks)]
        if not outside:
            return [], (f"no vantage outside its networks ({', '.join(d.networks)}): add a --vantage "
                        "whose address is outside them")
        untrusted = [v for v in outside if not in_networks(ctx.source_address(v), ctx.plan.trusted_proxies)]
        if not untrusted:
            return [], "every vantage outside its networks is a trusted proxy (its X-Forwarded-For counts)"
        return [(cred, v) for v in untrusted], ""

    @staticmethod
    def _open_to_all(ctx: CheckContext, d: Decision) -> bool:
        """Every address of every family the vantages use (IPv4, IPv6) is in the networks: no
        vantage can be outside, nor can a spoofed address move a request inside."""
        families = {ipaddress.ip_address(src).version for v in ctx.vantages
                    if (src := ctx.source_address(v)) is not None} or {4}
        wide = {ipaddress.ip_network(c, strict=False).version for c in d.networks
                if ipaddress.ip_network(c, strict=False).prefixlen == 0}
        return families <= wide

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for d in ctx.plan.allowed:
            if d.kind == "mount":
                continue
            key = f"spoof {d.method} {d.path}"
            if self._open_to_all(ctx, d):
                yield na(key, "open to every address the vantages have", d.method, d.path)
                continue
            _cells, why = self._cells(ctx, d)
            yield Subject(key, d.method, d.path, why=why)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for d in ctx.plan.allowed:
            if d.kind == "mount" or self._open_to_all(ctx, d):
                continue
            addr = inside(d.networks)
            cells, _why = self._cells(ctx, d)
            if addr is None:
                continue
            # twice: a proxy that trusts one hop takes the second entry from the right
            headers = (("X-Forwarded-For", f"{addr}, {addr}"), ("X-Real-IP", addr),
                       ("Forwarded", _forwarded_for(addr)))
            subject, exp = f"spoof {d.method} {d.path}", Expectation("deny", ("network",))
            for cred, vantage in cells:
                yield ctx.case(self.id, d.method, d.path, cred, vantage, "spoof", subject=subject, exp=exp,
                               note=f"X-Forwarded-For/X-Real-IP/Forwarded: {addr}", headers=headers)
            for name, value in single_headers(addr) if cells else ():
                cred, vantage = cells[0]
                yield ctx.case(self.id, d.method, d.path, cred, vantage, "spoof", subject=subject, exp=exp,
                               note=f"{name} alone: {value}", headers=((name, value),))

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [("VP003", a) for _c, a in results if a.verdict == "failed" and a.outcome == "reached"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            yield make(rule, attempts, "A spoofed forwarding header let a request from outside the "
                       "route's networks through.", title="disallowed network reached (spoofed header)",
                       extra="spoof")


# --- mounts and the known-route sweep --------------------------------------------------------


@register
class Mounts(BaseCheck):
    """A mounted sub-app (``/metrics`` is one in vLLM) answers every path below it; the plan
    never allows a mount, so a path under it must be denied even when the mount's own path
    is allowed as an exact route."""

    id: ClassVar[str] = "mounts"
    title: ClassVar[str] = "paths under mounted sub-apps"

    def _mounts(self, ctx: CheckContext) -> list[str]:
        return sorted({d.path for d in ctx.plan.decisions if d.kind == "mount"})

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for path in self._mounts(ctx):
            yield Subject(f"under {path}", "GET", path)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for path in self._mounts(ctx):
            target = path.rstrip("/") + "/probe-sub"
            for vantage in ctx.vantages:
                for cred in ctx.credentials:
                    yield Case(self.id, "GET", path, "GET", target, cred, vantage, "deny",
                               NOT_ALLOWLISTED.reasons, f"under {path}", role="variant",
                               note="a path under the mount")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [(forwarded_rule(c, a), a) for c, a in results if a.verdict == "failed"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            yield make(rule, attempts, "A path under a mounted sub-app reached the upstream: allow "
                       "only the exact route, never a prefix.", extra="mount")


@register
class Sweep(BaseCheck):
    """Known vLLM routes (bundled catalogs) that the plan does not list must be denied."""

    id: ClassVar[str] = "sweep"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "known routes not in the plan"

    def _paths(self, ctx: CheckContext) -> list[tuple[str, tuple[str, ...]]]:
        planned = set(ctx.plan.routes()) | {d.path for d in ctx.plan.decisions}
        return [(p, ms) for p, ms in ctx.catalog_paths if p not in planned]

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for path, methods in self._paths(ctx):
            yield Subject(f"known route {path}", methods[0], path)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        cred = ctx.credentials[0]
        templates = [(re.compile(patterns.to_regex(p)), p) for p in ctx.plan.routes()
                     if not patterns.is_exact(p)]
        for path, methods in self._paths(ctx):
            sc = is_state_changing(path)
            method = methods[0]
            if sc and safe.safe_request(method, path, methods, True, ctx.options.allow_state_changes) is None:
                method = safe.wrong_method(methods)  # router 405 proves the route, acts on nothing
            template = next((t for rx, t in templates if rx.fullmatch(path)), None)  # not "$": a
            # final newline would match it (as PCRE's does: the NGINX templates end in \z)
            for vantage in ctx.vantages:
                # a path a plan template matches is decided by that template's location
                exp = ctx.expect(method, template, cred, vantage) if template else NOT_ALLOWLISTED
                yield ctx.case(self.id, method, path, cred, vantage, "sweep", subject=f"known route {path}",
                               exp=exp, declared=methods, state_changing=sc)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = []
        for c, a in results:
            if a.verdict == "failed":
                rule = forwarded_rule(c, a)
                flagged.append(("VP007" if rule not in ("VP008", "VP009") else rule, a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            yield make(rule, attempts, "A known vLLM route that is not in the plan went past the perimeter "
                       "to the upstream: the inventory is stale or the perimeter is not default-deny.")
