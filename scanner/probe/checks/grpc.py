"""The gRPC listener (policy ``grpc:``): every method of the gRPC inventory called as a gRPC
client calls it (HTTP/2, ``content-type: application/grpc``, one empty message) with every
credential from every vantage, plus a method no inventory lists; each must be refused by the
perimeter for the plan's reason (its local reply, in gRPC framing, carries the deny marker) or
reach vLLM's gRPC server. Not applicable without a ``grpc:`` section or with an injected
transport (tests without sockets)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

from scanner.plan.model import Decision
from scanner.probe.cases import Case
from scanner.probe.coverage import Subject, na
from scanner.probe.expect import NOT_ALLOWLISTED, Expectation, expect, rule_for
from scanner.probe.findings import group, make
from scanner.probe.interface import Credential, Finding, Vantage
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

# a method no gRPC inventory lists: the catch-all must refuse it
UNLISTED = "/vllm.grpc.engine.VllmEngine/VpProbeUnlisted"
STATE_CHANGING = ("state-changing gRPC method: not called (--allow-state-changes against a staging "
                  "upstream or the stand-in)")


@register
class Grpc(BaseCheck):
    """Per gRPC method x credential x vantage: refused for the plan's reason, or reached."""

    id: ClassVar[str] = "grpc"
    stable: ClassVar[bool] = True
    title: ClassVar[str] = "gRPC methods on the gRPC listener"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        g = ctx.plan.grpc
        if g is None:
            return
        for d in (*g.decisions, _unlisted()):
            key = f"grpc {d.path}"
            if ctx.options.transport_factory is not None:
                yield na(key, "an injected transport has no gRPC listener", d.method, d.path)
            else:
                yield Subject(key, d.method, d.path)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        g = ctx.plan.grpc
        if g is None or ctx.options.transport_factory is not None:
            return
        for d in (*g.decisions, _unlisted()):
            for vantage in ctx.vantages:
                for cred in ctx.credentials:
                    exp = expect(d, cred, ctx.source_address(vantage)) if d.allowed else NOT_ALLOWLISTED
                    yield self._case(ctx, d, exp, cred, vantage, g.listen.port)

    def _case(self, ctx: CheckContext, d: Decision, exp: Expectation, cred: Credential, vantage: Vantage,
              port: int) -> Case:
        skip = STATE_CHANGING if (d.state_changing and exp.expected == "allow"
                                  and not ctx.options.allow_state_changes) else ""
        return Case(self.id, "POST", d.path, "POST", d.path, cred, vantage, exp.expected, exp.reasons,
                    f"grpc {d.path}", grpc_port=port, skip=skip,
                    state_changing=d.state_changing, role="declared")

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = [("VP006" if c.expected == "allow" else rule_for(Expectation(c.expected, c.reasons)), a)
                   for c, a in results if a.verdict == "failed"]
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = "; ".join(sorted({f"{a.credential} from {a.vantage}: {a.status}" for a in attempts})[:6])
            yield make(rule, attempts, f"gRPC method not decided as the plan says: {notes}.", extra=self.id)


def _unlisted() -> Decision:
    return Decision(method="POST", path=UNLISTED, kind="grpc", action="deny",
                    reason="no method in the gRPC inventory (default deny)")
