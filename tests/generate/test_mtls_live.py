"""Workload identity (``auth: cert``) through the real proxies: a client certificate from the
listener's client CA names a principal by its URI SAN or subject; no certificate, one from another
CA, an expired one, an unknown name, a role the route does not admit: refused; a valid one admitted
with its principal (the stand-in's witness sees the principal header). API keys on another audience
share the listener. One proxy started per module and proxy (a few seconds each)."""

from __future__ import annotations

import json
import ssl
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.model import PRINCIPAL_HEADER, REASON_HEADER
from scanner.policy.load import loads
from scanner.probe.testca import TestCa
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
POLICY = """
schema_version: 1
name: mtls-live
networks:
  cluster: [10.0.0.0/8]
listen:
  tls: {cert: /unused.crt, key: /unused.key, client_ca: ca.pem}
audiences:
  workloads:
    kind: service
    networks: [cluster]
    auth: cert
    roles: [worker]
    limits: {rate: {rps: 500, burst: 500}}
  admins:
    kind: operator
    networks: [cluster]
    auth: cert
    roles: [admin]
  services:
    kind: service
    networks: [cluster]
    roles: [service]
principals:
  - {name: worker-a, role: worker, san: 'spiffe://example.org/ns/app/sa/worker'}
  - {name: batch, role: worker, subject: 'CN=batch,O=Example'}
  - {name: ops, role: admin, san: 'spiffe://example.org/ns/ops/sa/admin'}
routes:
  - {path: /v1/models, methods: [GET], audience: workloads}
  - {path: /v1/chat/completions, methods: [POST], audience: admins}
  - {path: /v1/completions, methods: [POST], audience: services}
"""


@dataclass
class Live:
    url: str
    witness: str
    setup: loop.Setup
    source: str
    directory: Path
    proxy: str


@pytest.fixture(scope="module", params=["envoy", "nginx", "nginx-debian"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    proxy = proxy_named(request.param)
    tmp = tmp_path_factory.mktemp(f"mtls-{request.param}")
    (tmp / "ca.pem").write_bytes(TestCa.new().pem)   # any CA for loading; verify's replaces it
    policy = loads(POLICY, source=str(tmp / "policy.yaml"), base_dir=tmp)
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, policy, tmp, port)
    directory = tmp / "proxy"
    proxy.write(s.plan, directory)
    with ExitStack() as stack:
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", port))
        loop.start_checked(proxy, s.plan, directory, stack)
        source = next(v.address for v in s.vantages if v.name == "cluster")
        yield Live(f"https://127.0.0.1:{s.plan.listen.port}", standin.url, s, source or "", tmp, request.param)


def _context(live: Live, cert: tuple[str, str] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=live.setup.ca_file)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


def _send(live: Live, cert: tuple[str, str] | None, probe: str, method: str = "GET",
          path: str = "/v1/models", body: object = None, key: str = "") -> httpx.Response:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    transport = httpx.HTTPTransport(local_address=live.source, verify=_context(live, cert))
    with httpx.Client(transport=transport, timeout=10) as c:
        return c.request(method, f"{live.url}{path}?vp_probe={probe}", headers=headers,
                         content=json.dumps(body).encode() if body is not None else None)


def _refused_at_tls(live: Live, cert: tuple[str, str], probe: str) -> str:
    """How the listener refused a certificate it cannot verify: "handshake" or "STATUS REASON"."""
    try:
        r = _send(live, cert, probe)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, ssl.SSLError):
        return "handshake"
    return f"{r.status_code} {r.headers.get(REASON_HEADER, '')}"


def _witnessed(live: Live, probe: str) -> list[dict[str, object]]:
    r = httpx.get(f"{live.witness}/__standin__/witness?id={urllib.parse.quote(probe)}", timeout=5)
    if r.status_code != 200:
        return []
    data = r.json()
    return list(data.get("records", [data] if data else []))


def _client(live: Live, name: str) -> tuple[str, str]:
    c = next(c for c in live.setup.client_certs if c.principal == name)
    return c.cert, c.key


def _issued(live: Live, stem: str, ca: TestCa | None = None, **kw: object) -> tuple[str, str]:
    ca = ca or live.setup.ca
    assert ca is not None
    return ca.issue(**kw).write(live.directory, stem)   # type: ignore[arg-type]


def test_valid_certificates_admitted_with_their_principal(live: Live) -> None:
    for name in ("worker-a", "batch"):
        r = _send(live, _client(live, name), f"ok-{name}")
        assert r.status_code == 200, (name, r.status_code, r.headers.get(REASON_HEADER))
        (record,) = _witnessed(live, f"ok-{name}")
        headers = {k.lower(): v for k, v in dict(record["headers"]).items()}   # type: ignore[call-overload]
        assert headers[PRINCIPAL_HEADER.lower()] == name


