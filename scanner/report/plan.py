"""Render a plan as a table (rich) or JSON."""

from __future__ import annotations

import io
from typing import Any

from rich.table import Table

from scanner.output import text_console
from scanner.plan.model import BODY_METHODS, Decision, Plan


def _limits(d: Decision) -> str:
    lim = d.limits
    parts = []
    if lim.body_bytes is not None:
        parts.append(f"body<={lim.body_bytes}")
    if lim.json_caps:
        parts.append("caps:" + ",".join(f"{k}<={v}" for k, v in sorted(lim.json_caps.items())))
    budget = d.budget
    if budget is not None:
        verb = {"inject": "written in" if budget.write_cap else "left to vllm", "reject": "refused",
                "pass": "passed"}[budget.when_absent]
        fit = f"<=min({budget.cap},{budget.window}-bytes)" if budget.window else f"={budget.write_cap}"
        parts.append(f"no-budget:{verb}" + (f"({budget.field}{fit})" if budget.write_cap else "")
                     + (f"(vllm-default<={budget.rest})"
                        if budget.default.known and budget.when_absent != "reject" else ""))
    if d.fields.decided:
        named = {m: len(d.fields.names(m)) for m in ("allow", "reject", "strip") if d.fields.names(m)}
        parts.append("fields:" + ",".join(f"{m}{n}" for m, n in named.items()) + f",other={d.fields.unknown}")
    if d.salt:
        parts.append(f"cache_salt:per-{d.salt}")
    if d.owned:
        parts.append("owned:" + ",".join([*([f"{{{d.owner_param}}}"] if d.owner_param else []),
                                          *d.owner_fields, *(["sealed"] if d.owner_seal else [])]))
    m = d.media
    if m.active:
        urls = f"allow({len(m.domains)} hosts)" if m.urls == "allow" and m.domains else m.urls
        parts.append(f"media:urls={urls}" + (f",items<={m.max_items}" if m.max_items is not None else "")
                     + (f",data<={m.data_max_bytes}" if m.data_max_bytes is not None else "")
                     + f",embeds={m.embeds}")
    if lim.rate:
        parts.append(f"{lim.rate.rps:g}rps/{lim.rate.burst}")
    if lim.concurrency:
        parts.append(f"conc<={lim.concurrency}")
    if d.envelope_capped:
        parts.append("request:" + ",".join(
            ([f"seq<={lim.max_sequences}"] if lim.max_sequences is not None else [])
            + ([f"tokens<={lim.max_request_tokens}" + ("(=burst)" if d.request_tokens_by_budget else "")]
               if lim.max_request_tokens is not None else [])))
    if d.token_zone:
        parts.append(f"tokens<={lim.tokens_per_minute}/min,burst<={d.token_capacity}")
    return " ".join(parts)


def warnings(plan: Plan) -> tuple[str, ...]:
    """What a deployment of this plan leaves open that `vllm-perimeter init` closes: stored
    responses shared among principals, and a prefix cache shared among principals (printed in
    the plan and on stderr by `plan` and `generate`)."""
    out = []
    if plan.responses_shared:
        out.append(f"stored responses shared among end users' principals (body: responses: shared): "
                   f"any of them who learns another's response id can read, cancel or continue it "
                   f"on {', '.join(plan.responses_shared)} (vLLM checks no owner; body: responses: owned "
                   "seals ids to their principal: docs/ownership.md)")
    keyed = [d for d in plan.allowed if d.auth != "none" and d.method in BODY_METHODS and d.kind == "http"]
    if keyed and not plan.body.salted:
        out.append(f"prefix cache shared among principals on {len(keyed)} routes (body: cache_salt: "
                   f"{plan.body.cache_salt}): one tenant can time another's prompts (CVE-2025-46570); "
                   "body: cache_salt: per-principal gives each principal its own (docs/policy-and-plan.md)")
    return tuple(out)


def to_table(plan: Plan, width: int = 140) -> str:
    buf = io.StringIO()
    console = text_console(buf, width)
    table = Table(title=f"plan: policy {plan.policy_name} on vLLM {plan.vllm_version or '?'}")
    for col in ("method", "path", "action", "audience", "auth", "roles", "networks", "limits", "reason"):
        table.add_column(col, overflow="fold")
    for d in plan.decisions:
        table.add_row(
            d.method, d.path, d.action.upper() if d.allowed else "deny", d.audience,
            d.auth if d.allowed else "", ",".join(d.roles), ",".join(d.networks), _limits(d),
            d.reason,
        )
    console.print(table)
    principals = ", ".join(f"{p.name}({p.role}) {p.fingerprint}" for p in plan.principals)
    console.print(f"{len(plan.allowed)} allowed, {len(plan.denied)} denied; "
                  f"principals: {principals or 'none'}")
    if plan.uncovered:
        console.print(f"{len(plan.uncovered)} routes no rule covers (denied): {', '.join(plan.uncovered)}")
    if plan.unnamed_fields:
        console.print(f"request fields no rule names (their route's `unknown` decides): "
                      f"{'; '.join(plan.unnamed_fields)}")
    for line in warnings(plan):
        console.print(f"WARNING: {line}")
    if plan.body.owned:
        console.print(f"responses: owned (every response id handed out sealed to its principal, "
                      f"HMAC-SHA256 of the secret in {plan.body.responses_secret_file}; another's: "
                      "403 not-owner; docs/ownership.md)")
    if plan.body.salted:
        console.print(f"cache_salt: {plan.body.cache_salt} (HMAC-SHA256 of the secret in "
                      f"{plan.body.cache_salt_secret_file}; written over any client's on JSON bodies)")
    if plan.unused_rules:
        console.print(f"rules that match no route in this inventory: {', '.join(plan.unused_rules)}")
    if plan.grpc is not None:
        _grpc(console, plan)
    console.print(f"digest {plan.digest}")
    return buf.getvalue()


def _grpc(console: Any, plan: Plan) -> None:
    g = plan.grpc
    assert g is not None
    where = f"{g.listen.address}:{g.listen.port} -> {g.upstream[0]}:{g.upstream[1]}"
    table = Table(title=f"gRPC listener {where} ({g.inventory})")
    for col in ("method", "action", "audience", "auth", "roles", "networks", "limits", "reason"):
        table.add_column(col, overflow="fold")
    for d in g.decisions:
        table.add_row(d.path, d.action.upper() if d.allowed else "deny", d.audience,
                      d.auth if d.allowed else "", ",".join(d.roles), ",".join(d.networks), _limits(d),
                      d.reason)
    console.print(table)
    console.print(f"gRPC: {len(g.allowed)} allowed, {len(g.decisions) - len(g.allowed)} denied")
    if g.uncovered:
        console.print(f"{len(g.uncovered)} gRPC methods no rule covers (denied): {', '.join(g.uncovered)}")
    for line in g.unenforced:
        console.print(f"not enforced on gRPC: {line}")
    if g.unused_rules:
        console.print(f"gRPC rules that match no method: {', '.join(g.unused_rules)}")


def render(plan: Plan, fmt: str) -> str:
    return plan.to_json() if fmt == "json" else to_table(plan)
