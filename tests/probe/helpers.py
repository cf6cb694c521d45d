"""A tiny plan and mock targets (a plan-enforcing perimeter, an open upstream) for unit tests."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from scanner.inventory.model import Inventory, Route, Source
from scanner.plan.build import build
from scanner.plan.model import DECISION_HEADER, Plan
from scanner.policy.load import loads
from scanner.probe.cases import concrete
from scanner.probe.interface import Credential, ProbeOptions, ProbeResult, Target, Vantage
from scanner.probe.runner import probe

USER_KEY = "vp_user-secret-DO-NOT-PRINT-1234567890"
OPER_KEY = "vp_oper-secret-DO-NOT-PRINT-0987654321"
TARGET = Target("http://127.0.0.1:9")

POLICY = """
schema_version: 1
name: unit
networks:
  public: [0.0.0.0/0]
  admin: [10.30.0.0/16]
  monitoring: [10.20.0.0/16]
audiences:
  inference:
    kind: end-user
    networks: [public]
    roles: [user]
    limits: {body_bytes: 100, json_caps: {max_tokens: 10}, rate: {rps: 1, burst: 2}}
  operator: {kind: operator, networks: [admin], roles: [operator]}
  monitoring: {kind: monitoring, networks: [monitoring], auth: none}
  none: {kind: none}
routes:
  - {path: /v1/chat/completions, methods: [POST], audience: inference}
  - {path: /v1/models, methods: [GET], audience: inference}
  - {path: "/v1/responses/{response_id}", methods: [GET], audience: inference}
  - {path: /health, methods: [GET], audience: monitoring}
  - {path: /pause, methods: [POST], audience: operator, state_changing: true}
  - {path: /invocations, audience: none}
  - {path: /sleep, audience: none, state_changing: true}
"""

ROUTES = (
    Route("/v1/chat/completions", ("POST",), guarded=True),
    Route("/v1/models", ("GET",), guarded=True),
    Route("/v1/responses/{response_id}", ("GET",), guarded=True),
    Route("/health", ("GET",)),
    Route("/pause", ("POST",)),
    Route("/invocations", ("POST",)),
    Route("/sleep", ("POST",)),
)


def plan() -> Plan:
    inv = Inventory(source=Source("asgi", "unit"), routes=ROUTES)
    return build(inv, loads(POLICY))


def creds(*roles: str) -> tuple[Credential, ...]:
    from scanner.policy.keys import fingerprint

    base = (Credential("none", "none"), Credential("malformed-bearer", "malformed"),
            Credential("wrong-key", "wrong", secret="vp_wrong", fingerprint=fingerprint("vp_wrong")))
    keys = {"user": USER_KEY, "operator": OPER_KEY}
    return base + tuple(Credential(f"role:{r}", "role", r, keys[r], fingerprint(keys[r])) for r in roles)


def _upstream(p: Plan, request: httpx.Request) -> httpx.Response:
    """The app behind: 404 unknown path, 405 wrong method, 400 JSON for bodies, 200 else."""
    path = request.url.path
    methods = {d.method for d in p.decisions if concrete(d.path) == path}
    if not methods:
        return httpx.Response(404, json={"detail": "Not Found"})
    if request.method not in methods:
        return httpx.Response(405, json={"detail": "Method Not Allowed"})
    if request.method == "POST":
        return httpx.Response(400, json={"error": "validation error"})
    return httpx.Response(200, json={"ok": True})


def open_upstream(p: Plan) -> Callable[[Vantage], httpx.AsyncBaseTransport]:
    """vLLM alone: no perimeter."""
    return lambda v: httpx.MockTransport(lambda r: _upstream(p, r))


def _deny(status: int = 403) -> httpx.Response:
    return httpx.Response(status, headers={DECISION_HEADER: "deny"}, json={"error": "denied"})


def perimeter(p: Plan, burst_limit: int = 4) -> Callable[[Vantage], httpx.AsyncBaseTransport]:
    """A correct default-deny perimeter enforcing the plan (exact paths, keys, networks, limits)."""
    from scanner.probe.expect import in_networks

    roles = {f"Bearer {USER_KEY}": "user", f"Bearer {OPER_KEY}": "operator"}
    counter = {"n": 0}

    def handler(vantage: Vantage, request: httpx.Request) -> httpx.Response:
        raw = request.url.raw_path.decode().partition("?")[0]
        decision = next((d for d in p.allowed if request.method == d.method and concrete(d.path) == raw), None)
        if decision is None or set(request.headers) & {"x-original-url", "x-http-method-override"}:
            return _deny(404)
        source = vantage.address or "127.0.0.1"
        role = roles.get(request.headers.get("authorization", ""))
        if decision.auth == "key" and (role is None or role not in decision.roles):
            return _deny(401)
        if not in_networks(source, decision.networks):
            return _deny(403)
        lim = decision.limits
        body = request.content
        if lim.body_bytes is not None and len(body) > lim.body_bytes:
            return _deny(413)
        if body and lim.json_caps and not _caps_ok(body, dict(lim.json_caps)):
            return _deny(400)
        if lim.rate is not None:
            counter["n"] += 1
            if counter["n"] > burst_limit:
                return _deny(429)
        return _upstream(p, request)

    return lambda v: httpx.MockTransport(lambda r: handler(v, r))


def _caps_ok(body: bytes, caps: dict[str, int]) -> bool:
    def no_dupes(pairs: list[tuple[str, object]]) -> dict[str, object]:
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)

    try:
        doc = json.loads(body, object_pairs_hook=no_dupes)
    except ValueError:
        return False
    for name, cap in caps.items():
        if name in doc:
            v = doc[name]
            if type(v) is not int or v > cap:
                return False
    return True


def run(factory: Callable[[Vantage], httpx.AsyncBaseTransport], *roles: str,
        vantages: tuple[Vantage, ...] = (Vantage(),), **opts: object) -> ProbeResult:
    options = ProbeOptions(rate=0, transport_factory=factory, catalog_dir="/nonexistent", **opts)  # type: ignore[arg-type]
    return probe(plan(), TARGET, creds(*roles), vantages, options)
