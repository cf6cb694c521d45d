"""The perimeter's credential rules in Python: the reference every proxy must agree with.

One verdict per credential (docs/identity.md, "What is checked"): a bearer token on a route of an
``auth: jwt`` audience, a client certificate on a route of an ``auth: cert`` audience, judged to
(status, reason token, principal) exactly as njs (NGINX 1.31, 1.22) and Lua after ``jwt_authn``
(Envoy 1.40) judge them. The differential identity corpus (tests/differential) sends each form to
every proxy and compares the answers with this module's.

A bearer token, in this order (the first rule broken names the refusal):

0. ``Authorization`` values over :data:`HEADERS_MAX` bytes: the proxy's own header limit, 431
   ``headers-too-large``.
1. Two ``Authorization`` headers, or one holding a comma (a list of credentials: Envoy joins
   two headers with a comma, NGINX refuses a second one itself; no token holds a comma): 400
   ``bad-request``. None, or not ``Bearer`` (any letter case, RFC 7235: the scheme is
   case-insensitive), one or more spaces and a credential: 401 ``jwt-missing``.
2. Longer than ``max_token_bytes``: 401 ``jwt-invalid:size``.
3. Not exactly three parts of canonical unpadded base64url (alphabet ``A-Za-z0-9_-``, no ``=``,
   no trailing dot or bits), a header and claims that are not UTF-8 JSON objects (no ``NaN``,
   no number beyond a double, no escape of a lone surrogate, nesting at most
   :data:`MAX_DEPTH`), a member name twice in any object of either, a registered claim of the
   wrong type (``iss``, ``sub``, ``jti`` not strings, ``aud`` neither a string nor a list of
   strings): 401 ``jwt-invalid:format``.
4. A ``crit`` header member (RFC 7515 4.1.11: the perimeter understands no extension):
   401 ``jwt-invalid:crit``.
5. ``alg`` not a string of the allowlist (the proxy's, :func:`scanner.plan.jwt.verified`):
   ``jwt-invalid:alg``; a ``kid`` that is not a string or not in the JWKS (or none while the
   JWKS holds several keys): ``jwt-invalid:kid``; a key that does not verify ``alg``:
   ``jwt-invalid:alg``.
6. No ``exp``, or ``exp`` / ``nbf`` / ``iat`` not an integer 0..2^32-1 (a JSON number of
   integral value; ``1e300``, ``-1``, ``1.5``, strings refused): ``jwt-invalid:exp`` /
   ``jwt-invalid:nbf`` / ``jwt-invalid:iat``.
7. The signature: ``jwt-invalid:signature``.
8. ``exp`` + skew before now: ``jwt-expired``; ``nbf`` or ``iat`` after now + skew:
   ``jwt-not-yet-valid``; the issuer: ``jwt-issuer``; no audience of the policy's:
   ``jwt-audience``; a required claim: 403 ``jwt-claim:NAME``; a principal claim the perimeter
   cannot name: 403 ``jwt-claim:NAME``; a role claim mapping to no role: 403 ``jwt-role``; a
   role the route does not admit: 403 ``role``.

Steps 1-6 judge the token's text before its signature; Envoy's Lua judges them itself and reads
only the signature's verdict from ``jwt_authn`` (whose own time and audience checks it never
meets: its clock skew is the largest it takes, and it holds no audiences).

A client certificate (verified by the listener against ``client_ca``): a certificate with any
URI SAN is named by it alone (exactly one, listed: that principal; several, or one not listed:
nobody), a certificate without a URI SAN by its subject; nobody: 403 ``cert-unknown``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa, utils

from scanner.plan import jwt as plan_jwt
from scanner.policy.jwt import CLAIM_VALUE, Jwk, JwtAuth
from scanner.policy.model import CertPrincipal

TIME_MAX = 2**32 - 1          # the largest exp / nbf / iat (a NumericDate in 32 unsigned bits)
# the request headers a proxy takes with bearer tokens (NGINX: a 32 KiB header line; Envoy: 32 KiB
# of headers): beyond, its own 431 headers-too-large answers first (within about the size of the
# request's other headers below the limit, which proxy answers depends on them)
HEADERS_MAX = 32 * 1024
MAX_DEPTH = 16                # objects and lists nested in a token's header or claims, at most
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_PART = re.compile(r"[A-Za-z0-9_-]+")
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(.+)", re.S)
_PRINTABLE = re.compile(r"[\x21-\x7e]+")
_WS = " \t"
_SURROGATE = re.compile("[\ud800-\udfff]")   # a lone surrogate escape (a pair decodes to one character)


@dataclass(frozen=True)
class Verdict:
    """What the perimeter answers a credential: admitted (status 0, reason ""), or the status and
    reason token (scanner/reasons.py) of its refusal. ``principal`` is the name the upstream and
    the logs see (a token's ``jwt:ID:CLAIM``, scanner/plan/jwt.py; a certificate principal's
    name), ``subject`` what named it (the principal claim's value), ``issuer`` the token's."""

    status: int = 0
    reason: str = ""
    subject: str = ""
    issuer: str = ""
    role: str = ""
    principal: str = ""

    @property
    def admitted(self) -> bool:
        return self.status == 0


def _refused(status: int, reason: str) -> Verdict:
    return Verdict(status, reason)


def b64url_part(part: str) -> bytes | None:
    """A token part's bytes: canonical unpadded base64url only (no ``=``, no other alphabet, no
    length of 1 mod 4, no bits set past the last byte); else None."""
    if not _PART.fullmatch(part) or len(part) % 4 == 1:
        return None
    last = B64URL.index(part[-1])
    if (len(part) % 4 == 2 and last & 0x0F) or (len(part) % 4 == 3 and last & 0x03):
        return None
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class _Bad(ValueError):
    pass


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise _Bad(f"member {k!r} twice")
        out[k] = v
    return out


def _constant(name: str) -> object:
    raise _Bad(f"{name} is not JSON")


def _sound(v: object, depth: int) -> bool:
    """Nesting within MAX_DEPTH, every number finite as a double, no lone surrogate in a string."""
    if isinstance(v, dict | list):
        if depth > MAX_DEPTH:
            return False
        items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
        return all(_sound(x, depth + 1) for x in items)
    if isinstance(v, str):
        return not _SURROGATE.search(v)
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            return math.isfinite(float(v))
        except OverflowError:
            return False
    return True


def json_object(part: str) -> dict[str, object] | None:
    """A header or claims part as the perimeter reads it: a UTF-8 JSON object, no member name
    twice in any object, nesting within MAX_DEPTH, finite numbers; else None."""
    raw = b64url_part(part)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not _sound(value, 1):
        return None
    return value


def time_value(v: object) -> bool:
    """An exp / nbf / iat the perimeter takes: a number of integral value within 0..TIME_MAX."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        f = float(v)
    except OverflowError:
        return False
    return math.isfinite(f) and f == math.floor(f) and 0 <= f <= TIME_MAX


