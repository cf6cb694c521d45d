"""The differential identity corpus through the real proxies (issue 26): every token form and
certificate form of tests/differential/identity_corpus.py is judged by the reference
(scanner/plan/credential.py) and by each proxy (NGINX 1.31, NGINX 1.22, Envoy 1.40, started once
per module), and they must agree on admission, principal and reason token; a refused form never
reaches the upstream. Client certificate chains with 0..3 intermediates prove ``verify_depth``
(N intermediates allowed) on each proxy."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import credential
from scanner.plan import jwt as plan_jwt
from scanner.plan.model import PRINCIPAL_HEADER, REASON_HEADER
from scanner.policy.load import loads
from scanner.probe import tokens_jwt
from scanner.probe.testca import TestCa
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.differential import identity_corpus as corpus
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
DEPTH = 2
POLICY = f"""
schema_version: 1
name: identity-corpus
networks:
  users: [10.0.0.0/8]
listen:
  tls: {{cert: /unused.crt, key: /unused.key, client_ca: ca.pem, verify_depth: {DEPTH}}}
audiences:
  people:
    kind: end-user
    networks: [users]
    auth: jwt
    roles: [user]
    limits: {{rate: {{rps: 5000, burst: 5000}}}}
    jwt:
      issuers: [https://issuer.example]
      audiences: [vllm]
      jwks_file: jwks.json
      required_claims: {{tenant: [acme, beta]}}
      role_claim: groups
      roles: {{llm-users: user, llm-admins: admin}}
  workloads:
    kind: service
    networks: [users]
    auth: cert
    roles: [worker]
  admins:
    kind: operator
    networks: [users]
    auth: cert
    roles: [admin]
principals:
  - {{name: worker-a, role: worker, san: 'spiffe://example.org/ns/app/sa/worker'}}
  - {{name: batch, role: worker, subject: 'CN=batch,O=Example'}}
  - {{name: ops, role: admin, san: 'spiffe://example.org/ns/ops/sa/admin'}}
routes:
  - {{path: /v1/models, methods: [GET], audience: people}}
  - {{path: /version, methods: [GET], audience: workloads}}
  - {{path: /health, methods: [GET], audience: admins}}
"""
TOKEN_PATH, CERT_PATH = "/v1/models", "/version"


@dataclass
class Live:
    port: int
    witness: str
    setup: loop.Setup
    source: str
    directory: Path
    proxy: str
    chain_root: TestCa


@pytest.fixture(scope="module", params=["envoy", "nginx", "nginx-debian", "nginx-lua"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    proxy = proxy_named(request.param)
    tmp = tmp_path_factory.mktemp(f"identity-{request.param}")
    tokens_jwt.Issuer.new().write_jwks(tmp / "jwks.json")   # for loading; verify's issuer replaces it
    (tmp / "ca.pem").write_bytes(TestCa.new().pem)          # likewise verify's CA
    policy = loads(POLICY, source=str(tmp / "policy.yaml"), base_dir=tmp)
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, policy, tmp, port)
    # a second root in the client CA bundle, which may have intermediates below it (verify's may not)
    chain_root = TestCa.new("chain root", path_length=None)
    with open(s.ca_file, "ab") as bundle:
        bundle.write(chain_root.pem)
    directory = tmp / "proxy"
    proxy.write(s.plan, directory)
    with ExitStack() as stack:
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", port))
        loop.start_checked(proxy, s.plan, directory, stack)
        source = next(v.address for v in s.vantages if v.name == "users")
        yield Live(s.plan.listen.port, standin.url, s, source or "", tmp, request.param, chain_root)


@dataclass(frozen=True)
class Answer:
    status: int            # 0: the TLS handshake was refused
    reason: str


def _context(live: Live, cert: tuple[str, str] | None, tls12: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=live.setup.ca_file)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    if tls12:   # a refused certificate fails the handshake itself (TLS 1.3 alerts after Finished)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _send(live: Live, path: str, probe: str, authorization: Sequence[str] = (),
          cert: tuple[str, str] | None = None, tls12: bool = False) -> Answer:
    """One GET over its own TLS connection, the Authorization values written as given."""
    head = f"GET {path}?vp_probe={probe} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += "".join(f"Authorization: {a}\r\n" for a in authorization) + "\r\n"
    data = b""
    try:
        raw = socket.create_connection(("127.0.0.1", live.port), timeout=10, source_address=(live.source, 0))
        with _context(live, cert, tls12).wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            with contextlib.suppress(OSError):   # a proxy refusing a huge header closes early
                conn.sendall(head.encode("latin-1"))
            deadline = time.monotonic() + 10
            while b"\r\n\r\n" not in data and time.monotonic() < deadline:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (ssl.SSLError, ConnectionError) as exc:
        if not data:
            return Answer(0, f"handshake: {type(exc).__name__}")
    lines = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/"):
        return Answer(0, "no answer")
    reason = next((ln.split(":", 1)[1].strip() for ln in lines[1:]
                   if ln.lower().startswith(REASON_HEADER.lower() + ":")), "")
    return Answer(int(lines[0].split()[1]), reason)


def _witnessed(live: Live, probe: str) -> list[dict[str, object]]:
    r = httpx.get(f"{live.witness}/__standin__/witness?id={urllib.parse.quote(probe)}", timeout=5)
    if r.status_code != 200:
        return []
    data = r.json()
    return list(data.get("records", [data] if data else []))


def _principal_seen(live: Live, probe: str) -> str | None:
    """The principal header of the request that reached the upstream (None: none reached it)."""
    records = _witnessed(live, probe)
    if not records:
        return None
    headers = {k.lower(): v for k, v in dict(records[0]["headers"]).items()}   # type: ignore[call-overload]
    return str(headers.get(PRINCIPAL_HEADER.lower(), ""))


def _disagreement(name: str, want: credential.Verdict, got: Answer, seen: str | None) -> str:
    expected = f"admitted as {want.principal!r}" if want.admitted else f"{want.status} {want.reason}"
    if want.admitted:
        if got.status == 200 and not got.reason and seen == want.principal:
            return ""
        return f"{name}: {got.status} {got.reason!r}, upstream saw {seen!r}; reference: {expected}"
    if (got.status, got.reason) == (want.status, want.reason) and seen is None:
        return ""
    return f"{name}: {got.status} {got.reason!r}{' (reached the upstream)' if seen is not None else ''}; reference: {expected}"


def test_token_corpus_agrees_with_the_reference(live: Live) -> None:
    s = live.setup
    assert s.issuer is not None
    d = s.plan.decision("GET", TOKEN_PATH)
    assert d is not None and d.jwt is not None
    t, algorithms = d.jwt, plan_jwt.verified(d, "nginx" if live.proxy.startswith("nginx") else "envoy")
    forms = corpus.token_forms(t, s.issuer, int(time.time()))
    assert len(forms) >= 300, len(forms)
    wrong, admitted = [], 0
    for i, form in enumerate(forms):
        probe = f"idc-{i}"
        before = int(time.time())
        got = _send(live, TOKEN_PATH, probe, form.authorization)
        after = int(time.time())
        seen = _principal_seen(live, probe)
        want = credential.judge_token(t, algorithms, form.authorization, before, d.roles)
        why = _disagreement(form.name, want, got, seen)
        if why and after != before:
            # the proxy read its clock between the two: a claim at a second's edge (a form made
            # "within the skew" when the corpus was made, reached just as the skew ran out) reads
            # either way; the reference at the later second decides then
            want = credential.judge_token(t, algorithms, form.authorization, after, d.roles)
            why = _disagreement(form.name, want, got, seen)
        admitted += want.admitted
        if why:
            wrong.append(why)
    assert not wrong, f"{len(wrong)} of {len(forms)} forms disagree on {live.proxy}:\n" + "\n".join(wrong)
    assert admitted >= 20, admitted        # the corpus admits forms too, not only refusals


def _san_and_subject(cert_file: str) -> tuple[list[str], str]:
    cert = x509.load_pem_x509_certificates(Path(cert_file).read_bytes())[0]
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        sans = list(ext.value.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        sans = []
    return sans, cert.subject.rfc4514_string()


def test_certificate_corpus_agrees_with_the_reference(live: Live) -> None:
    s = live.setup
    assert s.ca is not None
    principals = s.plan.certs
    by_name = {p.name: p for p in principals}
    forms = corpus.cert_forms(lambda n: by_name[n].san, lambda n: by_name[n].subject)
    d = s.plan.decision("GET", CERT_PATH)
    assert d is not None
    wrong = []
    for i, form in enumerate(forms):
        files = corpus.issue(s.ca, form).write(live.directory, f"form-{i}")   # type: ignore[attr-defined]
        sans, subject = _san_and_subject(files[0])
        want = credential.judge_certificate(principals, True, True, sans, subject, d.roles)
        probe = f"idc-cert-{i}"
        got = _send(live, CERT_PATH, probe, cert=files)
        why = _disagreement(form.name, want, got, _principal_seen(live, probe))
        if why:
            wrong.append(why)
    want = credential.judge_certificate(principals, False, False, [], "", d.roles)
    got = _send(live, CERT_PATH, "idc-cert-none")
    if (got.status, got.reason) != (want.status, want.reason):
        wrong.append(f"no certificate: {got}; reference: {want}")
    assert not wrong, f"{len(wrong)} of {len(forms) + 1} forms disagree on {live.proxy}:\n" + "\n".join(wrong)


def test_revoked_spiffe_id_never_falls_back_to_its_subject(live: Live) -> None:
    """A SPIFFE workload whose SAN was removed from the plan, holding a certificate whose subject
    names a subject principal: refused (cert-unknown), not admitted as that principal."""
    s = live.setup
    assert s.ca is not None
    files = s.ca.issue("CN=batch,O=Example", san="spiffe://example.org/ns/app/sa/revoked") \
        .write(live.directory, "revoked")
    got = _send(live, CERT_PATH, "idc-revoked", cert=files)
    assert (got.status, got.reason) == (403, "cert-unknown")
    assert _principal_seen(live, "idc-revoked") is None


def test_verify_depth_counts_intermediates(live: Live) -> None:
    """``verify_depth: N`` allows N intermediates between a client certificate and the client CA
    on every proxy: chains of 0..N are admitted, N + 1 refused by the listener (Envoy fails the
    handshake, NGINX answers 401 cert-invalid)."""
    ca, answers = live.chain_root, []
    for n in range(DEPTH + 2):
        files = ca.issue("CN=w", san="spiffe://example.org/ns/app/sa/worker").write(live.directory, f"chain-{n}")
        got = _send(live, CERT_PATH, f"idc-chain-{n}", cert=files, tls12=True)
        listener_refused = got.status == 0 or (got.status, got.reason) == (401, "cert-invalid")
        answers.append(f"{n} intermediates: {'refused' if listener_refused else got.status}")
        ca = ca.intermediate(f"intermediate {n + 1}")
    want = [f"{n} intermediates: {200 if credential.chain_within(n, DEPTH) else 'refused'}" for n in range(DEPTH + 2)]
    assert answers == want, (live.proxy, answers)
    assert json.dumps(answers).count("refused") == 1
