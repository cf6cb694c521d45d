"""Generated configs of a plan with ``auth: jwt``: deterministic, accepted by the proxy's own
validator (a remote JWKS too), refused (exit 2) where the proxy cannot enforce the token rules."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scanner.errors import GenerateError
from scanner.inventory.catalog import load_ref
from scanner.plan.build import build
from scanner.policy.load import loads
from scanner.probe.tokens_jwt import Issuer
from scanner.runtime.proxy import EnvoyProxy
from tests.generate.test_jwt_live import POLICY

pytestmark = pytest.mark.envoy


def _plan(tmp_path: Path, remote: str = "", concurrency: bool = False):  # type: ignore[no-untyped-def]
    Issuer.new().write_jwks(tmp_path / "jwks.json")
    policy = loads(POLICY, source=str(tmp_path / "p.yaml"), base_dir=tmp_path)
    people = policy.audiences["people"]
    assert people.jwt is not None
    jwt = replace(people.jwt, remote_jwks=remote)
    limits = replace(people.limits, concurrency=4) if concurrency else people.limits
    policy = replace(policy, audiences={**policy.audiences, "people": replace(people, jwt=jwt, limits=limits)})
    return build(load_ref("vllm-0.29.0-default"), policy)


def test_envoy_config_deterministic_and_valid(tmp_path: Path) -> None:
    plan = _plan(tmp_path, remote="https://idp.example.com:8443/keys")
    envoy = EnvoyProxy()
    a = (envoy.write(plan, tmp_path / "a") / "envoy.yaml").read_text()
    b = (envoy.write(plan, tmp_path / "b") / "envoy.yaml").read_text()
    assert a.replace(str(tmp_path / "a"), "") == b.replace(str(tmp_path / "b"), "")
    assert "remote_jwks" in a and "perimeter.jwt.people.jwks" in a and "local_jwks" not in a
    assert envoy.validate(plan, tmp_path / "a") == ""


def test_envoy_jwt_authn_verifies_the_signature_only(tmp_path: Path) -> None:
    """Lua judges the token's text and its claims (scanner/plan/credential.py): jwt_authn holds no
    audiences, never requires or refuses a time (the largest skew it takes), and extracts the token
    after the scheme's space (any letter case); 32 KiB of headers as NGINX's header line; Lua
    knows the JWKS keys (kid -> algorithms) and the audiences."""
    import yaml

    envoy = EnvoyProxy()
    out = envoy.write(_plan(tmp_path), tmp_path / "out")
    doc = yaml.safe_load((out / "envoy.yaml").read_text())
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    jwt = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.jwt_authn")
    (provider,) = jwt["typed_config"]["providers"].values()
    assert "audiences" not in provider
    assert provider["require_expiration"] is False and provider["clock_skew_seconds"] == 2**32 - 1
    assert provider["from_headers"] == [{"name": "authorization", "value_prefix": " "}]
    assert hcm["max_request_headers_kb"] == 32
    lua = next(f for f in hcm["http_filters"] if f["typed_config"].get("default_source_code"))
    code = lua["typed_config"]["default_source_code"]["inline_string"]
    assert '["audiences"] = {["vllm"] = true}' in code
    assert '["perimeter-test-rsa"] = {["RS256"] = true, ["PS256"] = true}' in code


def test_envoy_refuses_concurrency_per_token(tmp_path: Path) -> None:
    with pytest.raises(GenerateError, match=r"limits\.concurrency per principal"):
        EnvoyProxy().write(_plan(tmp_path, concurrency=True), tmp_path / "out")


def test_nginx_config_deterministic_and_refusals(tmp_path: Path) -> None:
    from scanner.generate import nginx as nginx_gen
    from scanner.generate.interface import GenerateOptions

    plan = _plan(tmp_path)
    gen = nginx_gen.NginxGenerator()
    a = gen.render(plan, GenerateOptions(output_dir=str(tmp_path / "a")))
    b = gen.render(plan, GenerateOptions(output_dir=str(tmp_path / "a")))
    assert [f.content for f in a.files] == [f.content for f in b.files]
    http = next(f.content for f in a.files if f.name.endswith("http.conf"))
    assert "js_content perimeter.jwt;" in http and "limit_req_zone $perimeter_jwt_who" in http
    assert "location @perimeter_jwt_" in http
    # Ed25519 keys under an allowlist with EdDSA: njs cannot verify them, exit 2 naming why
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from jwt.algorithms import OKPAlgorithm

    okp = {**json.loads(OKPAlgorithm.to_jwk(ed25519.Ed25519PrivateKey.generate().public_key())), "kid": "ed"}
    jwks = json.loads((tmp_path / "jwks.json").read_text())
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [*jwks["keys"], okp]}))
    text = POLICY.replace("      role_claim: groups", "      algorithms: [RS256, EdDSA]\n      role_claim: groups")
    policy = loads(text, source=str(tmp_path / "p.yaml"), base_dir=tmp_path)
    plan = build(load_ref("vllm-0.29.0-default"), policy)
    with pytest.raises(GenerateError, match="no Ed25519"):
        gen.render(plan, GenerateOptions(output_dir=str(tmp_path / "c")))
    assert EnvoyProxy().validate(plan, EnvoyProxy().write(plan, tmp_path / "e")) == ""


def test_kubernetes_bundle_mounts_the_jwks_for_envoy(tmp_path: Path) -> None:
    """Envoy reads the JWKS by its path: the bundle's Secret holds it (read at generate time) and
    the pod mounts it at the policy's jwks_file path; NGINX has the keys in its config."""
    from scanner.generate import kubernetes as k8s
    from tests.generate.test_kubernetes import UPSTREAM, assert_valid, docs, pod_spec, render, secret_data

    Issuer.new().write_jwks(tmp_path / "jwks.json")
    policy = loads(POLICY + UPSTREAM, source=str(tmp_path / "p.yaml"), base_dir=tmp_path)
    _config, bundle = render("envoy", policy)
    assert_valid(bundle)
    d = docs(bundle)
    jwks = (tmp_path / "jwks.json").read_text()
    assert secret_data(d["secret.yaml"])[k8s.JWKS_ITEM + "people"] == jwks
    spec = pod_spec(d["deployment.yaml"])
    mounts = {m["mountPath"]: m for c in spec["containers"] for m in c["volumeMounts"]}
    assert mounts[str(tmp_path / "jwks.json")]["subPath"] == k8s.JWKS_ITEM + "people"
    _config, bundle = render("nginx", policy)
    assert k8s.JWKS_ITEM + "people" not in secret_data(docs(bundle)["secret.yaml"])


def test_nginx_jwt_config_has_no_gixy_findings(tmp_path: Path) -> None:
    """gixy on a config with auth: jwt routes: the token's principal reaches a header and the zone
    keys only through a map that admits claim characters (no header splitting)."""
    from tests.generate.test_gixy import findings
    from tests.probe.realproxy import proxy_named

    proxy = proxy_named("nginx")
    conf = proxy.write(_plan(tmp_path), tmp_path / "out")
    main = next(conf.rglob("nginx.conf"))
    assert findings(main) == []
