"""What each proxy can enforce of a plan's workload identity (``auth: cert``), decided once.

The listener asks every client for a certificate and verifies one that is presented against
``listen.tls.client_ca`` (NGINX ``ssl_verify_client optional``; Envoy a validation context with
``require_client_certificate: false``): a certificate from another CA, or an expired one, fails
the TLS handshake on Envoy and is answered 400 by NGINX, on every route. Only the routes of an
``auth: cert`` audience require a certificate (401 ``cert-missing``) naming a known principal by
its URI SAN or subject (403 ``cert-unknown``) of an admitted role (403 ``role``); key and token
routes take their own credentials on the same listener. Where a limit cannot be counted per
certificate principal the plan is refused for that proxy (exit 2), never rendered without it.
"""

from __future__ import annotations

from scanner.plan.model import Decision, Plan

# proxy -> the generators that enforce auth "cert" (the rest refuse the plan, exit 2)
SUPPORTED: frozenset[str] = frozenset({"envoy", "nginx"})


def cert_routes(plan: Plan) -> tuple[Decision, ...]:
    """The allowed routes that require a client certificate principal."""
    return tuple(d for d in plan.allowed if d.auth == "cert")


def refusal(plan: Plan, proxy: str) -> str:
    """Why ``proxy`` ("nginx" / "envoy") cannot enforce the plan's certificate rules ("" it can)."""
    routes = cert_routes(plan)
    if plan.grpc is not None:
        for g in plan.grpc.allowed:
            if g.auth == "cert":
                return (f"gRPC {g.path} (audience {g.audience!r}): auth: cert is not supported on the gRPC "
                        "listener")
    if not routes:
        return ""
    d = routes[0]
    where = f"{d.method} {d.path} (audience {d.audience!r}, auth: cert)"
    if proxy not in SUPPORTED:
        return f"{where}: client certificate principals are not generated for {proxy} yet"
    for d in routes:
        where = f"{d.method} {d.path} (audience {d.audience!r}, auth: cert)"
        if d.limits.tokens_per_minute is not None:
            return (f"{where}: limits.tokens_per_minute per certificate principal is not supported yet "
                    "(rates are)")
        if proxy == "envoy" and d.limits.concurrency is not None:
            return (f"{where}: limits.concurrency per certificate principal: Envoy holds a cluster per "
                    "API-key principal only (NGINX counts it)")
    if plan.shared is not None:
        return f"{where}: shared limits (a fleet) with certificate principals are not supported yet"
    return ""