def key_for(t: JwtAuth, algorithms: Sequence[str], header: Mapping[str, object]) -> Jwk | None:
    """The JWKS key a token's header names among those verifying one of ``algorithms``: by its
    kid, or the only one when it has none."""
    keys = [k for k in t.keys if any(a in algorithms for a in k.algorithms)]
    if "kid" not in header:
        return keys[0] if len(keys) == 1 else None
    kid = header["kid"]
    return next((k for k in keys if k.kid == kid), None) if isinstance(kid, str) else None


def signature_ok(key: Jwk, alg: str, signing_input: bytes, signature: bytes) -> bool:
    """Does ``signature`` verify ``signing_input`` under ``key`` and ``alg`` (RS256, PS256, ES256,
    EdDSA)?"""
    public = serialization.load_der_public_key(base64.b64decode(key.spki))
    try:
        if alg == "RS256" and isinstance(public, rsa.RSAPublicKey):
            public.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
        elif alg == "PS256" and isinstance(public, rsa.RSAPublicKey):
            public.verify(signature, signing_input, padding.PSS(padding.MGF1(hashes.SHA256()), 32),
                          hashes.SHA256())
        elif alg == "ES256" and isinstance(public, ec.EllipticCurvePublicKey):
            if len(signature) != 64:
                return False
            der = utils.encode_dss_signature(int.from_bytes(signature[:32], "big"),
                                             int.from_bytes(signature[32:], "big"))
            public.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
        elif alg == "EdDSA" and isinstance(public, ed25519.Ed25519PublicKey):
            public.verify(signature, signing_input)
        else:
            return False
    except InvalidSignature:
        return False
    return True


def _has(claim: object, values: Sequence[str]) -> bool:
    items = claim if isinstance(claim, list) else [claim]
    return any(isinstance(v, str) and v in values for v in items)


