"""The differential identity corpus (issue 26): bearer token forms and client certificate forms
an attacker tries, each to be judged alike by the reference (scanner/plan/credential.py) and by
every proxy (NGINX 1.31, NGINX 1.22, Envoy 1.40): admission, principal and reason token.

A token form is the ``Authorization`` header values a request carries. The forms cover the
scheme (letter case, spaces, other schemes, two headers, a comma), the token's form (trailing
dots, padding, another alphabet, non-canonical bits, part counts, sizes), its JSON (duplicate
members in the header or the claims, escaped names, invalid UTF-8, nesting, huge numbers,
non-objects), ``crit``, ``alg`` and ``kid`` forms, the time claims (``1e300``, ``-1``, ``1.5``,
strings, nulls, edges of the range), registered claims of other types, issuer and audience
look-alikes, required claims, principal and role claims, signatures (tampered, truncated,
swapped, DER for ES256) and forms broken twice (which rule answers first).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils

from scanner.policy.jwt import JwtAuth
from scanner.probe import tokens_jwt
from scanner.probe.testca import TestCa


@dataclass(frozen=True)
class TokenForm:
    name: str
    authorization: tuple[str, ...] = field(repr=False)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _sign_bytes(key: object, alg: str, signing: bytes) -> bytes:
    if alg == "RS256" and isinstance(key, rsa.RSAPrivateKey):
        return key.sign(signing, padding.PKCS1v15(), hashes.SHA256())
    if alg == "PS256" and isinstance(key, rsa.RSAPrivateKey):
        return key.sign(signing, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
    if alg in ("ES256", "ES256-DER") and isinstance(key, ec.EllipticCurvePrivateKey):
        der = key.sign(signing, ec.ECDSA(hashes.SHA256()))
        if alg == "ES256-DER":
            return der
        r, s = utils.decode_dss_signature(der)
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")
    raise ValueError(f"cannot sign {alg} with {type(key).__name__}")


def signed(signer: tokens_jwt.Signer, header: bytes | str | Mapping[str, object],
           claims: bytes | str | Mapping[str, object], alg: str | None = None) -> str:
    """A token over exactly these header and claims texts (a mapping: its compact JSON), signed
    with ``signer``'s key under ``alg`` (default: the signer's)."""
    def text(v: bytes | str | Mapping[str, object]) -> bytes:
        if isinstance(v, bytes):
            return v
        return v.encode() if isinstance(v, str) else json.dumps(dict(v), separators=(",", ":")).encode()
    signing = f"{b64(text(header))}.{b64(text(claims))}"
    return f"{signing}.{b64(_sign_bytes(signer.key, alg or signer.alg, signing.encode()))}"


def _noncanonical(part: str) -> str:
    """``part`` with its last character changed to one that sets bits past the last byte (the
    same bytes for a lax decoder)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    n = len(part) % 4
    i = alphabet.index(part[-1])
    return part[:-1] + alphabet[i | (15 if n == 2 else 3)] if n in (2, 3) else part + "A"


