"""A tiny plan and mock targets (a plan-enforcing perimeter, an open upstream) for unit tests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from scanner.inventory.model import Inventory, Route, Source
from scanner.plan.build import build
from scanner.plan.model import DECISION_HEADER, REASON_HEADER, Plan
from scanner.policy import media
from scanner.policy.load import loads
from scanner.probe.cases import concrete
from scanner.probe.interface import Credential, ProbeOptions, ProbeResult, Target, Vantage
from scanner.probe.runner import probe

USER_KEY = "vp_user-secret-DO-NOT-PRINT-1234567890"
OPER_KEY = "vp_oper-secret-DO-NOT-PRINT-0987654321"
USER2_KEY = "vp_user-secret-DO-NOT-PRINT-second-key"   # role "user#2": a second principal of user
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
    limits: {body_bytes: 100, json_caps: {max_tokens: 10}, rate: {rps: 20, burst: 10}}
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
    keys = {"user": USER_KEY, "operator": OPER_KEY, "user#2": USER2_KEY}
    return base + tuple(Credential(f"role:{r}", "role", r.partition("#")[0], keys[r], fingerprint(keys[r]))
                        for r in roles)


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


def _deny(status: int, reason: str) -> httpx.Response:
    return httpx.Response(status, headers={DECISION_HEADER: "deny", REASON_HEADER: reason},
                          json={"error": "denied"})


class Bucket:
    """A token bucket like the proxies': ``burst`` up front, refilled at ``rps``."""

    def __init__(self, rps: float, burst: int) -> None:
        self.rps, self.burst, self.tokens, self.at = rps, burst, float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rps)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def perimeter(p: Plan, broken: str = "") -> Callable[[Vantage], httpx.AsyncBaseTransport]:
    """A correct default-deny perimeter enforcing the plan (exact paths, methods, networks, keys,
    roles, body size, JSON caps, forbidden fields, media, rate per principal), with the reason header.
    ``broken`` names one check to leave out (e.g. "network", "rate", "json-cap")."""
    from scanner.probe.expect import in_networks

    roles = {f"Bearer {USER_KEY}": "user", f"Bearer {OPER_KEY}": "operator", f"Bearer {USER2_KEY}": "user"}
    buckets: dict[str, Bucket] = {}

    def handler(vantage: Vantage, request: httpx.Request) -> httpx.Response:
        raw = request.url.raw_path.decode().partition("?")[0]
        on_path = [d for d in p.allowed if concrete(d.path) == raw]
        if not on_path:
            return _deny(404, "not-allowlisted")
        decision = next((d for d in on_path if d.method == request.method), None)
        if decision is None and broken != "method":
            return _deny(405, "method-not-allowed")
        decision = decision or on_path[0]
        source = vantage.address or "127.0.0.1"
        if not in_networks(source, decision.networks) and broken != "network":
            return _deny(403, "network")
        auth = request.headers.get("authorization", "")
        if decision.auth == "key" and broken != "key":
            if not auth.partition(" ")[2]:
                return _deny(401, "missing-key")
            if auth not in roles:
                return _deny(401, "unknown-key")
            if decision.roles and roles[auth] not in decision.roles:
                return _deny(403, "role")
        lim = decision.limits
        if lim.rate is not None and broken != "rate":
            who = auth if decision.auth == "key" and broken != "rate-shared" else source
            bucket = buckets.setdefault(who, Bucket(lim.rate.rps, lim.rate.burst))
            if not bucket.take():
                return _deny(429, "rate")
        body = request.content
        if lim.body_bytes is not None and len(body) > lim.body_bytes and broken != "body":
            return _deny(413, "body-too-large")
        if body and request.method == "POST":
            why = _body_refusal(body, dict(lim.json_caps), broken)
            if not why and broken != "media":
                why = media.reason(json.loads(body), decision.media)
            if why:
                return _deny(400, why)
        return _upstream(p, request)

    return lambda v: httpx.MockTransport(lambda r: handler(v, r))


def _body_refusal(body: bytes, caps: dict[str, int], broken: str) -> str:
    try:
        doc = json.loads(body, object_pairs_hook=_no_dupes)
    except ValueError:
        return "bad-json"
    if not isinstance(doc, dict):
        return "bad-json"
    if broken != "json-cap":
        for name, cap in caps.items():
            if name in doc and (type(doc[name]) is not int or doc[name] > cap):
                return f"json-cap:{name}"
    for name in ("cache_salt", "chat_template", "chat_template_kwargs"):
        if name in doc and broken != "fields":
            return f"forbidden-field:{name}"
    return ""


def _no_dupes(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


def run(factory: Callable[[Vantage], httpx.AsyncBaseTransport], *roles: str,
        vantages: tuple[Vantage, ...] = (Vantage(),), **opts: object) -> ProbeResult:
    options = ProbeOptions(rate=0, transport_factory=factory, catalog_dir="/nonexistent", **opts)  # type: ignore[arg-type]
    return probe(plan(), TARGET, creds(*roles), vantages, options)
