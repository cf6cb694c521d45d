"""Other protocols on the perimeter's HTTP/1.1 listener: HTTP/2 with prior knowledge (h2c),
an h2c upgrade offer, and gRPC-shaped requests. vLLM's gRPC launcher and vllm-rs's gRPC
port serve generation with no key check of their own: the perimeter must not become a
way to reach such a surface, and must not pass gRPC framing to the OpenAI-compatible one."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.plan.model import Decision
from scanner.probe.cases import Case
from scanner.probe.checks.upstream import failed_on_problems, problem_rules
from scanner.probe.coverage import Subject, na
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Credential, Finding, Vantage
from scanner.probe.registry import BaseCheck, CheckContext, Results, register
from scanner.reasons import ANY

GRPC: tuple[tuple[str, str], ...] = (("Content-Type", "application/grpc"), ("TE", "trailers"))
H2C_UPGRADE: tuple[tuple[str, str], ...] = (
    ("Upgrade", "h2c"), ("Connection", "close, Upgrade, HTTP2-Settings"),
    ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"),
)
INJECTED = "needs real connections: an injected transport cannot carry HTTP/2 prior knowledge"
PRIOR, SHAPED, OFFER = "HTTP/2 prior knowledge", "gRPC over HTTP/1.1", "h2c upgrade offer"


def picked(ctx: CheckContext) -> list[tuple[Decision, Credential, Vantage]]:
    """One allowed route per audience (the first by path and method, not state-changing where
    the audience has such a route), with a credential and vantage it admits."""
    out: dict[str, tuple[Decision, Credential, Vantage]] = {}
    ranked = sorted(ctx.plan.allowed, key=lambda d: (d.state_changing, d.path, d.method))
    for d in ranked:
        if d.kind != "http" or d.audience in out:
            continue
        cell = ctx.allowed_cell(d)
        if cell is not None:
            out[d.audience] = (d, *cell)
    return list(out.values())


@register
class Protocol(BaseCheck):
    """Per audience, on one route it is allowed: the same request as HTTP/2 with prior
    knowledge (any refusal of the perimeter proves it; an HTTP/2 answer fails), as gRPC over
    HTTP/1.1 (``content-type: application/grpc``, ``te: trailers``: refused with reason
    ``grpc``), and with an h2c upgrade offer (refused with ``upgrade``, or served as plain
    HTTP/1.1 with neither ``Upgrade`` nor ``HTTP2-Settings`` reaching the upstream)."""

    id: ClassVar[str] = "protocol"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "HTTP/2 cleartext and gRPC on the HTTP/1.1 listener"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for d, _c, _v in picked(ctx):
            key = f"h2c and gRPC {d.method} {d.path}"
            if ctx.options.transport_factory is not None:
                yield na(key, INJECTED, d.method, d.path)
            else:
                yield Subject(key, d.method, d.path)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        if ctx.options.transport_factory is not None:
            return
        for d, cred, vantage in picked(ctx):
            key = f"h2c and gRPC {d.method} {d.path}"
            c = ctx.case(self.id, d.method, d.path, cred, vantage, "variant", subject=key, note=PRIOR)
            yield replace(c, expected="deny", reasons=(ANY,), h2c=True)
            c = ctx.case(self.id, d.method, d.path, cred, vantage, "variant", subject=key, note=SHAPED,
                         headers=GRPC)
            yield replace(c, expected="deny", reasons=("grpc",))
            c = ctx.case(self.id, d.method, d.path, cred, vantage, "witness", subject=key, note=OFFER,
                         headers=H2C_UPGRADE, raw=True)
            yield replace(c, reasons=("upgrade",))

    def review(self, ctx: CheckContext, case: Case, attempt: Attempt) -> Attempt:
        return failed_on_problems(ctx, case, attempt) if case.note == OFFER else attempt

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged: list[tuple[str, Attempt]] = []
        for c, a in results:
            if a.verdict != "failed":
                continue
            if c.note == OFFER:
                flagged += [(r, a) for r in problem_rules(ctx, c, a)] or [("VP006", a)]
            else:
                flagged.append(("VP017", a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            whys = "; ".join(sorted({f"{a.note}: {a.error or a.why}" for a in attempts}))
            yield make(rule, attempts, f"Another protocol on the HTTP/1.1 listener: {whys}.", extra=self.id)
