"""User identity from bearer tokens (``auth: jwt``): the audience's token rules and its JWKS.

A JWKS file is read when the policy is loaded: each public key with its ``kid``, its key type,
the algorithms it verifies under the policy's allowlist, and its SubjectPublicKeyInfo (DER,
base64), the one key format both njs versions import. Rotation: replace the file, generate, reload.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from scanner.errors import ConfigError

# The signature algorithms a policy may allow (asymmetric only: never ``none``, never an HMAC,
# whose secret would be the public key a client can read).
ALGORITHMS: tuple[str, ...] = ("RS256", "PS256", "ES256", "EdDSA")
DEFAULT_ALGORITHMS: tuple[str, ...] = ("RS256", "PS256", "ES256")
# The algorithms each key type verifies.
KEY_ALGORITHMS: Mapping[str, tuple[str, ...]] = {
    "RSA": ("RS256", "PS256"), "EC:P-256": ("ES256",), "OKP:Ed25519": ("EdDSA",)}
MAX_TOKEN_BYTES = 8192          # a bearer token longer than this is refused (jwt-invalid:size)
MAX_KEYS = 64
# A claim value a proxy may name a principal or role by (written into logs and a header).
CLAIM_VALUE = re.compile(r"^[A-Za-z0-9_.@:+/=|-]{1,256}$")
CLAIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}$")


@dataclass(frozen=True)
class Jwk:
    """One public key of a JWKS."""

    kid: str
    kty: str            # "RSA", "EC:P-256", "OKP:Ed25519"
    algorithms: tuple[str, ...]   # what it verifies: its own ``alg``, or its type's, within the allowlist
    spki: str           # SubjectPublicKeyInfo, DER, base64


@dataclass(frozen=True)
class JwtAuth:
    """An audience's token rules (``auth: jwt`` + ``jwt:``)."""

    issuers: tuple[str, ...]
    audiences: tuple[str, ...]
    jwks_file: str                         # absolute path of the JWKS JSON
    keys: tuple[Jwk, ...]
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    remote_jwks: str = ""                  # Envoy only: fetched from this https URL instead
    clock_skew_s: int = 60
    # claim -> the values it may hold (a token's claim, or any item of a list claim, must be one)
    required_claims: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    principal_claim: str = "sub"
    role_claim: str = ""                   # with ``roles``: claim value -> role
    roles: Mapping[str, str] = field(default_factory=dict)
    role: str = ""                         # a fixed role (when no role_claim)
    max_token_bytes: int = MAX_TOKEN_BYTES
    line: int = 0

    @property
    def key_types(self) -> tuple[str, ...]:
        return tuple(sorted({k.kty for k in self.keys}))

    def role_of(self, claim: object) -> str:
        """The role a verified token's role claim gives ("" none): a string, or the first item of a
        list (in the token's order) that ``roles`` maps; a fixed role without a role claim."""
        if not self.role_claim:
            return self.role
        values = claim if isinstance(claim, list) else [claim]
        return next((self.roles[v] for v in values if isinstance(v, str) and v in self.roles), "")

    def to_dict(self) -> dict[str, object]:
        return {"issuers": list(self.issuers), "audiences": list(self.audiences),
                "jwks_file": self.jwks_file, "keys": [{"kid": k.kid, "kty": k.kty,
                                                       "algorithms": list(k.algorithms)} for k in self.keys],
                "algorithms": list(self.algorithms), "remote_jwks": self.remote_jwks,
                "clock_skew_s": self.clock_skew_s,
                "required_claims": {k: list(v) for k, v in sorted(self.required_claims.items())},
                "principal_claim": self.principal_claim, "role_claim": self.role_claim,
                "roles": dict(sorted(self.roles.items())), "role": self.role,
                "max_token_bytes": self.max_token_bytes}


def _b64u_int(value: object, what: str) -> int:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", value):
        raise ConfigError(f"{what}: not base64url")
    return int.from_bytes(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)), "big")