def token_forms(t: JwtAuth, issuer: tokens_jwt.Issuer, now: int, subject: str = "alice") -> list[TokenForm]:
    """Every token form for audience ``t`` (issued by ``issuer``'s keys, whose JWKS the policy
    holds: an RSA and an EC key) at time ``now``."""
    rsa_s, ec_s = issuer.rsa, issuer.ec
    skew = t.clock_skew_s
    good = tokens_jwt.valid_claims(t, "user", subject, now)
    head = {"alg": "RS256", "typ": "JWT", "kid": rsa_s.kid}
    ehead = {"alg": "ES256", "typ": "JWT", "kid": ec_s.kid}
    valid = signed(rsa_s, head, good)
    hp, pp, sp = valid.split(".")
    out: list[TokenForm] = []

    def add(name: str, *authorization: str) -> None:
        out.append(TokenForm(name, tuple(authorization)))

    def bearer(name: str, token: str) -> None:
        add(name, f"Bearer {token}")

    def both(name: str, claims: bytes | str | Mapping[str, object], header: Mapping[str, object] | None = None) -> None:
        """The claims signed with the RSA (RS256 and PS256) and the EC key."""
        bearer(f"{name} [RS256]", signed(rsa_s, header or head, claims))
        bearer(f"{name} [PS256]", signed(rsa_s, {**(header or head), "alg": "PS256"}, claims, "PS256"))
        bearer(f"{name} [ES256]", signed(ec_s, {**(header or ehead), "alg": "ES256", "kid": ec_s.kid}, claims))

    # --- the scheme and the header --------------------------------------------------------
    add("no Authorization")
    for scheme in ("Bearer", "bearer", "BEARER", "BeArEr", "bEARER"):
        add(f"scheme {scheme}", f"{scheme} {valid}")
    add("two spaces", f"Bearer  {valid}")
    add("five spaces", f"Bearer     {valid}")
    add("trailing space", f"Bearer {valid} ")
    add("tab after scheme", f"Bearer\t{valid}")
    add("no space", f"Bearer{valid}")
    add("scheme only", "Bearer")
    add("scheme and space", "Bearer ")
    add("Basic", f"Basic {valid}")
    add("Token scheme", f"Token {valid}")
    add("JWT scheme", f"JWT {valid}")
    add("Bearers", f"Bearers {valid}")
    add("token without scheme", valid)
    add("empty header", "")
    add("two headers, both valid", f"Bearer {valid}", f"Bearer {valid}")
    add("two headers, junk first", "Bearer junk", f"Bearer {valid}")
    add("two headers, Basic first", "Basic dXNlcjpwYXNz", f"Bearer {valid}")
    add("comma list in one header", f"Bearer {valid}, Bearer {valid}")
    add("comma after token", f"Bearer {valid},")
    add("token, space, junk", f"Bearer {valid} junk")
    add("space inside token", f"Bearer {hp}. {pp}.{sp}")
    add("quoted token", f'Bearer "{valid}"')
    add("percent-encoded dot", f"Bearer {hp}%2E{pp}.{sp}")

    # --- the token's form -------------------------------------------------------------------
    for suffix in (".", "..", "...", "=", "==", "===", "~", "+", "/", "%3D"):
        bearer(f"trailing {suffix!r}", valid + suffix)
    for prefix in (".", "=", "~"):
        bearer(f"leading {prefix!r}", prefix + valid)
    bearer("two parts", f"{hp}.{pp}")
    bearer("four parts", f"{valid}.{sp}")
    bearer("five parts", f"{valid}.{hp}.{pp}")
    bearer("empty signature", f"{hp}.{pp}.")
    bearer("empty header part", f".{pp}.{sp}")
    bearer("empty claims part", f"{hp}..{sp}")
    bearer("only dots", "..")
    bearer("one word", "abcdef")
    bearer("padded header part", f"{hp}{'=' * (-len(hp) % 4) or '=='}.{pp}.{sp}")
    bearer("padded signature", f"{hp}.{pp}.{sp}{'=' * (-len(sp) % 4) or '=='}")
    std = valid.replace("-", "+").replace("_", "/")
    if std != valid:
        bearer("standard base64 alphabet", std)
    bearer("non-canonical signature bits", f"{hp}.{pp}.{_noncanonical(sp)}")
    bearer("signature length 1 mod 4", f"{hp}.{pp}.{sp}A" if len(sp) % 4 == 0 else f"{hp}.{pp}.{sp[:len(sp) - len(sp) % 4]}A")
    bearer("claims length 1 mod 4", f"{hp}.{pp}{'A' * ((1 - len(pp)) % 4)}.{sp}")
    bearer("signature with '*'", f"{hp}.{pp}.{sp[:-1]}*")
    bearer("lower-cased token", valid.lower())
    # canonical forms of other texts: whitespace around the JSON is valid JSON
    both("claims with leading and trailing whitespace", "  " + json.dumps(good) + "\n ")
    both("claims with a BOM", "\ufeff" + json.dumps(good))

    # --- sizes --------------------------------------------------------------------------------
    base = signed(rsa_s, head, {**good, "pad": ""})
    room = t.max_token_bytes - len(base)
    fit = signed(rsa_s, head, {**good, "pad": "x" * (room * 3 // 4)})
    while len(fit) > t.max_token_bytes:
        fit = signed(rsa_s, head, {**good, "pad": "x" * (room * 3 // 4 - (len(fit) - t.max_token_bytes))})
    bearer(f"signed, {len(fit)} bytes (within max_token_bytes)", fit)
    over = signed(rsa_s, head, {**good, "pad": "x" * (room * 3 // 4 + 8)})
    bearer(f"signed, {len(over)} bytes (over max_token_bytes)", over)
    for size in (t.max_token_bytes + 1, 16384, 30000, 40000, 65536, 100000):
        bearer(f"unsigned junk of {size} bytes", "a" * size)
    bearer("three parts of 12000 bytes", ".".join(["a" * 12000] * 3))

    # --- the JSON of the claims ---------------------------------------------------------------
    gj = json.dumps(good, separators=(",", ":"))
    inner = gj[1:-1]
    both("claims: sub twice", '{"sub":"mallory",' + inner + "}")
    both("claims: sub twice, same value", "{" + inner + f',"sub":{json.dumps(subject)}}}')
    both("claims: exp twice", "{" + inner + f',"exp":{now + 900}}}')
    both("claims: iss twice", '{"iss":"https://other.example",' + inner + "}")
    both("claims: groups twice", "{" + inner + ',"groups":["llm-admins"]}')
    both("claims: sub and escaped sub", "{" + inner + ',"\\u0073ub":"mallory"}')
    both("claims: duplicate inside a nested object", "{" + inner + ',"ctx":{"a":1,"a":2}}')
    both("claims: duplicate inside an object in a list", "{" + inner + ',"ctx":[{"a":1,"a":2}]}')
    both("claims: same name in two nested objects", "{" + inner + ',"x":{"a":1},"y":{"a":2}}')
    both("claims: a list", "[" + gj + "]")
    both("claims: a string", json.dumps(gj))
    both("claims: null", "null")
    both("claims: a number", "42")
    both("claims: empty object", "{}")
    both("claims: trailing comma", "{" + inner + ",}")
    both("claims: single quotes", gj.replace('"', "'"))
    both("claims: NaN member", "{" + inner + ',"x":NaN}')
    both("claims: Infinity member", "{" + inner + ',"x":Infinity}')
    both("claims: 1e400 member", "{" + inner + ',"x":1e400}')
    both("claims: -1e400 member", "{" + inner + ',"x":-1e400}')
    both("claims: 400-digit integer member", "{" + inner + ',"x":' + "9" * 400 + "}")
    both("claims: 1e308 member", "{" + inner + ',"x":1e308}')
    both("claims: -0 member", "{" + inner + ',"x":-0}')
    both("claims: comment", "{" + inner + "} // c")
    both("claims: trailing garbage", gj + "x")
    both("claims: two objects", gj + gj)
    both("claims: hex number", "{" + inner + ',"x":0x10}')
    for number in ("010", "-01", "1.", ".5", "+1", "1e", "1.e5", "-", "01.5", "1E+2", "-0.0e-0"):
        both(f"claims: number {number}", "{" + inner + f',"x":{number}}}')
    both("claims: raw control character in a string", "{" + inner + ',"x":"a\tb"}')
    both("claims: escaped NUL in a string", "{" + inner + ',"x":"a\\u0000b"}')
    both("claims: lone surrogate escape", "{" + inner + ',"x":"\\ud800"}')
    both("claims: paired surrogate escape", "{" + inner + ',"x":"\\ud83d\\ude00"}')
    both("claims: raw emoji", ("{" + inner + ',"x":"\U0001F600"}').encode())
    both("claims: invalid UTF-8 byte", ("{" + inner + ',"x":"').encode() + b"\xff" + b'"}')
    both("claims: overlong UTF-8", ("{" + inner + ',"x":"').encode() + b"\xc0\xaf" + b'"}')
    both("claims: UTF-8 surrogate bytes", ("{" + inner + ',"x":"').encode() + b"\xed\xa0\x80" + b'"}')
    both("claims: Latin-1 byte", ("{" + inner + ',"x":"').encode() + b"\xe9" + b'"}')
    for depth in (15, 16, 17, 32, 200):
        nested = "[" * (depth - 1) + "1" + "]" * (depth - 1)
        both(f"claims: nesting depth {depth}", "{" + inner + f',"x":{nested}}}')
    both("claims: object nesting depth 16", "{" + inner + ',"x":' + '{"a":' * 15 + "1" + "}" * 15 + "}")
    both("claims: object nesting depth 17", "{" + inner + ',"x":' + '{"a":' * 16 + "1" + "}" * 16 + "}")

    # --- the JSON of the header ---------------------------------------------------------------
    hj = json.dumps(head, separators=(",", ":"))
    hin = hj[1:-1]
    for name, text in (("alg twice (RS256, none)", '{"alg":"none",' + hin + "}"),
                       ("alg twice (none last)", "{" + hin + ',"alg":"none"}'),
                       ("alg twice, same value", "{" + hin + ',"alg":"RS256"}'),
                       ("kid twice", "{" + hin + f',"kid":{json.dumps(ec_s.kid)}}}'),
                       ("kid and escaped kid", "{" + hin + ',"\\u006bid":"other"}'),
                       ("typ twice", "{" + hin + ',"typ":"at+jwt"}'),
                       ("a list", "[" + hj + "]"), ("null", "null"), ("a string", json.dumps(hj)),
                       ("trailing comma", "{" + hin + ",}"), ("empty object", "{}"),
                       ("NaN member", "{" + hin + ',"x":NaN}'), ("1e400 member", "{" + hin + ',"x":1e400}'),
                       ("nesting depth 17", "{" + hin + ',"x":' + "[" * 16 + "]" * 16 + "}"),
                       ("invalid UTF-8", ("{" + hin + ',"x":"').encode() + b"\xff" + b'"}')):
        bearer(f"header: {name}", signed(rsa_s, text if isinstance(text, bytes) else text.encode(), good, "RS256"))

    # --- crit ---------------------------------------------------------------------------------
    for crit in (["exp"], ["b64"], ["perimeter-unknown"], [], "exp", None, ["alg"]):
        both(f"crit {json.dumps(crit)}", good, {**head, "crit": crit})
    bearer("crit with b64 false", signed(rsa_s, {**head, "crit": ["b64"], "b64": False}, good))
    bearer("crit and alg none", b64(json.dumps({"alg": "none", "crit": ["x"]}).encode()) + "."
           + b64(json.dumps(good).encode()) + ".")

    # --- alg and kid ----------------------------------------------------------------------------
    bearer("alg none", tokens_jwt.forge_none(good, rsa_s.kid))
    bearer("alg none, signature kept", tokens_jwt.forge_none(good, rsa_s.kid) + sp)
    bearer("HS256 keyed with the RSA public key", tokens_jwt.forge_hs256(good, rsa_s.kid, rsa_s.public_pem))
    for alg in ("RS384", "RS512", "ES384", "EdDSA", "rs256", "RS256 ", "HS256", "", "None", "NONE"):
        bearer(f"alg {alg!r} (RS256 signature)", signed(rsa_s, {**head, "alg": alg}, good, "RS256"))
    for alg_value in (None, 256, ["RS256"], {"name": "RS256"}, True):
        bearer(f"alg {json.dumps(alg_value)}", signed(rsa_s, {**head, "alg": alg_value}, good, "RS256"))
    no_alg = {k: v for k, v in head.items() if k != "alg"}
    bearer("no alg", signed(rsa_s, no_alg, good, "RS256"))
    bearer("ES256 header on the RSA kid", signed(rsa_s, {**head, "alg": "ES256"}, good, "RS256"))
    bearer("ES256 signature under the RSA kid", signed(ec_s, {**head, "alg": "ES256"}, good, "ES256"))
    bearer("RS256 under the EC kid", signed(rsa_s, {**ehead, "alg": "RS256"}, good, "RS256"))
    bearer("PS256 signature labelled RS256", signed(rsa_s, head, good, "PS256"))
    bearer("RS256 signature labelled PS256", signed(rsa_s, {**head, "alg": "PS256"}, good, "RS256"))
    no_kid = {k: v for k, v in head.items() if k != "kid"}
    bearer("no kid (two keys in the JWKS)", signed(rsa_s, no_kid, good))
    for kid in ("", "perimeter-unknown-kid", rsa_s.kid + " ", rsa_s.kid.upper(), " " + rsa_s.kid,
                rsa_s.kid + "\n", rsa_s.kid + "\u0000"):
        bearer(f"kid {kid!r}", signed(rsa_s, {**head, "kid": kid}, good))
    for kid_value in (None, 1, [rsa_s.kid], {"k": rsa_s.kid}, True):
        bearer(f"kid {json.dumps(kid_value)}", signed(rsa_s, {**head, "kid": kid_value}, good))
    bearer("extra header members (jku, x5u, jwk)", signed(rsa_s, {**head, "jku": "https://evil.example/jwks",
                                                                 "x5u": "https://evil.example/c", "jwk": {"kty": "RSA"}}, good))
    bearer("typ at+jwt", signed(rsa_s, {**head, "typ": "at+jwt"}, good))
    bearer("no typ", signed(rsa_s, {k: v for k, v in head.items() if k != "typ"}, good))

    # --- the time claims ----------------------------------------------------------------------
    odd: list[tuple[str, object]] = [
        ("1e300", 1e300), ("-1", -1), ("1.5", 1.5), ("now+0.5", now + 600.5), ("a string", str(now + 600)),
        ("null", None), ("true", True), ("a list", [now + 600]), ("an object", {"t": now + 600}),
        ("2^32", 2**32), ("2^53", 2**53), ("1e10", 10**10), ("-0.5", -0.5)]
    for name, value in odd:
        both(f"exp {name}", {**good, "exp": value})
        both(f"nbf {name}", {**good, "nbf": value})
        both(f"iat {name}", {**good, "iat": value})
    both("exp 2^32-1", {**good, "exp": 2**32 - 1})
    both("exp as a float of integral value", ('{"exp":' + f"{now + 600}.0," + json.dumps(
        {k: v for k, v in good.items() if k != "exp"})[1:]).encode())
    both("exp in exponent form", ('{"exp":' + f"{(now + 600) / 1e9!r}e9," + json.dumps(
        {k: v for k, v in good.items() if k != "exp"})[1:]).encode())
    both("exp 0", {**good, "exp": 0})
    both("no exp", {k: v for k, v in good.items() if k != "exp"})
    both("expired beyond the skew", {**good, "exp": now - skew - 300})
    both("expired within the skew", {**good, "exp": now - skew + 300 if skew > 300 else now - skew // 2})
    both("nbf beyond the skew", {**good, "nbf": now + skew + 300})
    both("nbf within the skew", {**good, "nbf": now + skew // 2})
    both("nbf 0", {**good, "nbf": 0})
    both("iat beyond the skew", {**good, "iat": now + skew + 300})
    both("iat 0", {**good, "iat": 0})
    both("nbf 2^32-1", {**good, "nbf": 2**32 - 1})
    both("no nbf, no iat", {k: v for k, v in good.items() if k not in ("nbf", "iat")})

    # --- registered claims of other types -------------------------------------------------------
    for name, value in (("iss", 5), ("iss", None), ("iss", [t.issuers[0]]), ("sub", 5), ("sub", None),
                        ("sub", {"id": subject}), ("sub", [subject]), ("jti", 5), ("jti", None),
                        ("aud", 5), ("aud", [1]), ("aud", [t.audiences[0], 1]), ("aud", None),
                        ("aud", {"a": t.audiences[0]}), ("aud", [[t.audiences[0]]])):
        both(f"{name} {json.dumps(value)}", {**good, name: value})
    both("jti a string", {**good, "jti": "abc"})

    # --- issuer and audience look-alikes ------------------------------------------------------
    iss = t.issuers[0]
    for value in (iss + "/", iss.upper(), iss + " ", " " + iss, iss + "\u0000", iss.replace("https", "http"),
                  iss + "#", iss + "?x", "https://other-issuer.invalid", ""):
        both(f"iss {value!r}", {**good, "iss": value})
    both("no iss", {k: v for k, v in good.items() if k != "iss"})
    aud = t.audiences[0]
    for aud_value in (aud + " ", aud.upper(), aud + "\u0000", "x" + aud, "", "another-audience"):
        both(f"aud {aud_value!r}", {**good, "aud": aud_value})
    for aud_list in ([], ["another-audience"], ["another-audience", aud], [aud, aud]):
        both(f"aud {json.dumps(aud_list)}", {**good, "aud": aud_list})
    both("no aud", {k: v for k, v in good.items() if k != "aud"})

    # --- required claims, the principal, the role ---------------------------------------------
    for claim, values in t.required_claims.items():
        both(f"no {claim}", {k: v for k, v in good.items() if k != claim})
        for value in (values[0].upper(), values[0] + " ", [values[0]], ["x", values[-1]], [], 5, None,
                      {"v": values[0]}, [[values[0]]]):
            both(f"{claim} {json.dumps(value)}", {**good, claim: value})
    pc = t.principal_claim
    both(f"no {pc}", {k: v for k, v in good.items() if k != pc})
    for who in ("", "a" * 256, "a" * 257, "bob smith", "bob$x", "bob\nx", "b\u00f6b", "bob@example.com",
                "a:b/c=d|e+f", "svc"):
        both(f"{pc} {who[:40]!r}", {**good, pc: who})
    if t.role_claim:
        rc = t.role_claim
        users = next(v for v, r in t.roles.items() if r == "user")
        for value in (users, [users], ["unmapped", users], [5, users], [], ["unmapped"], None, 5,
                      {"g": users}, users.upper(), [[users]], ["llm-admins"], ["llm-admins", users],
                      [users, "llm-admins"]):
            both(f"{rc} {json.dumps(value)}", {**good, rc: value})
        both(f"no {rc}", {k: v for k, v in good.items() if k != rc})

    # --- signatures -----------------------------------------------------------------------------
    other = signed(rsa_s, head, {**good, pc: "mallory"})
    bearer("tampered claims", f"{hp}.{other.split('.')[1]}.{sp}")
    bearer("tampered header", f"{b64(json.dumps({**head, 'typ': 'JOSE'}).encode())}.{pp}.{sp}")
    bearer("signature of another token", f"{hp}.{pp}.{other.split('.')[2]}")
    bearer("truncated signature", f"{hp}.{pp}.{sp[:-8]}")
    raw_sig = base64.urlsafe_b64decode(sp + "=" * (-len(sp) % 4))
    bearer("signature with a byte more", f"{hp}.{pp}.{b64(raw_sig + bytes(1))}")
    bearer("zero signature", f"{hp}.{pp}.{b64(bytes(256))}")
    bearer("ES256 signature in DER form", signed(ec_s, ehead, good, "ES256-DER"))
    bearer("ES256 zero signature", f"{b64(json.dumps(ehead).encode())}.{pp}.{b64(bytes(64))}")
    eh, ep, es = signed(ec_s, ehead, good).split(".")
    bearer("ES256 signature of 63 bytes", f"{eh}.{ep}.{b64(base64.urlsafe_b64decode(es + '=' * (-len(es) % 4))[:63])}")
    bearer("RS256 signed by an unknown key", signed(tokens_jwt.Issuer.new().rsa, head, good))

    # --- broken twice: which rule answers first -------------------------------------------------
    expired = {**good, "exp": now - skew - 300}
    bearer("tampered and expired", f"{hp}.{b64(json.dumps(expired).encode())}.{sp}")
    bearer("tampered and another issuer", f"{hp}.{b64(json.dumps({**good, 'iss': 'x'}).encode())}.{sp}")
    bearer("tampered, exp 1e300", f"{hp}.{b64(json.dumps({**good, 'exp': 1e300}).encode())}.{sp}")
    bearer("tampered, no exp", f"{hp}.{b64(json.dumps({k: v for k, v in good.items() if k != 'exp'}).encode())}.{sp}")
    bearer("tampered, sub twice", f"{hp}.{b64(('{' + inner + ',' + chr(34) + 'sub' + chr(34) + ':1}').encode())}.{sp}")
    bearer("alg none and expired", tokens_jwt.forge_none(expired, rsa_s.kid))
    bearer("unknown kid and expired", signed(rsa_s, {**head, "kid": "nope"}, expired))
    bearer("crit and unknown kid", signed(rsa_s, {**head, "kid": "nope", "crit": ["x"]}, good))
    bearer("crit and exp 1e300", signed(rsa_s, {**head, "crit": ["x"]}, {**good, "exp": 1e300}))
    bearer("iss 5 and alg none", tokens_jwt.forge_none({**good, "iss": 5}, rsa_s.kid))
    bearer("expired and another issuer", signed(rsa_s, head, {**expired, "iss": "x"}))
    bearer("another issuer and another audience", signed(rsa_s, head, {**good, "iss": "x", "aud": "y"}))
    bearer("another audience, no tenant", signed(rsa_s, head, {**{k: v for k, v in good.items()
                                                                  if k not in t.required_claims}, "aud": "y"}))
    bearer("oversized and malformed", "." * (t.max_token_bytes + 1))
    add("lower-case scheme, two spaces, ES256", f"bearer  {signed(ec_s, ehead, good)}")

    # --- valid, for the record ------------------------------------------------------------------
    both("valid", good)
    both("valid, another subject", {**good, pc: "bob@example.com"})
    return out


@dataclass(frozen=True)
class CertForm:
    """A client certificate form: how it is issued (subject, URI SANs, DNS SANs)."""

    name: str
    subject: str
    sans: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()


def cert_forms(san_of: Callable[[str], str], subject_of: Callable[[str], str]) -> list[CertForm]:
    """Certificate forms against a plan with principals by SAN (``worker-a``, ``ops``) and by
    subject (``batch``): ``san_of(name)`` / ``subject_of(name)`` give theirs."""
    worker, ops, batch = san_of("worker-a"), san_of("ops"), subject_of("batch")
    revoked = "spiffe://example.org/ns/app/sa/revoked"
    return [
        CertForm("listed SAN", "CN=w", (worker,)),
        CertForm("listed SAN, subject of another principal", batch, (worker,)),
        CertForm("revoked SAN, subject of another principal", batch, (revoked,)),
        CertForm("revoked SAN, unknown subject", "CN=stranger", (revoked,)),
        CertForm("no SAN, listed subject", batch),
        CertForm("no SAN, unknown subject", "CN=stranger"),
        CertForm("DNS SAN only, listed subject", batch, (), ("batch.example.org",)),
        CertForm("two SANs (one listed), subject of another principal", batch, (worker, revoked)),
        CertForm("two listed SANs", "CN=x", (worker, ops)),
        CertForm("the same SAN twice", "CN=x", (worker, worker)),
        CertForm("SAN of another role's principal", "CN=x", (ops,)),
        CertForm("SAN in upper case", "CN=x", (worker.upper(),)),
        CertForm("SAN with a trailing slash", "CN=x", (worker + "/",)),
        CertForm("SAN with a query", "CN=x", (worker + "?x=1",)),
        CertForm("SAN prefix of a listed one", "CN=x", (worker[:-1],)),
        CertForm("SAN extended", "CN=x", (worker + "-2",)),
        CertForm("subject with attributes reordered", ",".join(reversed(batch.split(",")))),
        CertForm("subject with one attribute more", batch + ",OU=x"),
        CertForm("subject's CN only", batch.split(",")[0]),
        CertForm("subject in lower case", batch.lower()),
    ]


def issue(ca: TestCa, form: CertForm) -> object:
    """The certificate of a form (a testca Leaf)."""
    return ca.issue(form.subject, san=form.sans[0] if form.sans else "", more_sans=form.sans[1:], dns=form.dns)
