"""The mtls check (client certificates of auth: cert audiences) through the real proxies: every
certificate mutation operator caught by it (exit 1, VP021). Keys and certificates side by side in
one policy; verify's test CA; the stand-in and its witness behind the proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.policy.load import loads
from scanner.probe.interface import ProbeOptions
from scanner.probe.testca import TestCa
from tests.generate.test_mtls_live import POLICY
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300, checks=("mtls",))
CERT_OPERATORS = ("cert-any-ca", "cert-san-unchecked", "cert-revoked-mapped", "cert-san-fallback")


@pytest.mark.parametrize("proxy", ["envoy", "nginx", "nginx-debian"])
@pytest.mark.parametrize("mutant", ("", *CERT_OPERATORS))
def test_cert_operators_caught_by_mtls(tmp_path: Path, proxy: str, mutant: str) -> None:
    (tmp_path / "ca.pem").write_bytes(TestCa.new().pem)
    policy = loads(POLICY, source=str(tmp_path / "policy.yaml"), base_dir=tmp_path)
    res = probe_through(tmp_path, proxy_named(proxy), policy, CATALOG, OPTIONS, mutant=mutant)
    if not mutant:
        assert res.exit_code() == 0, [(f.rule, f.title) for f in res.findings]
        return
    assert res.exit_code() == 1
    caught = {f.rule for f in res.findings if f.check == "mtls"}
    assert "VP021" in caught, [(f.rule, f.title) for f in res.findings]
    if mutant == "cert-san-fallback":   # caught by the revoked SPIFFE ID carrying batch's subject
        failed = {a.credential for a in res.attempts if a.check == "mtls" and a.verdict == "failed"}
        assert failed == {"cert:revoked-san:batch"}, failed


OWNED_ROUTES = """routes:
  - {path: /v1/responses, methods: [POST], audience: workloads}
  - {path: "/v1/responses/{response_id}", methods: [GET], audience: workloads}
  - {path: "/v1/responses/{response_id}/cancel", methods: [POST], audience: workloads}
"""


@pytest.mark.parametrize("proxy", ["envoy", "nginx"])
def test_stored_responses_owned_by_certificate_principals(tmp_path: Path, proxy: str) -> None:
    """responses: owned on a cert audience: a response created by one certificate principal is
    refused to another (the ownership check with two certificate principals), exit 0."""
    (tmp_path / "ca.pem").write_bytes(TestCa.new().pem)
    (tmp_path / "rsecret").write_text("r" * 48)
    (tmp_path / "rsecret").chmod(0o600)
    text = POLICY.replace("routes:\n", f"body: {{responses: owned, responses_secret_file: {tmp_path}/rsecret}}\n"
                          + OWNED_ROUTES, 1)
    policy = loads(text, source=str(tmp_path / "policy.yaml"), base_dir=tmp_path)
    res = probe_through(tmp_path, proxy_named(proxy), policy, CATALOG,
                        ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300,
                                     checks=("ownership", "mtls")))
    assert res.exit_code() == 0, [(f.rule, f.title) for f in res.findings]
    owned = [c for c in res.coverage if c.check == "ownership"]
    assert owned and all(c.status == "proved" for c in owned), owned
