"""The listener's TLS versions and suites (issue 30, item 5): the tls check offers TLS 1.0 alone,
TLS 1.1 alone and TLS 1.2 with broken suites only; the generated NGINX 1.31 and Envoy 1.40
listeners refuse each handshake, and the operator tls-legacy-versions (TLS 1.0 and 1.1 admitted)
fails the run. Probed without a witness, as a real deployment with default flags; the listener
is verify's (its test CA, the mTLS policy of tests/generate/test_mtls_live.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.policy.load import loads
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.probe.testca import TestCa
from tests.generate.test_mtls_live import POLICY
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=4, timeout=10, max_time=120, checks=("tls",))


def run(tmp_path: Path, proxy: str, mutant: str = "") -> ProbeResult:
    (tmp_path / "ca.pem").write_bytes(TestCa.new().pem)   # verify makes its own; the policy names one
    policy = loads(POLICY, source=str(tmp_path / "policy.yaml"), base_dir=tmp_path)
    return probe_through(tmp_path, proxy_named(proxy), policy, CATALOG, OPTIONS, mutant=mutant, witness=False)


def tls(result: ProbeResult) -> dict[str, tuple[str, str]]:
    return {c.subject: (c.status, c.why) for c in result.coverage if c.check == "tls"}


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_the_generated_listener_refuses_legacy_tls(tmp_path: Path, proxy: str) -> None:
    result = run(tmp_path, proxy)
    cov = tls(result)
    assert result.exit_code() == 0 and not result.findings, [(f.title, f.detail) for f in result.findings]
    assert set(cov) == {"tls TLSv1", "tls TLSv1.1", "tls weak ciphers"}, cov
    assert all(status == "proved" for status, _why in cov.values()), cov


@pytest.mark.parametrize("proxy", ["nginx", "nginx-debian", "envoy"])
def test_legacy_versions_admitted_fail_the_probe(tmp_path: Path, proxy: str) -> None:
    result = run(tmp_path, proxy, "tls-legacy-versions")
    cov = tls(result)
    assert result.exit_code() == 1, cov
    assert cov["tls TLSv1"][0] == "failed" and cov["tls TLSv1.1"][0] == "failed", cov
    assert {f.rule for f in result.findings} == {"VP022"}, [(f.rule, f.title) for f in result.findings]
