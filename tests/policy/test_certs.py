"""``auth: cert`` in a policy: the listener's client CA, certificate principals (URI SAN or
subject), and what the plan decides."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.errors import PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan.build import build
from scanner.policy.load import loads
from scanner.probe.testca import TestCa

KEY = "a" * 64
BASE = """
schema_version: 1
name: t
networks: {{any: [0.0.0.0/0]}}
listen:
  port: 8443
  tls: {{cert: /tmp/s.crt, key: /tmp/s.key{ca}}}
audiences:
  workloads:
    kind: service
    networks: [any]
    auth: cert
    roles: [worker]
  services:
    kind: service
    networks: [any]
    roles: [service]
{body}principals:
  - {{name: svc, role: service, key_sha256: {key}}}
{principals}
routes:
  - {{path: /v1/models, audience: workloads}}
  - {{path: /v1/completions, audience: services}}
"""
ROUTE = "  - {path: /v1/chat/completions, audience: workloads}\n"
WORKER = "  - {name: worker-a, role: worker, san: 'spiffe://example.org/ns/app/sa/worker'}\n"


def _load(tmp_path: Path, principals: str = WORKER, ca: str = ", client_ca: ca.pem", body: str = "",
          routes: str = "") -> object:
    (tmp_path / "ca.pem").write_bytes(TestCa.new().pem)
    text = BASE.format(ca=ca, key=KEY, principals=principals.rstrip("\n"), body=body) + routes
    return loads(text, source="p.yaml", base_dir=tmp_path)


def test_loads_cert_principals_beside_keys(tmp_path: Path) -> None:
    policy = _load(tmp_path, WORKER + "  - {name: batch, role: worker, subject: 'CN=batch,O=Example'}\n")
    assert policy.listen.tls.client_ca == str((tmp_path / "ca.pem").absolute())  # type: ignore[attr-defined]
    assert policy.listen.tls.verify_depth == 2   # type: ignore[attr-defined]
    assert [(c.name, c.role, c.identity) for c in policy.certs] == [   # type: ignore[attr-defined]
        ("worker-a", "worker", "san:spiffe://example.org/ns/app/sa/worker"),
        ("batch", "worker", "subject:CN=batch,O=Example")]
    assert [p.name for p in policy.principals] == ["svc"]   # type: ignore[attr-defined]
    assert policy.audiences["workloads"].auth == "cert"   # type: ignore[attr-defined]


@pytest.mark.parametrize("principals, ca, message", [
    (WORKER, "", r"audiences.workloads: auth: cert needs listen.tls.client_ca"),
    ("  - {name: w, role: worker, san: 'worker.example.org'}\n", ", client_ca: ca.pem", "is not a URI"),
    ("  - {name: w, role: worker, san: 'spiffe://x/$y'}\n", ", client_ca: ca.pem", "is not a URI"),
    ("  - {name: w, role: worker, subject: 'CN=a, O=b'}\n", ", client_ca: ca.pem", "RFC 2253"),
    (WORKER + WORKER.replace("worker-a", "worker-b"), ", client_ca: ca.pem", "already names another principal"),
    (WORKER + WORKER, ", client_ca: ca.pem", "duplicate principal 'worker-a'"),
    ("  - {name: w, role: worker, san: 'spiffe://x/y', key_sha256: " + KEY + "}\n", ", client_ca: ca.pem",
     "exactly one of key_sha256"),
    ("  - {name: w, role: other, san: 'spiffe://x/y'}\n", ", client_ca: ca.pem",
     "role 'worker' has no certificate principal"),
    (WORKER, ", client_ca: missing.pem", "cannot read the client CA bundle"),
    (WORKER, ", client_ca: ca.pem, verify_depth: 20", "at most 8"),
])
def test_bad_values_one_line(tmp_path: Path, principals: str, ca: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message) as info:
        _load(tmp_path, principals, ca)
    assert "\n" not in str(info.value)


def test_a_leaf_certificate_is_not_a_ca_bundle(tmp_path: Path) -> None:
    ca = TestCa.new()
    (tmp_path / "leaf.pem").write_bytes(ca.issue(san="spiffe://x/y").cert_pem)
    text = BASE.format(ca=", client_ca: leaf.pem", key=KEY, principals=WORKER.rstrip("\n"), body="")
    with pytest.raises(PolicyError, match="is not a CA"):
        loads(text, source="p.yaml", base_dir=tmp_path)


def test_a_cert_principal_without_a_cert_audience(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_bytes(TestCa.new().pem)
    text = BASE.format(ca=", client_ca: ca.pem", key=KEY, principals=WORKER.rstrip("\n"), body="")
    text = text.replace("    auth: cert\n    roles: [worker]\n", "    roles: [service]\n")
    with pytest.raises(PolicyError, match="no audience has auth: cert"):
        loads(text, source="p.yaml", base_dir=tmp_path)


def test_plan_decides_cert_routes_once(tmp_path: Path) -> None:
    plan = build(load_ref("vllm-0.29.0-default"), _load(tmp_path))   # type: ignore[arg-type]
    models = plan.decision("GET", "/v1/models")
    assert models is not None and models.auth == "cert" and models.roles == ("worker",)
    assert plan.decision("POST", "/v1/completions").auth == "key"   # type: ignore[union-attr]
    doc = plan.body_dict()
    assert doc["cert_principals"] == [{"name": "worker-a", "role": "worker",
                                       "san": "spiffe://example.org/ns/app/sa/worker"}]
    assert doc["listen"]["client_ca"].endswith("ca.pem") and doc["listen"]["verify_depth"] == 2
    assert build(load_ref("vllm-0.29.0-default"), _load(tmp_path)).digest == plan.digest   # type: ignore[arg-type]


def test_per_principal_salt_on_a_cert_route_is_the_certificate_principals(tmp_path: Path) -> None:
    (tmp_path / "salt").write_text("s" * 40)
    (tmp_path / "salt").chmod(0o600)
    body = f"body: {{cache_salt: per-principal, cache_salt_secret_file: {tmp_path}/salt}}\n"
    plan = build(load_ref("vllm-0.29.0-default"),
                 _load(tmp_path, body=body, routes=ROUTE))   # type: ignore[arg-type]
    d = plan.decision("POST", "/v1/chat/completions")
    assert d is not None and d.auth == "cert" and d.salt == "principal"
    from scanner.generate.common import salts

    subjects = dict(salts(plan, "nginx"))
    assert "principal:worker-a" in subjects and "principal:svc" in subjects


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_a_limit_not_counted_per_certificate_is_refused(tmp_path: Path, proxy: str) -> None:
    from scanner.plan.certs import refusal

    text_policy = _load(tmp_path)
    plan = build(load_ref("vllm-0.29.0-default"), text_policy)   # type: ignore[arg-type]
    assert refusal(plan, proxy) == ""
    from dataclasses import replace

    from scanner.policy.model import Limits

    d = plan.decision("GET", "/v1/models")
    assert d is not None
    budget = replace(plan, decisions=tuple(replace(x, limits=Limits(tokens_per_minute=100)) if x is d else x
                                           for x in plan.decisions))
    assert "tokens_per_minute per certificate principal" in refusal(budget, proxy)
    slots = replace(plan, decisions=tuple(replace(x, limits=Limits(concurrency=2)) if x is d else x
                                          for x in plan.decisions))
    assert (refusal(slots, proxy) == "") == (proxy == "nginx")