def judge_token(t: JwtAuth, algorithms: Sequence[str], authorization: Sequence[str], now: int,
                route_roles: Sequence[str] = ()) -> Verdict:
    """The verdict on a request's ``Authorization`` header values (as sent, in order) on a route
    of ``t``'s audience admitting ``route_roles`` (empty: any role), ``algorithms`` being what
    the proxy verifies of the allowlist, at time ``now`` (seconds)."""
    if not authorization:
        return _refused(401, "jwt-missing")
    if sum(len(v.encode()) for v in authorization) > HEADERS_MAX:
        return _refused(431, "headers-too-large")
    if len(authorization) > 1 or "," in authorization[0]:
        return _refused(400, "bad-request")   # a list of credentials (no token holds a comma)
    m = _BEARER.fullmatch(authorization[0].strip(_WS))
    if m is None:
        return _refused(401, "jwt-missing")
    token = m.group(1).lstrip(" ")
    if len(token.encode()) > t.max_token_bytes:
        return _refused(401, "jwt-invalid:size")
    parts = token.split(".")
    if not _PRINTABLE.fullmatch(token) or len(parts) != 3 or b64url_part(parts[2]) is None:
        return _refused(401, "jwt-invalid:format")
    header, claims = json_object(parts[0]), json_object(parts[1])
    if header is None or claims is None:
        return _refused(401, "jwt-invalid:format")
    if any(n in claims and not isinstance(claims[n], str) for n in ("iss", "sub", "jti")):
        return _refused(401, "jwt-invalid:format")
    aud = claims.get("aud", "")
    if not isinstance(aud, str) and not (isinstance(aud, list) and all(isinstance(a, str) for a in aud)):
        return _refused(401, "jwt-invalid:format")
    if "crit" in header:
        return _refused(401, "jwt-invalid:crit")
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in algorithms:
        return _refused(401, "jwt-invalid:alg")
    key = key_for(t, algorithms, header)
    if key is None:
        return _refused(401, "jwt-invalid:kid")
    if alg not in key.algorithms:
        return _refused(401, "jwt-invalid:alg")
    if "exp" not in claims:
        return _refused(401, "jwt-invalid:exp")
    for name in ("exp", "nbf", "iat"):
        if name in claims and not time_value(claims[name]):
            return _refused(401, f"jwt-invalid:{name}")
    signature = b64url_part(parts[2]) or b""
    if not signature_ok(key, alg, f"{parts[0]}.{parts[1]}".encode(), signature):
        return _refused(401, "jwt-invalid:signature")
    return judge_claims(t, claims, now, route_roles)


def judge_claims(t: JwtAuth, claims: Mapping[str, object], now: int,
                 route_roles: Sequence[str] = ()) -> Verdict:
    """Step 8: the claims of a token whose form, header and signature passed."""
    exp = claims["exp"]
    assert isinstance(exp, int | float)
    if now > exp + t.clock_skew_s:
        return _refused(401, "jwt-expired")
    for name in ("nbf", "iat"):
        v = claims.get(name)
        if isinstance(v, int | float) and v > now + t.clock_skew_s:
            return _refused(401, "jwt-not-yet-valid")
    iss = claims.get("iss")
    if not isinstance(iss, str) or iss not in t.issuers:
        return _refused(401, "jwt-issuer")
    aud = claims.get("aud")
    if not any(a in t.audiences for a in (aud if isinstance(aud, list) else [aud]) if isinstance(a, str)):
        return _refused(401, "jwt-audience")
    for name, values in t.required_claims.items():
        if not _has(claims.get(name), values):
            return _refused(403, f"jwt-claim:{name}")
    who = claims.get(t.principal_claim)
    if not isinstance(who, str) or not CLAIM_VALUE.fullmatch(who):
        return _refused(403, f"jwt-claim:{t.principal_claim}")
    role = t.role_of(claims.get(t.role_claim)) if t.role_claim else t.role
    if not role:
        return _refused(403, "jwt-role")
    named = plan_jwt.principal(t, iss, who)
    if route_roles and role not in route_roles:
        return Verdict(403, "role", who, iss, role, named)
    return Verdict(0, "", who, iss, role, named)


def cert_principal(principals: Sequence[CertPrincipal], sans: Sequence[str],
                   subject: str) -> CertPrincipal | None:
    """Who a verified certificate with URI SANs ``sans`` and subject ``subject`` (RFC 2253, as the
    proxies print it) names: with any URI SAN, the principal of its one SAN (several: nobody);
    without, the principal of its subject."""
    if sans:
        return next((p for p in principals if p.san and len(sans) == 1 and p.san == sans[0]), None)
    return next((p for p in principals if p.subject and p.subject == subject), None)


def judge_certificate(principals: Sequence[CertPrincipal], presented: bool, verified: bool,
                      sans: Sequence[str], subject: str, route_roles: Sequence[str] = ()) -> Verdict:
    """The verdict on a client certificate on an ``auth: cert`` route (the listener verified it
    when ``verified``; a certificate it could not verify never reaches a route on Envoy)."""
    if not presented:
        return _refused(401, "cert-missing")
    if not verified:
        return _refused(401, "cert-invalid")
    p = cert_principal(principals, sans, subject)
    if p is None:
        return _refused(403, "cert-unknown")
    if route_roles and p.role not in route_roles:
        return Verdict(403, "role", p.name, "", p.role, p.name)
    return Verdict(0, "", p.name, "", p.role, p.name)


def chain_within(intermediates: int, verify_depth: int) -> bool:
    """Does a client certificate chain with ``intermediates`` CA certificates between it and the
    client CA verify under ``listen.tls.verify_depth`` (N intermediates allowed, on every proxy:
    NGINX ``ssl_verify_depth N``, Envoy ``max_verify_depth N + 1``, which counts the trust
    anchor)?"""
    return intermediates <= verify_depth
