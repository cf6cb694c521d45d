"""One principal namespace (issue 26) through the real proxies (NGINX 1.31 and 1.22 with njs,
Envoy 1.40 with Lua): a bearer token whose subject is a key principal's name is its own
principal, ``jwt:ID:NAME`` (scanner/plan/jwt.py), never the key's. The key principal spends its
rate burst and the token is still admitted (its own bucket); the witness sees the two principal
headers differ; a response id sealed to the key principal is refused to the token (403
not-owner: responses: owned); the access log names each apart. One proxy per module and kind."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scanner.audit import access_log
from scanner.errors import PolicyError
from scanner.inventory.catalog import load_ref
from scanner.limiter import keys
from scanner.net import free_port
from scanner.plan import jwt as plan_jwt
from scanner.plan import owner
from scanner.plan.model import PRINCIPAL_HEADER, REASON_HEADER
from scanner.policy.jwt import JwtAuth
from scanner.policy.load import loads
from scanner.probe import tokens_jwt
from scanner.probe.interface import Credential
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
POLICY = """
schema_version: 1
name: one-namespace
networks:
  users: [10.0.0.0/8]
body:
  responses: owned
  responses_secret_file: /unused/x
audiences:
  people:
    kind: end-user
    networks: [users]
    auth: jwt
    roles: [user]
    limits: {rate: {rps: 1, burst: 3}}
    jwt:
      issuers: [https://issuer.example, https://other-issuer.example]
      audiences: [vllm]
      jwks_file: jwks.json
      role: user
  services:
    kind: service
    networks: [users]
    roles: [service]
    limits: {rate: {rps: 1, burst: 3}}
routes:
  - {path: /v1/models, methods: [GET], audience: services}
  - {path: /v1/responses, methods: [POST], audience: services}
  - {path: /v1/chat/completions, methods: [POST], audience: people}
  - {path: "/v1/responses/{response_id}", methods: [GET], audience: people}
"""
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@dataclass
class Front:
    base: str
    witness: str
    source: str
    directory: Path
    key: Credential
    name: str              # the key principal's name
    t: JwtAuth
    issuer: tokens_jwt.Issuer
    secret: bytes

    def send(self, method: str, path: str, probe: str, bearer: str, body: object = None) -> httpx.Response:
        with httpx.Client(transport=httpx.HTTPTransport(local_address=self.source), timeout=10) as c:
            return c.request(method, f"{self.base}{path}", params={"vp_probe": probe}, json=body,
                             headers={"Authorization": f"Bearer {bearer}"})

    def seen(self, probe: str) -> str:
        """The principal header the upstream saw on ``probe``'s request."""
        r = httpx.get(f"{self.witness}/__standin__/witness?id={urllib.parse.quote(probe)}", timeout=5)
        data = r.json()
        (record,) = data.get("records", [data])
        headers = {str(k).lower(): str(v) for k, v in record["headers"]}
        return headers.get(PRINCIPAL_HEADER.lower(), "")

    def token(self, subject: str, issuer: int = 0) -> str:
        claims = {**tokens_jwt.valid_claims(self.t, "user", subject), "iss": self.t.issuers[issuer]}
        return self.issuer.rsa.sign(claims)


@pytest.fixture(scope="module", params=["nginx", "nginx-debian", "envoy"])
def front(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    proxy = proxy_named(request.param)
    tmp = tmp_path_factory.mktemp(f"namespace-{request.param}")
    tokens_jwt.Issuer.new().write_jwks(tmp / "jwks.json")   # for loading; verify's issuer replaces it
    policy = loads(POLICY, source=str(tmp / "policy.yaml"), base_dir=tmp)
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, policy, tmp, port)
    key = next(c for c in s.credentials if c.role == "service")
    name = next(p.name for p in s.plan.principals if p.role == "service")
    d = s.plan.decision("POST", "/v1/chat/completions")
    assert d is not None and d.jwt is not None and s.issuer is not None and s.owner_secret
    directory = tmp / "proxy"
    proxy.write(s.plan, directory)
    with ExitStack() as stack:
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", port))
        loop.start_checked(proxy, s.plan, directory, stack)
        source = next(v.address for v in s.vantages if v.name == "users") or ""
        yield Front(f"http://127.0.0.1:{s.plan.listen.port}", standin.url, source, directory, key, name, d.jwt,
                    s.issuer, s.owner_secret.encode())


def test_the_plan_names_token_principals_apart() -> None:
    t = JwtAuth(issuers=("https://a.example", "https://b.example"), audiences=("v",), jwks_file="/jwks.json", keys=())
    a, b = plan_jwt.prefixes(t)
    assert a != b and a.startswith("jwt:") and b.startswith("jwt:")
    assert plan_jwt.principal(t, "https://a.example", "svc") == a + "svc"
    assert len(plan_jwt.principal(t, "https://a.example", "x" * 256)) == plan_jwt.PRINCIPAL_MAX
    # another principal claim of one issuer: another namespace too
    assert plan_jwt.prefix("https://a.example", "email") != a
    assert plan_jwt.clash([t]) == ""
    # the shared limiter takes the longest token principal as a key
    assert keys.checked("key", plan_jwt.principal(t, "https://a.example", "x" * 256))


def test_a_key_principal_cannot_be_named_like_a_token_principal(tmp_path: Path) -> None:
    tokens_jwt.Issuer.new().write_jwks(tmp_path / "jwks.json")
    text = POLICY.replace("body:\n", "principals:\n  - {name: 'jwt:0a1b2c3d:svc', role: service, "
                          f"key_sha256: {'0' * 64}}}\nbody:\n", 1)
    with pytest.raises(PolicyError, match="use letters, digits"):
        loads(text, source=str(tmp_path / "policy.yaml"), base_dir=tmp_path)


def test_a_subject_named_as_a_key_principal_is_its_own_principal(front: Front) -> None:
    # the key principal spends its burst: its bucket is empty
    statuses = [front.send("GET", "/v1/models", f"ns-key-{i}", front.key.secret).status_code for i in range(8)]
    assert 429 in statuses and 200 in statuses, statuses
    r = front.send("GET", "/v1/models", "ns-key-seen", front.key.secret)
    assert r.status_code == 429
    # the token whose subject is the key principal's name: admitted (its own bucket), named apart
    r = front.send("POST", "/v1/chat/completions", "ns-token", front.token(front.name), CHAT)
    assert r.status_code == 200 and not r.headers.get(REASON_HEADER), (r.status_code, r.headers)
    token_principal = front.seen("ns-token")
    assert token_principal == plan_jwt.principal(front.t, front.t.issuers[0], front.name) != front.name
    # the same subject from the policy's other issuer: a third principal
    r = front.send("POST", "/v1/chat/completions", "ns-token-2", front.token(front.name, 1), CHAT)
    assert r.status_code == 200, r.headers.get(REASON_HEADER)
    assert front.seen("ns-token-2") == plan_jwt.principal(front.t, front.t.issuers[1], front.name)
    assert front.seen("ns-token-2") != token_principal
    time.sleep(3.1)   # the key's bucket refills (1 r/s): one more admitted request to compare headers
    r = front.send("GET", "/v1/models", "ns-key-ok", front.key.secret)
    assert r.status_code == 200 and front.seen("ns-key-ok") == front.name


def test_a_response_sealed_to_the_key_principal_is_refused_to_the_token(front: Front) -> None:
    time.sleep(3.1)   # after the previous test's burst
    r = front.send("POST", "/v1/responses", "ns-create", front.key.secret,
                   {"model": "m", "input": "hi", "max_output_tokens": 3})
    assert r.status_code == 200, (r.status_code, r.headers.get(REASON_HEADER))
    sealed = str(r.json()["id"])
    rid = owner.unseal(front.secret, front.name, sealed)   # sealed to the key principal
    assert rid is not None
    # the token named like the key principal holds no seal of it
    r = front.send("GET", f"/v1/responses/{sealed}", "ns-read", front.token(front.name))
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (403, "not-owner")
    # its own seal (of its namespaced name) passes the perimeter
    mine = owner.seal(front.secret, plan_jwt.principal(front.t, front.t.issuers[0], front.name), rid)
    r = front.send("GET", f"/v1/responses/{mine}", "ns-read-own", front.token(front.name))
    assert not r.headers.get(REASON_HEADER), (r.status_code, r.headers.get(REASON_HEADER))


def test_the_access_log_names_them_apart(front: Front) -> None:
    time.sleep(1.1)
    assert front.send("GET", "/v1/models", "ns-log-key", front.key.secret).status_code == 200
    assert front.send("POST", "/v1/chat/completions", "ns-log-token", front.token(front.name), CHAT).status_code == 200
    want = {front.name, plan_jwt.principal(front.t, front.t.issuers[0], front.name)}
    names: set[str] = set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not want <= names:
        logs = list(front.directory.rglob("access.log")) or list(front.directory.parent.rglob("access.log"))
        names = {e.principal for log in logs for e in access_log.read(log)[0]}
        time.sleep(0.5)
    assert want <= names, sorted(names)