def test_rotation_same_san_new_certificate(live: Live) -> None:
    """The principal is the SAN: a newly issued certificate with it works without a reload."""
    fresh = _issued(live, "worker-a-rotated", subject="CN=rotated", san="spiffe://example.org/ns/app/sa/worker")
    r = _send(live, fresh, "rotated")
    assert r.status_code == 200, r.headers.get(REASON_HEADER)


def test_certificate_refusals(live: Live) -> None:
    r = _send(live, None, "no-cert")
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (401, "cert-missing")
    unknown = _issued(live, "unknown", subject="CN=stranger", san="spiffe://example.org/ns/app/sa/stranger")
    r = _send(live, unknown, "unknown")
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (403, "cert-unknown")
    # two URI SANs (one a principal's): no principal by SAN (an X.509-SVID has exactly one)
    two = _issued(live, "two-sans", subject="CN=x", san="spiffe://example.org/ns/app/sa/worker",
                  more_sans=("spiffe://example.org/ns/app/sa/other",))
    r = _send(live, two, "two-sans")
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (403, "cert-unknown")
    # ... nor by its subject, even one naming a subject principal: a certificate with any URI SAN is
    # named by it alone (a revoked SPIFFE ID never falls back to its subject)
    two_batch = _issued(live, "two-sans-batch", subject="CN=batch,O=Example",
                        san="spiffe://example.org/ns/app/sa/worker", more_sans=("spiffe://x/y",))
    r = _send(live, two_batch, "two-sans-batch")
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (403, "cert-unknown")
    r = _send(live, _client(live, "ops"), "wrong-role")
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (403, "role")
    r = _send(live, _client(live, "worker-a"), "admin-route", "POST", "/v1/chat/completions",
              {"model": "m", "messages": []})
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (403, "role")
    for probe in ("no-cert", "unknown", "two-sans", "two-sans-batch", "wrong-role", "admin-route"):
        assert not _witnessed(live, probe), probe


def test_other_ca_and_expired_refused_by_the_listener(live: Live) -> None:
    other = _issued(live, "other-ca", TestCa.new("another CA"), subject="CN=worker",
                    san="spiffe://example.org/ns/app/sa/worker")
    expired = _issued(live, "expired", subject="CN=worker", san="spiffe://example.org/ns/app/sa/worker",
                      expired=True)
    for name, cert in (("other-ca", other), ("expired", expired)):
        how = _refused_at_tls(live, cert, name)
        # Envoy fails the handshake; NGINX answers its 495 as 401 cert-invalid
        assert how == ("handshake" if live.proxy == "envoy" else "401 cert-invalid"), (name, how)
        assert not _witnessed(live, name), name


def test_keys_beside_certificates(live: Live) -> None:
    key = next(c for c in live.setup.credentials if c.role == "service")
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    r = _send(live, None, "key-ok", "POST", "/v1/completions", body, key=key.secret)
    assert r.status_code == 200, r.headers.get(REASON_HEADER)
    r = _send(live, _client(live, "worker-a"), "cert-on-key-route", "POST", "/v1/completions", body)
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (401, "missing-key")
    r = _send(live, None, "key-on-cert-route", key=key.secret)
    assert (r.status_code, r.headers.get(REASON_HEADER)) == (401, "cert-missing")


def test_probe_mtls_and_access_checks_prove_the_plan(live: Live) -> None:
    """The probe's mtls check (no certificate, another CA, expired, unknown, a role not admitted,
    the admitted principal) and the access matrix (keys and certificates on every route) against
    the running proxy: every subject proved, no finding."""
    from scanner.probe.interface import ProbeOptions
    from scanner.probe.runner import probe

    options = loop.probe_options(live.setup, ProbeOptions(checks=("mtls", "matrix"), rate=0), live.witness)
    res = probe(live.setup.plan, loop.target_of(live.setup), live.setup.credentials, live.setup.vantages,
                options)
    assert not res.findings, [f.title for f in res.findings]
    mtls = [c for c in res.coverage if c.check == "mtls"]
    assert len(mtls) == 4 and all(c.status == "proved" for c in mtls), mtls
    sent = {a.credential for a in res.attempts if a.check == "mtls"}
    assert {"cert:none", "cert:other-ca", "cert:expired", "cert:unknown", "cert:principal:worker-a",
            "cert:principal:ops"} <= sent, sent
