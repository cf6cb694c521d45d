"""Bearer tokens for the identity check: a test issuer (RSA and EC P-256 keys, its JWKS) or an
issuer's own private key, and the token cases sent on every route of an ``auth: jwt`` audience.

Signing uses PyJWT; only the forgeries no library will make (``alg: none``, HS256 keyed with
the RSA public key) are put together here, as an attacker would.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jwt as pyjwt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from scanner.errors import UsageError
from scanner.plan import credential
from scanner.policy.jwt import JwtAuth, read_jwks

RSA_KID = "perimeter-test-rsa"
EC_KID = "perimeter-test-ec"


@dataclass(frozen=True)
class Signer:
    """A private key the probe signs with, its kid and algorithm; ``public_pem`` is what an
    attacker reads from the JWKS (the HS256 forgery's secret)."""

    kid: str
    alg: str
    key: object = field(repr=False)
    public_pem: bytes = field(repr=False, default=b"")

    def sign(self, claims: Mapping[str, object], kid: str | None = None, alg: str | None = None) -> str:
        return pyjwt.encode(dict(claims), self.key, algorithm=alg or self.alg,  # type: ignore[arg-type]
                            headers={"kid": self.kid if kid is None else kid})

    def sign_text(self, header: str, claims: str) -> str:
        """A token over exactly these JSON texts (which may name a member twice: no library
        writes that), signed under the signer's algorithm."""
        signing = f"{_b64(header.encode())}.{_b64(claims.encode())}"
        key = self.key
        if isinstance(key, rsa.RSAPrivateKey):
            pad = (padding.PSS(padding.MGF1(hashes.SHA256()), 32) if self.alg == "PS256"
                   else padding.PKCS1v15())
            signature = key.sign(signing.encode(), pad, hashes.SHA256())
        elif isinstance(key, ec.EllipticCurvePrivateKey):
            r, s = utils.decode_dss_signature(key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
            signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        else:
            raise UsageError(f"cannot sign a token with a {type(key).__name__}")
        return f"{signing}.{_b64(signature)}"


@dataclass(frozen=True)
class Issuer:
    """A throwaway issuer: an RSA and an EC key, and the JWKS with both public keys."""

    rsa: Signer
    ec: Signer
    jwks: Mapping[str, object]

    @classmethod
    def new(cls) -> Issuer:
        r = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        e = ec.generate_private_key(ec.SECP256R1())
        keys = []
        for kid, jwk in ((RSA_KID, RSAAlgorithm.to_jwk(r.public_key())),
                         (EC_KID, ECAlgorithm.to_jwk(e.public_key()))):
            keys.append({**json.loads(jwk), "kid": kid, "use": "sig"})
        pem = r.public_key().public_bytes(serialization.Encoding.PEM,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
        return cls(rsa=Signer(RSA_KID, "RS256", r, pem), ec=Signer(EC_KID, "ES256", e), jwks={"keys": keys})

    def private_pem(self) -> bytes:
        """The RSA signing key (PEM, unencrypted): verify writes it 0600 for the identity check."""
        key = self.rsa.key
        assert isinstance(key, rsa.RSAPrivateKey)
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def write_jwks(self, path: Path) -> Path:
        path.write_text(json.dumps(self.jwks, sort_keys=True), encoding="utf-8")
        return path

    def for_audience(self, t: JwtAuth, path: Path) -> JwtAuth:
        """``t`` verified against this issuer's JWKS (written to ``path``) instead of its own."""
        from dataclasses import replace

        self.write_jwks(path)
        return replace(t, jwks_file=str(path.resolve()), keys=read_jwks(path, t.algorithms), remote_jwks="")


def signer_from_file(path: str, t: JwtAuth) -> Signer:
    """The issuer's private key (PEM) given with ``--jwt-signing-key``: its kid is the JWKS key
    whose public key it matches. Never echoed."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        raise UsageError(f"--jwt-signing-key {path}: not a readable unencrypted PEM private key") from None
    public = key.public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    spki = base64.b64encode(der).decode()
    match = next((k for k in t.keys if k.spki == spki), None)
    if match is None:
        raise UsageError(f"--jwt-signing-key {path}: its public key is not in the policy's JWKS")
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return Signer(match.kid, match.algorithms[0], key, pem if isinstance(key, rsa.RSAPrivateKey) else b"")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge_none(claims: Mapping[str, object], kid: str) -> str:
    """An unsigned token (``alg: none``)."""
    head = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
    return f"{head}.{_b64(json.dumps(dict(claims)).encode())}."


def forge_hs256(claims: Mapping[str, object], kid: str, secret: bytes) -> str:
    """HS256 keyed with ``secret`` (the RSA public key a verifier might take as an HMAC secret)."""
    signing = (_b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode()) + "."
               + _b64(json.dumps(dict(claims)).encode()))
    mac = hmac.new(secret, signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{_b64(mac)}"


def tamper(token: str, claims: Mapping[str, object]) -> str:
    """``token`` with its payload replaced by ``claims`` and its signature kept."""
    head, _, sig = token.split(".")
    return f"{head}.{_b64(json.dumps(dict(claims)).encode())}.{sig}"


def valid_claims(t: JwtAuth, role: str, subject: str, now: int | None = None) -> dict[str, object]:
    """Claims a token of ``t`` needs to be admitted with ``role``: issuer, audience, a window
    around ``now``, each required claim's first value, and the role claim's value for ``role``."""
    now = int(time.time()) if now is None else now
    claims: dict[str, object] = {"iss": t.issuers[0], "aud": t.audiences[0], t.principal_claim: subject,
                                 "iat": now, "nbf": now - 5, "exp": now + 600}
    for name, values in t.required_claims.items():
        claims[name] = values[0]
    if t.role_claim:
        value = next((v for v, r in sorted(t.roles.items()) if r == role), None)
        if value is not None:
            claims[t.role_claim] = [value]
    return claims


def unmapped(t: JwtAuth) -> str:
    """A role claim value no role maps ("" when the audience's role is fixed)."""
    return "perimeter-unmapped-group" if t.role_claim else ""


@dataclass(frozen=True)
class TokenCase:
    name: str
    token: str = field(repr=False)
    expect: str        # the reason (reasons.py: KIND or KIND:DETAIL) it must be refused with; "" admitted
    scheme: str = "Bearer"     # the Authorization scheme it is sent under (any letter case is Bearer)


def cases(t: JwtAuth, role: str, signer: Signer | None, subject: str) -> tuple[TokenCase, ...]:
    """Every token case for ``t``: refusals (those that need a signature only with ``signer``) and,
    with a signer, the valid token admitted with ``role``."""
    now = int(time.time())
    good = valid_claims(t, role, subject, now)
    kid = signer.kid if signer else (t.keys[0].kid if t.keys else "k")
    pem = signer.public_pem if signer else b""
    out = [TokenCase("no token", "", "jwt-missing"),
           TokenCase("alg none", forge_none(good, kid), "jwt-invalid"),
           TokenCase("oversized", "x" * (t.max_token_bytes + 1), "jwt-invalid"),
           TokenCase("not a JWT", "not.a.jwt", "jwt-invalid")]
    out += _form_cases(t, signer, good, kid)
    if pem:
        out.append(TokenCase("HS256 keyed with the RSA public key", forge_hs256(good, kid, pem),
                             "jwt-invalid"))
    if signer is None:
        return tuple(out)
    sign = signer.sign
    pad = "x" * max(0, t.max_token_bytes - len(sign(good)) + 16)
    out += [
        TokenCase("valid", sign(good), ""),
        TokenCase("expired", sign({**good, "iat": now - 7200, "nbf": now - 7200,
                                   "exp": now - t.clock_skew_s - 600}), "jwt-expired"),
        TokenCase("not yet valid", sign({**good, "nbf": now + t.clock_skew_s + 600,
                                         "exp": now + t.clock_skew_s + 1200}), "jwt-not-yet-valid"),
        TokenCase("other issuer", sign({**good, "iss": "https://other-issuer.invalid"}), "jwt-issuer"),
        TokenCase("other audience", sign({**good, "aud": "another-audience"}), "jwt-audience"),
        TokenCase("kid not in the JWKS", sign(good, kid="perimeter-unknown-kid"), "jwt-invalid"),
        TokenCase("tampered payload",
                  tamper(sign(good), {**good, t.principal_claim: "someone-else"}), "jwt-invalid"),
        TokenCase("oversized, signed", sign({**good, "pad": pad}), "jwt-invalid"),
    ]
    out += _look_alike_cases(t, sign, good, now)
    for name in t.required_claims:
        out.append(TokenCase(f"missing required claim {name}",
                             sign({k: v for k, v in good.items() if k != name}), "jwt-claim"))
    if t.role_claim:
        out.append(TokenCase("role not mapped", sign({**good, t.role_claim: [unmapped(t)]}), "jwt-role"))
    out.append(TokenCase("lower-case scheme", sign(good), "", scheme="bearer"))
    return tuple(out)


# Latin letters and the Cyrillic ones drawn alike (a look-alike of a name that is not a URL)
_HOMOGLYPHS = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "c": "\u0441", "p": "\u0440", "x": "\u0445",
               "y": "\u0443", "i": "\u0456", "l": "\u04cf"}


def look_alikes(value: str) -> tuple[tuple[str, str], ...]:
    """(kind, value) of the neighbours of an allowed issuer or audience an exact comparison must
    refuse: suffix-extended (``llm2``), a prefix (``ll``), case-changed (a URL's scheme and host,
    which RFC 3986 compares case-insensitively but the perimeter never does; a name's letters),
    a trailing slash added (or removed), and a look-alike (a URL's host inside another domain,
    ``idp.example.com.evil.net``; a name with a Cyrillic letter drawn as a Latin one). Each
    differs from ``value``; none twice."""
    scheme, sep, rest = value.partition("://")
    if sep:
        host, slash, path = rest.partition("/")
        name, colon, port = host.partition(":")
        case = f"{scheme.upper()}://{host.upper()}{slash}{path}"
        alike = f"{scheme}://{name}.evil.net{colon}{port}{slash}{path}" if name else ""
    else:
        case = value.upper() if value.upper() != value else value.lower()
        at = next((i for i, ch in enumerate(value) if ch in _HOMOGLYPHS), -1)
        alike = value[:at] + _HOMOGLYPHS[value[at]] + value[at + 1:] if at >= 0 else ""
    slashed = value[:-1] if value.endswith("/") else value + "/"
    out: dict[str, str] = {}
    for kind, v in (("suffix-extended", value + "2"), ("prefix", value[:-1]), ("case-changed", case),
                    ("trailing slash", slashed), ("look-alike", alike)):
        if v and v != value and v not in out.values():
            out[kind] = v
    return tuple(out.items())


def _look_alike_cases(t: JwtAuth, sign: Callable[[Mapping[str, object]], str], good: Mapping[str, object],
                      now: int) -> list[TokenCase]:
    """Signed tokens whose ``iss`` is a look-alike of each allowed issuer, and whose ``aud`` one of
    each allowed audience (:func:`look_alikes`), the rest valid: each refused as the reference
    (scanner/plan/credential.py) judges it (``jwt-issuer`` / ``jwt-audience``); a look-alike that
    is itself allowed (another issuer or audience of the policy) is not one, and not sent."""
    out: list[TokenCase] = []
    for claim, allowed in (("iss", t.issuers), ("aud", t.audiences)):
        for value in allowed:
            for kind, alike in look_alikes(value):
                claims = {**good, claim: alike}
                v = credential.judge_claims(t, claims, now)
                if not v.admitted:
                    out.append(TokenCase(f"{claim} {kind} {alike!a}", sign(claims), v.reason))
    return out


def _form_cases(t: JwtAuth, signer: Signer | None, good: Mapping[str, object], kid: str) -> list[TokenCase]:
    """The token's form, judged before its signature (scanner/plan/credential.py), so proven with
    or without the issuer's key (signed when there is one, as an attacker holding a valid token
    would send them): trailing characters, a member named twice in the claims or the header
    (JSON parsers keep the last), a crit extension, a time claim out of range."""
    alg = signer.alg if signer else next((a for k in t.keys for a in k.algorithms), "RS256")
    head = {"alg": alg, "typ": "JWT", "kid": kid}

    def token(header: str, claims: str) -> str:
        if signer is not None:
            return signer.sign_text(header, claims)
        return f"{_b64(header.encode())}.{_b64(claims.encode())}.{_b64(b'no signature')}"

    h, c = json.dumps(head), json.dumps(dict(good))
    valid = token(h, c)
    other = json.dumps("perimeter-someone-else")
    return [
        TokenCase("trailing dot", valid + ".", "jwt-invalid:format"),
        TokenCase("trailing dots", valid + "..", "jwt-invalid:format"),
        TokenCase("trailing padding", valid + "==", "jwt-invalid:format"),
        TokenCase(f"claim {t.principal_claim} twice",
                  token(h, f'{c[:-1]}, {json.dumps(t.principal_claim)}: {other}}}'), "jwt-invalid:format"),
        TokenCase("header alg twice", token('{"alg": "none", ' + h[1:], c), "jwt-invalid:format"),
        TokenCase("crit naming an unknown extension",
                  token(json.dumps({**head, "crit": ["perimeter-unknown"], "perimeter-unknown": True}), c),
                  "jwt-invalid:crit"),
        TokenCase("exp 1e300", token(h, json.dumps({**good, "exp": 1e300})), "jwt-invalid:exp"),
    ]