def _public(jwk: Mapping[str, object], what: str) -> tuple[str, object]:
    """(key type, public key object) of one JWK."""
    kty = jwk.get("kty")
    if any(k in jwk for k in ("d", "p", "q", "k")):
        raise ConfigError(f"{what}: holds a private or symmetric key; a JWKS for the perimeter holds "
                          "public keys only")
    if kty == "RSA":
        n, e = _b64u_int(jwk.get("n"), f"{what}.n"), _b64u_int(jwk.get("e"), f"{what}.e")
        if n.bit_length() < 2048:
            raise ConfigError(f"{what}: an RSA key of {n.bit_length()} bits (at least 2048)")
        return "RSA", rsa.RSAPublicNumbers(e, n).public_key()
    if kty == "EC":
        if jwk.get("crv") != "P-256":
            raise ConfigError(f"{what}: curve {jwk.get('crv')!r} (only P-256, for ES256)")
        x, y = _b64u_int(jwk.get("x"), f"{what}.x"), _b64u_int(jwk.get("y"), f"{what}.y")
        try:
            return "EC:P-256", ec.EllipticCurvePublicNumbers(x, y, ec.SECP256R1()).public_key()
        except ValueError:
            raise ConfigError(f"{what}: not a point on P-256") from None
    if kty == "OKP" and jwk.get("crv") == "Ed25519":
        text = jwk.get("x")
        raw = (base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
               if isinstance(text, str) and re.fullmatch(r"[A-Za-z0-9_-]+", text) else b"")
        if len(raw) != 32:
            raise ConfigError(f"{what}.x: not an Ed25519 public key")
        return "OKP:Ed25519", ed25519.Ed25519PublicKey.from_public_bytes(raw)
    raise ConfigError(f"{what}: key type {kty!r} (crv {jwk.get('crv')!r}) is not one the perimeter "
                      "verifies (RSA, EC P-256, OKP Ed25519)")


def read_jwks(path: str | Path, algorithms: tuple[str, ...]) -> tuple[Jwk, ...]:
    """The public keys of a JWKS file that verify an allowed algorithm, sorted by kid; any
    problem: a ConfigError naming the file (one line)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the JWKS ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{path}: not a JSON JWKS") from None
    items = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: a JWKS is {{\"keys\": [...]}} with at least one key")
    if len(items) > MAX_KEYS:
        raise ConfigError(f"{path}: {len(items)} keys (at most {MAX_KEYS})")
    out: dict[str, Jwk] = {}
    for i, jwk in enumerate(items):
        what = f"{path}: keys[{i}]"
        if not isinstance(jwk, dict):
            raise ConfigError(f"{what}: not a JSON object")
        kid = jwk.get("kid")
        if not isinstance(kid, str) or not CLAIM_VALUE.match(kid):
            raise ConfigError(f"{what}: needs a kid (letters, digits and _.@:+/=|-, at most 256)")
        if kid in out:
            raise ConfigError(f"{what}: kid {kid!r} is listed twice")
        if jwk.get("use", "sig") != "sig":
            continue
        kty, public = _public(jwk, what)
        own = jwk.get("alg")
        if own is not None and own not in KEY_ALGORITHMS[kty]:
            raise ConfigError(f"{what}: alg {own!r} does not fit a {kty} key")
        algs = tuple(a for a in ((own,) if isinstance(own, str) else KEY_ALGORITHMS[kty]) if a in algorithms)
        if not algs:
            continue   # a key for an algorithm the policy does not allow: never used
        der = public.public_bytes(serialization.Encoding.DER,   # type: ignore[attr-defined]
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
        out[kid] = Jwk(kid=kid, kty=kty, algorithms=algs, spki=base64.b64encode(der).decode())
    if not out:
        raise ConfigError(f"{path}: no key verifies an allowed algorithm ({', '.join(algorithms)})")
    return tuple(out[k] for k in sorted(out))
