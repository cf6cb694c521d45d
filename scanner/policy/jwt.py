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
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from pydantic import Field, Strict, ValidationInfo, model_validator
from pydantic.dataclasses import dataclass

from scanner.errors import ConfigError
from scanner.policy.base import (
    CONFIG,
    Base,
    Hidden,
    Int,
    Internal,
    Line,
    Str,
    Text,
    YamlMap,
    base_dir,
    fail,
    reading,
    replace,
)

# The signature algorithms a policy may allow (asymmetric only: never ``none``, never an HMAC,
# whose secret would be the public key a client can read).
ALGORITHMS: tuple[str, ...] = ("RS256", "PS256", "ES256", "EdDSA")
Algorithm = Literal["RS256", "PS256", "ES256", "EdDSA"]
DEFAULT_ALGORITHMS: tuple[Algorithm, ...] = ("RS256", "PS256", "ES256")
# The algorithms each key type verifies.
KEY_ALGORITHMS: Mapping[str, tuple[str, ...]] = {
    "RSA": ("RS256", "PS256"), "EC:P-256": ("ES256",), "OKP:Ed25519": ("EdDSA",)}
MAX_TOKEN_BYTES = 8192          # a bearer token longer than this is refused (jwt-invalid:size)
MAX_KEYS = 64
# A claim value a proxy may name a principal or role by (written into logs and a header).
CLAIM_VALUE = re.compile(r"^[A-Za-z0-9_.@:+/=|-]{1,256}$")
CLAIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}$")
ROLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, config=CONFIG)
class Jwk(Base):
    """One public key of a JWKS."""

    kid: str
    kty: str            # "RSA", "EC:P-256", "OKP:Ed25519"
    algorithms: tuple[str, ...]   # what it verifies: its own ``alg``, or its type's, within the allowlist
    spki: str           # SubjectPublicKeyInfo, DER, base64


Claim = Annotated[str, Strict(), Field(pattern=CLAIM_VALUE.pattern)]
ClaimName = Annotated[str, Strict(), Field(pattern=CLAIM_NAME.pattern)]
Role = Annotated[str, Strict(), Field(pattern=ROLE.pattern)]
_CLAIM_RULE = "letters, digits and _.@:+/=|- only (at most 256)"


@dataclass(frozen=True, config=CONFIG)
class JwtAuth(Base):
    """An audience's token rules (``auth: jwt`` + ``jwt:``, docs/identity.md). The token itself
    never reaches vLLM (both proxies remove Authorization)."""

    _inputs: ClassVar[Mapping[str, Any]] = {
        "required_claims": {"additionalProperties": {"anyOf": [
            {"type": "string"}, {"type": "array", "items": {"type": "string"}}]}}}

    issuers: Annotated[tuple[Claim, ...], Field(min_length=1)]
    audiences: Annotated[tuple[Claim, ...], Field(min_length=1)]
    jwks_file: Annotated[Text, Field(description="JWKS JSON (public keys with kid), relative to the policy's "
                                     "directory; read at generate time (rotate: replace, generate, reload)")]
    keys: Annotated[tuple[Jwk, ...], Internal, Hidden] = ()    # read from jwks_file
    algorithms: tuple[Algorithm, ...] = Field(
        default=DEFAULT_ALGORITHMS, min_length=1, description="never none, never HS*")
    remote_jwks: Str = Field(default="", description="Envoy only: fetch the JWKS from this https URL")
    clock_skew_s: Int = Field(default=60, ge=0)
    # claim -> the values it may hold (a token's claim, or any item of a list claim, must be one)
    required_claims: Mapping[ClaimName, tuple[Claim, ...]] = Field(default_factory=dict)
    principal_claim: ClaimName = "sub"
    role_claim: Str = ""                   # with ``roles``: claim value -> role
    roles: Mapping[Claim, Role] = Field(default_factory=dict, description="role_claim value -> role")
    role: Str = Field(default="", description="a fixed role (without role_claim)")
    max_token_bytes: Int = Field(default=MAX_TOKEN_BYTES, ge=256, le=16384)
    line: Line = 0

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        for alg in out.get("algorithms") or ():
            if isinstance(alg, str) and (alg.lower() == "none" or alg.upper().startswith("HS")):
                raise fail(f"{alg!r} is never allowed: a token signed with no key, or with a shared secret "
                           "(an HMAC), proves nothing a client cannot forge", "algorithms")
        claims = out.get("required_claims")
        if isinstance(claims, dict):
            out["required_claims"] = {k: (v,) if isinstance(v, str) else v for k, v in claims.items()}
        return out

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> JwtAuth:
        if not reading(info):
            return self
        for claim, values in (("principal_claim", self.principal_claim), ("role_claim", self.role_claim)):
            if values and not CLAIM_NAME.match(values):
                raise fail(f"{values!r} is not a claim name", claim)
        if self.remote_jwks and not re.fullmatch(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/%-]*)?",
                                                 self.remote_jwks):
            raise fail(f"{self.remote_jwks!r} is not an https URL", "remote_jwks")
        if self.role and not ROLE.match(self.role):
            raise fail(f"role {self.role!r}: use letters, digits, '.', '_' or '-'", "role")
        if bool(self.role_claim) != bool(self.roles):
            raise fail("role_claim and roles go together: the claim, and its values -> roles")
        if self.role_claim and self.role:
            raise fail("give either a fixed role or role_claim + roles, not both", "role")
        if not self.role_claim and not self.role:
            raise fail("a token's role: role_claim + roles (claim value -> role), or a fixed role")
        path = (base_dir(info) / self.jwks_file).absolute()
        if any(c in str(path) for c in "\"\\$;{}\n\r\t '"):
            raise fail(f"{str(path)!r}: a path without quotes, spaces, '$', ';' or braces", "jwks_file")
        algorithms = tuple(sorted(set(self.algorithms), key=ALGORITHMS.index))
        try:
            keys = read_jwks(path, algorithms)
        except ConfigError as exc:
            raise fail(exc.message, "jwks_file") from None
        return replace(self, issuers=tuple(sorted(set(self.issuers))),
                       audiences=tuple(sorted(set(self.audiences))),
                       jwks_file=str(path), keys=keys, algorithms=algorithms,
                       required_claims=dict(sorted(self.required_claims.items())),
                       roles=dict(sorted(self.roles.items())))

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
