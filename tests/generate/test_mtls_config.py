"""``auth: cert``: the generated configs' shape (the listener's client CA, the certificate
principals in the 0600 principals data, a revoked principal gone), deterministic, accepted by
the proxy itself."""

from __future__ import annotations

import json
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
    assert "max_verify_depth: 3" in yaml_text   # verify_depth 2 intermediates + the trust anchor
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


def _nginx_files(plan: Plan, out: Path) -> dict[str, str]:
    from scanner.generate import nginx as nginx_gen

    return {Path(f.name).name: f.content for f in nginx_gen.NginxGenerator().render(
        plan, GenerateOptions(output_dir=str(out))).files}


def test_nginx_config_shape(tmp_path: Path) -> None:
    from scanner.runtime.proxy import NginxProxy
    from tests.probe.realproxy import proxy_named

    plan = _plan(tmp_path)
    a, b = _nginx_files(plan, tmp_path / "a"), _nginx_files(plan, tmp_path / "a")
    assert a == b
    http = a["perimeter-http.conf"]
    assert "ssl_verify_client optional;" in http and f'ssl_client_certificate "{tmp_path / "ca.pem"}";' in http
    assert "ssl_verify_depth 2;" in http
    assert "map $ssl_client_verify $perimeter_cert_verified {\n    default \"\";\n    SUCCESS $perimeter_cert_who;" in http
    assert "if ($ssl_client_verify = NONE) { return 401; }" in http
    assert "proxy_set_header X-Perimeter-Principal $perimeter_cert_principal;" in http
    certs = json.loads(a["perimeter-identity.json"])["certs"]   # preloaded once, not parsed per request
    assert certs["san:spiffe://example.org/ns/app/sa/worker"] == ["worker-a", "worker"]
    assert certs["subject:CN=batch,O=Example"] == ["batch", "worker"]
    assert "js_preload_object perimeter_identity from" in http
    revoked = POLICY.replace("  - {name: batch, role: worker, subject: 'CN=batch,O=Example'}\n", "")
    assert "batch" not in _nginx_files(_plan(tmp_path, revoked), tmp_path / "r")["perimeter-identity.json"]
    proxy = proxy_named("nginx")
    assert isinstance(proxy, NginxProxy)
    proxy.write(plan, tmp_path / "n")
    assert proxy.validate(plan, tmp_path / "n") == ""


@pytest.mark.parametrize("proxy", ["envoy", "nginx"])
def test_kubernetes_mounts_the_client_ca(tmp_path: Path, proxy: str) -> None:
    """The bundle mounts listen.tls.client_ca from the <name>-tls Secret the user creates (key
    client-ca.crt) at the policy's path, as it mounts the listener's certificate."""
    from tests.generate.test_kubernetes import UPSTREAM, assert_valid, docs, pod_spec, render

    ca = TestCa.new()
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    cert, key = ca.issue("CN=listener", ips=("127.0.0.1",), server=True).write(tmp_path, "server")
    text = POLICY.replace("/unused.crt", cert).replace("/unused.key", key) + UPSTREAM
    policy = loads(text, source=str(tmp_path / "p.yaml"), base_dir=tmp_path)
    _config, bundle = render(proxy, policy)
    assert_valid(bundle)
    spec = pod_spec(docs(bundle)["deployment.yaml"])
    mounts = {m["mountPath"]: m for c in spec["containers"] for m in c["volumeMounts"]}
    assert mounts[str(tmp_path / "ca.pem")]["subPath"] == "client-ca.crt"


def test_nginx_cert_config_has_no_gixy_findings(tmp_path: Path) -> None:
    """The certificate's principal reaches a header, the log and the zone keys only through maps
    admitting name characters: gixy finds nothing of it (no header splitting)."""
    from tests.generate.test_gixy import findings, summary
    from tests.probe.realproxy import proxy_named

    proxy = proxy_named("nginx")
    conf = proxy.write(_plan(tmp_path), tmp_path / "out")
    found = findings(next(conf.rglob("nginx.conf")))
    # any TLS listener's (not the certificates'): the default ciphers, no HSTS header
    listener = {"weak_ssl_tls", "hsts_header"}
    assert [f for f in found if f["plugin"] not in listener] == [], summary(found)
