"""``auth: jwt`` in a policy: the jwt: section, its JWKS, and what the plan decides per proxy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from jwt.algorithms import OKPAlgorithm

from scanner.errors import ConfigError, PlanError, PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan.build import build
from scanner.plan.jwt import refusal, verified
from scanner.policy.jwt import read_jwks
from scanner.policy.load import loads
from scanner.probe.tokens_jwt import Issuer

BASE = """
schema_version: 1
name: t
networks: {{any: [0.0.0.0/0]}}
audiences:
  people:
    kind: end-user
    networks: [any]
    auth: jwt
    roles: [user]
    limits: {extra_limits}
    jwt:
      issuers: [https://issuer.example]
      audiences: [vllm]
      jwks_file: jwks.json
{extra}
  services:
    kind: service
    networks: [any]
routes:
  - {{path: /v1/models, audience: people}}
  - {{path: /v1/completions, audience: services}}
"""
ROLES = "      role_claim: groups\n      roles: {llm-users: user}\n"


def _load(tmp_path: Path, extra: str = ROLES, limits: str = "{}", jwks: object = None) -> object:
    if jwks is None:
        Issuer.new().write_jwks(tmp_path / "jwks.json")
    else:
        (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    text = BASE.format(extra=extra.rstrip("\n"), extra_limits=limits)
    return loads(text, source="p.yaml", base_dir=tmp_path)


def test_loads_keys_and_rules(tmp_path: Path) -> None:
    policy = _load(tmp_path, ROLES + "      required_claims: {tenant: [acme, beta], scope: llm}\n")
    t = policy.audiences["people"].jwt   # type: ignore[attr-defined]
    assert t.issuers == ("https://issuer.example",) and t.audiences == ("vllm",)
    assert t.jwks_file == str((tmp_path / "jwks.json").absolute())
    assert {(k.kid, k.kty) for k in t.keys} == {("perimeter-test-rsa", "RSA"), ("perimeter-test-ec", "EC:P-256")}
    assert t.algorithms == ("RS256", "PS256", "ES256") and t.clock_skew_s == 60 and t.principal_claim == "sub"
    assert t.required_claims == {"scope": ("llm",), "tenant": ("acme", "beta")}
    assert t.role_of(["x", "llm-users"]) == "user" and t.role_of("nope") == ""
    assert policy.audiences["services"].auth == "key"   # type: ignore[attr-defined]


@pytest.mark.parametrize("alg", ["none", "HS256", "HS512", "hs384"])
def test_symmetric_and_none_refused(tmp_path: Path, alg: str) -> None:
    with pytest.raises(PolicyError, match=r"p.yaml:\d+: .*jwt.algorithms: .* is never allowed"):
        _load(tmp_path, ROLES + f"      algorithms: [RS256, {alg}]\n")


@pytest.mark.parametrize("extra, message", [
    ("", "role_claim \\+ roles .* or a fixed role"),
    ("      role_claim: groups\n", "role_claim and roles go together"),
    (ROLES + "      role: user\n", "either a fixed role or role_claim"),
    ("      role: admin\n", "role 'user': no token of this audience can have it"),
    (ROLES + "      max_token_bytes: 100000\n", "at most 16384"),
    (ROLES + "      remote_jwks: http://idp.example/jwks\n", "not an https URL"),
    (ROLES + "      algorithms: [RS512]\n", "not one of"),
    (ROLES + "      colck_skew_s: 5\n", "unknown key 'colck_skew_s'"),
])
def test_bad_sections(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        _load(tmp_path, extra)


def test_auth_jwt_needs_section(tmp_path: Path) -> None:
    text = BASE.format(extra=ROLES.rstrip("\n"), extra_limits="{}").replace("    jwt:\n", "    xjwt:\n")
    with pytest.raises(PolicyError):
        loads(text, source="p.yaml", base_dir=tmp_path)


def test_jwks_problems(tmp_path: Path) -> None:
    issuer = Issuer.new()
    keys = [dict(k) for k in issuer.jwks["keys"]]   # type: ignore[union-attr]
    with pytest.raises(PolicyError, match="private or symmetric"):
        _load(tmp_path, jwks={"keys": [{**keys[0], "d": "AAAA"}]})
    with pytest.raises(PolicyError, match="needs a kid"):
        _load(tmp_path, jwks={"keys": [{k: v for k, v in keys[0].items() if k != "kid"}]})
    with pytest.raises(PolicyError, match="listed twice"):
        _load(tmp_path, jwks={"keys": [keys[0], {**keys[1], "kid": keys[0]["kid"]}]})
    with pytest.raises(PolicyError, match="no key verifies an allowed algorithm"):
        _load(tmp_path, ROLES + "      algorithms: [ES256]\n", jwks={"keys": [keys[0]]})
    with pytest.raises(PolicyError, match="not a JSON JWKS"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "jwks.json").write_text("{")
        loads(BASE.format(extra=ROLES.rstrip("\n"), extra_limits="{}"), "p.yaml", tmp_path / "bad")


def test_rsa_key_alg_narrows(tmp_path: Path) -> None:
    keys = [dict(k) for k in Issuer.new().jwks["keys"]]   # type: ignore[union-attr]
    (tmp_path / "j.json").write_text(json.dumps({"keys": [{**keys[0], "alg": "PS256"}]}))
    (k,) = read_jwks(tmp_path / "j.json", ("RS256", "PS256"))
    assert k.algorithms == ("PS256",)
    with pytest.raises(ConfigError, match="does not fit"):
        (tmp_path / "j.json").write_text(json.dumps({"keys": [{**keys[0], "alg": "ES256"}]}))
        read_jwks(tmp_path / "j.json", ("RS256", "ES256"))


def _plan(tmp_path: Path, extra: str = ROLES, limits: str = "{}", jwks: object = None) -> object:
    return build(load_ref("vllm-0.29.0-default"), _load(tmp_path, extra, limits, jwks))   # type: ignore[arg-type]


def test_plan_carries_the_rules(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    d = plan.decision("GET", "/v1/models")   # type: ignore[attr-defined]
    assert d.auth == "jwt" and d.jwt is not None and d.roles == ("user",)
    assert d.to_dict()["jwt"]["keys"][0]["kid"] == "perimeter-test-ec"
    assert plan.decision("POST", "/v1/completions").jwt is None   # type: ignore[attr-defined]
    assert verified(d, "nginx") == ("RS256", "PS256", "ES256")
    assert refusal(plan, "nginx") == "" and refusal(plan, "envoy") == ""   # type: ignore[arg-type]


def test_eddsa_refused_for_nginx_only(tmp_path: Path) -> None:
    keys = [dict(k) for k in Issuer.new().jwks["keys"]]   # type: ignore[union-attr]
    okp = json.loads(OKPAlgorithm.to_jwk(ed25519.Ed25519PrivateKey.generate().public_key()))
    plan = _plan(tmp_path, ROLES + "      algorithms: [RS256, EdDSA]\n",
                 jwks={"keys": [keys[0], {**okp, "kid": "ed"}]})
    assert "EdDSA" in refusal(plan, "nginx") and "no Ed25519" in refusal(plan, "nginx")   # type: ignore[arg-type]
    assert refusal(plan, "envoy") == ""   # type: ignore[arg-type]


def test_envoy_refuses_concurrency_per_token(tmp_path: Path) -> None:
    plan = _plan(tmp_path, limits="{concurrency: 4}")
    assert "limits.concurrency" in refusal(plan, "envoy")   # type: ignore[arg-type]
    assert refusal(plan, "nginx") == ""   # type: ignore[arg-type]


def test_per_principal_salt_refused(tmp_path: Path) -> None:
    secret = tmp_path / "salt"
    secret.write_text("x" * 64)
    Issuer.new().write_jwks(tmp_path / "jwks.json")
    text = BASE.format(extra=ROLES.rstrip("\n"), extra_limits="{}") + \
        "  - {path: /v1/chat/completions, audience: people}\n" + \
        f"body: {{cache_salt: per-principal, cache_salt_secret_file: {secret}}}\n"
    policy = loads(text, "p.yaml", tmp_path)
    with pytest.raises(PlanError, match="per-principal with auth: jwt"):
        build(load_ref("vllm-0.29.0-default"), policy)


def test_cli_exits_2_in_one_line(tmp_path: Path) -> None:
    Issuer.new().write_jwks(tmp_path / "jwks.json")
    (tmp_path / "p.yaml").write_text(BASE.format(extra=ROLES + "      algorithms: [none]", extra_limits="{}"))
    r = subprocess.run([sys.executable, "-m", "scanner.cli.main", "plan", "--inventory", "vllm-0.29.0-default",
                        "--policy", str(tmp_path / "p.yaml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "never allowed" in r.stderr


def test_plan_and_policy_match_their_schemas(tmp_path: Path) -> None:
    import yaml

    from scanner import documents

    plan = _plan(tmp_path, ROLES + "      required_claims: {tenant: [acme], scope: llm}\n")
    documents.validate("plan", json.loads(plan.to_json()), "plan")   # type: ignore[attr-defined]
    text = BASE.format(extra=ROLES.rstrip("\n"), extra_limits="{}")
    documents.validate("policy", yaml.safe_load(text), "p.yaml")
