"""``auth: cert``: the generated configs' shape (the listener's client CA, the certificate
principals in the 0600 principals data, a revoked principal gone), deterministic, accepted by
the proxy itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.errors import GenerateError
from scanner.generate import envoy as envoy_gen
from scanner.generate.interface import GenerateOptions
from scanner.inventory.catalog import load_ref
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy.load import loads
from scanner.probe.testca import TestCa
from scanner.runtime.proxy import EnvoyProxy
from tests.generate.test_mtls_live import POLICY


def _plan(tmp_path: Path, text: str = POLICY) -> Plan:
    ca = TestCa.new()
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    cert, key = ca.issue("CN=listener", ips=("127.0.0.1",), server=True).write(tmp_path, "server")
    text = text.replace("/unused.crt", cert).replace("/unused.key", key)
    return build(load_ref("vllm-0.29.0-default"), loads(text, source=str(tmp_path / "p.yaml"), base_dir=tmp_path))


def _files(plan: Plan, out: Path) -> dict[str, str]:
    return {f.name: f.content for f in envoy_gen.EnvoyGenerator().render(
        plan, GenerateOptions(output_dir=str(out))).files}


def test_envoy_config_shape(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    a, b = _files(plan, tmp_path / "a"), _files(plan, tmp_path / "a")
    assert a == b
    yaml_text = a["envoy.yaml"]
    assert "require_client_certificate: false" in yaml_text
    assert f"trusted_ca: {{filename: \"{tmp_path / 'ca.pem'}\"}}" in yaml_text
    assert "max_verify_depth: 2" in yaml_text
    tsv = a["envoy-principals.tsv"]
    assert "cert\tsan:spiffe://example.org/ns/app/sa/worker\tworker-a\tworker\n" in tsv
    assert "cert\tsubject:CN=batch,O=Example\tbatch\tworker\n" in tsv
    assert EnvoyProxy().validate(plan, EnvoyProxy().write(plan, tmp_path / "e")) == ""


def test_envoy_revoked_principal_is_gone(tmp_path: Path) -> None:
    text = POLICY.replace("  - {name: batch, role: worker, subject: 'CN=batch,O=Example'}\n", "")
    tsv = _files(_plan(tmp_path, text), tmp_path / "a")["envoy-principals.tsv"]
    assert "batch" not in tsv and "worker-a" in tsv


def test_envoy_refuses_concurrency_per_certificate(tmp_path: Path) -> None:
    text = POLICY.replace("limits: {rate: {rps: 500, burst: 500}}", "limits: {concurrency: 2}")
    with pytest.raises(GenerateError, match="per certificate principal"):
        _files(_plan(tmp_path, text), tmp_path / "a")
