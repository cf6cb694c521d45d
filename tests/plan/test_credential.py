"""The reference of the credential rules (scanner/plan/credential.py) without a proxy: the order
of the token rules (the first broken names the refusal), the principal an admitted token or
certificate names, the SPIFFE rule and verify_depth. The live proxies are compared with it form
by form in tests/differential/test_identity_corpus.py."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from scanner.plan import credential
from scanner.plan import jwt as plan_jwt
from scanner.policy.jwt import JwtAuth, read_jwks
from scanner.policy.model import CertPrincipal
from scanner.probe import tokens_jwt

ALGS = ("RS256", "PS256", "ES256")


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> tuple[JwtAuth, tokens_jwt.Issuer]:
    issuer = tokens_jwt.Issuer.new()
    path = issuer.write_jwks(tmp_path_factory.mktemp("jwks") / "jwks.json")
    t = JwtAuth(issuers=("https://issuer.example",), audiences=("vllm",), jwks_file=str(path),
                keys=read_jwks(path, ALGS), required_claims={"tenant": ("acme",)}, role="user")
    return t, issuer


def _judge(t: JwtAuth, *authorization: str) -> credential.Verdict:
    return credential.judge_token(t, ALGS, authorization, int(time.time()), ("user",))


def test_a_valid_token_names_its_namespaced_principal(issued: tuple[JwtAuth, tokens_jwt.Issuer]) -> None:
    t, issuer = issued
    token = issuer.rsa.sign(tokens_jwt.valid_claims(t, "user", "alice"))
    for scheme in ("Bearer", "bearer", "BEARER"):
        v = _judge(t, f"{scheme}  {token}")
        assert v.admitted and v.principal == plan_jwt.principal(t, t.issuers[0], "alice"), (scheme, v)


def test_token_forms_refused_before_the_signature(issued: tuple[JwtAuth, tokens_jwt.Issuer]) -> None:
    t, issuer = issued
    good = tokens_jwt.valid_claims(t, "user", "alice")
    token = issuer.rsa.sign(good)
    head = json.dumps({"alg": "RS256", "kid": issuer.rsa.kid})
    body = json.dumps(good)
    sub_twice = issuer.rsa.sign_text(head, body[:-1] + ', "sub": "bob"}')
    alg_twice = issuer.rsa.sign_text('{"alg": "none", ' + head[1:], body)
    crit = issuer.rsa.sign_text(json.dumps({"alg": "RS256", "kid": issuer.rsa.kid, "crit": ["x"]}), body)
    cases = {
        "trailing dot": ((f"Bearer {token}.",), (401, "jwt-invalid:format")),
        "padding": ((f"Bearer {token}==",), (401, "jwt-invalid:format")),
        "two headers": ((f"Bearer {token}", f"Bearer {token}"), (400, "bad-request")),
        "a comma": ((f"Bearer {token},",), (400, "bad-request")),
        "over 32 KiB": (("Bearer " + "a" * 40000,), (431, "headers-too-large")),
        "over max_token_bytes": (("Bearer " + "a" * 9000,), (401, "jwt-invalid:size")),
        "sub twice": ((f"Bearer {sub_twice}",), (401, "jwt-invalid:format")),
        "alg twice": ((f"Bearer {alg_twice}",), (401, "jwt-invalid:format")),
        "crit": ((f"Bearer {crit}",), (401, "jwt-invalid:crit")),
        "exp 1e300": ((f"Bearer {issuer.rsa.sign({**good, 'exp': 1e300})}",), (401, "jwt-invalid:exp")),
        "nbf -1": ((f"Bearer {issuer.rsa.sign({**good, 'nbf': -1})}",), (401, "jwt-invalid:nbf")),
        "iat 1.5": ((f"Bearer {issuer.rsa.sign({**good, 'iat': 1.5})}",), (401, "jwt-invalid:iat")),
        "no exp": ((f"Bearer {issuer.rsa.sign({k: v for k, v in good.items() if k != 'exp'})}",),
                   (401, "jwt-invalid:exp")),
        # a form rule answers before the signature: a tampered token with exp 1e300 is an exp refusal
        "tampered, exp 1e300": ((f"Bearer {tokens_jwt.tamper(token, {**good, 'exp': 1e300})}",),
                                (401, "jwt-invalid:exp")),
        "tampered": ((f"Bearer {tokens_jwt.tamper(token, {**good, 'sub': 'bob'})}",), (401, "jwt-invalid:signature")),
        "expired": ((f"Bearer {issuer.rsa.sign({**good, 'exp': int(time.time()) - 3600})}",), (401, "jwt-expired")),
        "Basic": ((f"Basic {token}",), (401, "jwt-missing")),
    }
    wrong = {name: (v.status, v.reason) for name, (auth, want) in cases.items()
             if ((v := _judge(t, *auth)).status, v.reason) != want}
    assert not wrong, wrong


def test_no_kid_is_refused_with_two_keys_and_verified_with_one(issued: tuple[JwtAuth, tokens_jwt.Issuer]) -> None:
    t, issuer = issued
    good = tokens_jwt.valid_claims(t, "user", "alice")
    token = issuer.rsa.sign_text(json.dumps({"alg": "RS256"}), json.dumps(good))
    assert (_judge(t, f"Bearer {token}").reason) == "jwt-invalid:kid"
    one = replace(t, keys=tuple(k for k in t.keys if k.kid == issuer.rsa.kid))
    assert _judge(one, f"Bearer {token}").admitted


def test_look_alike_issuers_and_audiences_are_refused(issued: tuple[JwtAuth, tokens_jwt.Issuer]) -> None:
    """Issuers and audiences compare exactly: a prefix, a suffix-extended, case-changed,
    trailing-slash or look-alike neighbour of an allowed one is another (signed, valid otherwise)."""
    t, issuer = replace(issued[0], issuers=("https://idp.example.com/realms/llm",)), issued[1]
    good = tokens_jwt.valid_claims(t, "user", "alice")
    assert dict(tokens_jwt.look_alikes(t.issuers[0])) == {
        "suffix-extended": "https://idp.example.com/realms/llm2", "prefix": "https://idp.example.com/realms/ll",
        "case-changed": "HTTPS://IDP.EXAMPLE.COM/realms/llm", "trailing slash": "https://idp.example.com/realms/llm/",
        "look-alike": "https://idp.example.com.evil.net/realms/llm"}
    assert dict(tokens_jwt.look_alikes("vllm")) == {"suffix-extended": "vllm2", "prefix": "vll",
                                                    "case-changed": "VLLM", "trailing slash": "vllm/",
                                                    "look-alike": "v\u04cflm"}
    assert _judge(t, f"Bearer {issuer.rsa.sign(good)}").admitted
    for claim, reason, allowed in (("iss", "jwt-issuer", t.issuers[0]), ("aud", "jwt-audience", t.audiences[0])):
        for kind, alike in tokens_jwt.look_alikes(allowed):
            v = _judge(t, f"Bearer {issuer.rsa.sign({**good, claim: alike})}")
            assert (v.status, v.reason) == (401, reason), (kind, alike, v)
    for kind, alike in tokens_jwt.look_alikes(t.audiences[0]):   # in a list of audiences too
        v = _judge(t, f"Bearer {issuer.rsa.sign({**good, 'aud': [alike, 'other']})}")
        assert (v.status, v.reason) == (401, "jwt-audience"), (kind, alike, v)
    # the probe's cases: every look-alike sent, each expected refused as the reference says
    cases = {c.name: c.expect for c in tokens_jwt.cases(t, "user", issuer.rsa, "alice")
             if c.name.startswith(("iss ", "aud "))}
    assert len(cases) == 10 and set(cases.values()) == {"jwt-issuer", "jwt-audience"}, cases
    # a look-alike that is itself allowed (a second issuer) is not sent
    two = replace(t, issuers=(*t.issuers, "https://idp.example.com/realms/llm2"))
    names = [c.name for c in tokens_jwt.cases(two, "user", issuer.rsa, "alice")]
    assert "iss suffix-extended 'https://idp.example.com/realms/llm2'" not in names
    assert "iss prefix 'https://idp.example.com/realms/llm'" not in names   # the second's prefix: the first
    assert "iss suffix-extended 'https://idp.example.com/realms/llm22'" in names


def test_a_certificate_with_any_uri_san_is_named_by_it_alone() -> None:
    worker = CertPrincipal("worker-a", "worker", san="spiffe://example.org/ns/app/sa/worker")
    batch = CertPrincipal("batch", "worker", subject="CN=batch,O=Example")
    plan = (worker, batch)

    def who(sans: list[str], subject: str) -> str:
        v = credential.judge_certificate(plan, True, True, sans, subject, ("worker",))
        return v.principal if v.admitted else v.reason

    assert who([worker.san], "CN=x") == "worker-a"
    assert who([worker.san], batch.subject) == "worker-a"
    assert who(["spiffe://example.org/ns/app/sa/revoked"], batch.subject) == "cert-unknown"
    assert who([worker.san, "spiffe://x/y"], batch.subject) == "cert-unknown"
    assert who([], batch.subject) == "batch"
    assert who([], "CN=stranger") == "cert-unknown"
    assert credential.judge_certificate(plan, False, False, [], "").reason == "cert-missing"


def test_verify_depth_counts_intermediates() -> None:
    assert [credential.chain_within(n, 2) for n in range(4)] == [True, True, True, False]


def test_canonical_base64url_only() -> None:
    assert credential.b64url_part("QQ") == b"A"
    assert credential.b64url_part("QR") is None          # bits past the last byte
    assert credential.b64url_part("QQ==") is None        # padding
    assert credential.b64url_part("Q") is None           # 1 mod 4
    assert credential.b64url_part("+w") is None          # another alphabet


def test_time_values() -> None:
    ok = [0, 1700000000, 1700000000.0, 2**32 - 1]
    bad = [-1, 1.5, 1e300, 2**32, "1700000000", None, True, float("inf")]
    assert all(credential.time_value(v) for v in ok)
    assert not any(credential.time_value(v) for v in bad)
