"""Bearer tokens (``auth: jwt``) through the real proxies: each token case on a jwt audience's
route is refused with its reason, the valid one admitted with its role and principal (the
stand-in's witness sees the request, without the token), API keys beside them on another
audience. One proxy started per module and proxy (cheap: a few seconds each)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scanner import reasons
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import jwt as plan_jwt
from scanner.plan.model import PRINCIPAL_HEADER, REASON_HEADER
from scanner.policy.load import loads
from scanner.probe import tokens_jwt
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
POLICY = """
schema_version: 1
name: jwt-live
networks:
  users: [10.0.0.0/8]
audiences:
  people:
    kind: end-user
    networks: [users]
    auth: jwt
    roles: [user]
    limits: {rate: {rps: 500, burst: 500}}
    jwt:
      issuers: [https://issuer.example]
      audiences: [vllm]
      jwks_file: jwks.json
      required_claims: {tenant: [acme, beta]}
      role_claim: groups
      roles: {llm-users: user, llm-admins: admin}
  services:
    kind: service
    networks: [users]
    roles: [service]
routes:
  - {path: /v1/models, methods: [GET], audience: people}
  - {path: /v1/chat/completions, methods: [POST], audience: people}
  - {path: /v1/completions, methods: [POST], audience: services}
"""


@dataclass
class Live:
    url: str
    witness: str
    setup: loop.Setup
    source: str            # the vantage address inside the networks
    proxy: str = ""


def _policy(tmp: Path) -> str:
    issuer = tokens_jwt.Issuer.new()   # any JWKS for loading; verify's issuer replaces it
    issuer.write_jwks(tmp / "jwks.json")
    return POLICY


@pytest.fixture(scope="module", params=["envoy", "nginx", "nginx-debian"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    proxy: Proxy = proxy_named(request.param)
    tmp = tmp_path_factory.mktemp(f"jwt-{request.param}")
    policy = loads(_policy(tmp), source=str(tmp / "policy.yaml"), base_dir=tmp)
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, policy, tmp, port)
    directory = tmp / "proxy"
    proxy.write(s.plan, directory)
    with ExitStack() as stack:
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", port))
        loop.start_checked(proxy, s.plan, directory, stack)
        source = next(v.address for v in s.vantages if v.name == "users")
        yield Live(f"http://127.0.0.1:{s.plan.listen.port}", standin.url, s, source, request.param)


def _send(live: Live, token: str | None, probe: str, method: str = "GET", path: str = "/v1/models",
          body: object = None, scheme: str = "Bearer") -> httpx.Response:
    headers = {"Authorization": f"{scheme} {token}"} if token is not None else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    transport = httpx.HTTPTransport(local_address=live.source)
    with httpx.Client(transport=transport, timeout=10) as c:
        return c.request(method, f"{live.url}{path}?vp_probe={probe}", headers=headers,
                         content=json.dumps(body).encode() if body is not None else None)


def _witnessed(live: Live, probe: str) -> list[dict[str, object]]:
    r = httpx.get(f"{live.witness}/__standin__/witness?id={urllib.parse.quote(probe)}", timeout=5)
    if r.status_code != 200:
        return []
    data = r.json()
    return list(data.get("records", [data] if data else []))


def _audience(live: Live) -> tokens_jwt.JwtAuth:
    d = live.setup.plan.decision("GET", "/v1/models")
    assert d is not None and d.jwt is not None
    return d.jwt


def test_every_token_case_is_decided(live: Live) -> None:
    issuer = live.setup.issuer
    assert issuer is not None
    t = _audience(live)
    wrong = []
    for i, case in enumerate(tokens_jwt.cases(t, "user", issuer.rsa, "alice")):
        r = _send(live, case.token if case.name != "no token" else None, f"jwt-{i}", scheme=case.scheme)
        got = r.headers.get(REASON_HEADER, "")
        if case.expect:
            if not reasons.proves(case.expect, r.status_code, got):
                wrong.append(f"{case.name}: {r.status_code} {got!r}, expected {case.expect}")
            elif _witnessed(live, f"jwt-{i}"):
                wrong.append(f"{case.name}: refused but reached the upstream")
        elif r.status_code != 200 or got:
            wrong.append(f"{case.name}: {r.status_code} {got!r}, expected admitted")
    assert not wrong, "\n".join(wrong)


def test_valid_token_reaches_upstream_without_token(live: Live) -> None:
    issuer = live.setup.issuer
    assert issuer is not None
    t = _audience(live)
    for signer, alg in ((issuer.rsa, "RS256"), (issuer.rsa, "PS256"), (issuer.ec, "ES256")):
        token = signer.sign(tokens_jwt.valid_claims(t, "user", "bob@example.com"), alg=alg)
        probe = f"jwt-ok-{alg}"
        r = _send(live, token, probe)
        assert r.status_code == 200, (alg, r.status_code, r.headers.get(REASON_HEADER))
        (record,) = _witnessed(live, probe)
        headers = {k.lower(): v for k, v in dict(record["headers"]).items()}   # type: ignore[call-overload]
        assert "authorization" not in headers
        # one principal namespace: the token's kind and issuer, then its subject
        assert headers[PRINCIPAL_HEADER.lower()] == plan_jwt.principal(t, t.issuers[0], "bob@example.com")
        assert headers[PRINCIPAL_HEADER.lower()].startswith("jwt:")


def test_admin_role_not_admitted_where_only_users_are(live: Live) -> None:
    issuer = live.setup.issuer
    assert issuer is not None
    t = _audience(live)
    claims = {**tokens_jwt.valid_claims(t, "user", "carol"), "groups": ["llm-admins"]}
    r = _send(live, issuer.rsa.sign(claims), "jwt-admin")
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (403, "role")


def test_keys_beside_tokens(live: Live) -> None:
    key = next(c for c in live.setup.credentials if c.role == "service")
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    r = _send(live, key.secret, "key-ok", "POST", "/v1/completions", body)
    assert r.status_code == 200, r.headers.get(REASON_HEADER)
    issuer = live.setup.issuer
    assert issuer is not None
    token = issuer.rsa.sign(tokens_jwt.valid_claims(_audience(live), "user", "dave"))
    r = _send(live, token, "jwt-on-key-route", "POST", "/v1/completions", body)
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (401, "unknown-key")
    r = _send(live, key.secret, "key-on-jwt-route")
    assert r.status_code == 401 and r.headers.get(REASON_HEADER, "").startswith("jwt-invalid")


def test_probe_cli_with_token_and_signing_key(live: Live, tmp_path: Path) -> None:
    """``probe --token ROLE=file:PATH --jwt-signing-key FILE --check identity`` against the running
    proxy: every token case proved (exit 0 with proof required); without the signing key the
    admitted token is not proven (VP011), and the token itself is never printed. The CLI's
    plumbing is the same for every proxy: run through Envoy only."""
    import subprocess
    import sys

    if live.proxy != "envoy":
        pytest.skip("the CLI's plumbing is proxy-independent: once, through Envoy")
    issuer = live.setup.issuer
    assert issuer is not None
    t = _audience(live)
    policy = POLICY.replace("users: [10.0.0.0/8]", f"users: [{live.source}/32]") \
        .replace("jwks_file: jwks.json", f"jwks_file: {t.jwks_file}")
    (tmp_path / "policy.yaml").write_text(policy)
    (tmp_path / "key.pem").write_bytes(issuer.private_pem())
    token = issuer.rsa.sign({**tokens_jwt.valid_claims(t, "user", "erin"), "exp": 4102444800})
    (tmp_path / "token").write_text(token + "\n")
    base = [sys.executable, "-m", "scanner.cli.main", "probe", live.url, "--inventory", CATALOG,
            "--policy", str(tmp_path / "policy.yaml"), "--vantage", f"users={live.source}", "--check",
            "identity", "--token", f"user=file:{tmp_path / 'token'}", "--format", "json", "--rate", "0"]
    signed = subprocess.run([*base, "--jwt-signing-key", str(tmp_path / "key.pem"), "--require-proof"],
                            capture_output=True, text=True, timeout=120)
    assert signed.returncode == 0, signed.stdout[-2000:] + signed.stderr[-2000:]
    unsigned = subprocess.run([*base, "--require-proof"], capture_output=True, text=True, timeout=120)
    assert unsigned.returncode == 1 and '"VP011"' in unsigned.stdout, unsigned.stderr[-2000:]
    assert token not in signed.stdout + signed.stderr + unsigned.stdout + unsigned.stderr
