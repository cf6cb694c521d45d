"""What each proxy can verify of a plan's bearer tokens (``auth: jwt``), decided once.

Measured on this machine (``/tmp/team/identity-facts.md``): njs WebCrypto verifies RS256
(RSASSA-PKCS1-v1_5), PS256 (RSA-PSS, salt 32) and ES256 (ECDSA P-256) on njs 0.9.9 and 0.7.9,
0.7 importing SPKI keys only (so the generator writes SPKI) and only in promise chains (``await``
on crypto.subtle crashes 0.7's worker: the njs code uses ``.then`` on both); neither has Ed25519.
Envoy's ``jwt_authn`` verifies all four. The proxies count rates, concurrency and token budgets
per principal; where a token's principal (known only at request time) cannot be counted, the
plan is refused for that proxy (exit 2), never rendered without the limit.

One principal namespace (docs/identity.md): a token principal is named
``jwt:<issuer id>:<claim value>``, the issuer id being 8 hex digits of SHA-256 over the issuer
and the principal claim's name (:func:`prefix`), decided here once and handed to both
generators; njs and Lua only prepend the prefix of the token's (checked) issuer. Key and
certificate principal names never hold ``:`` (the policy loader's rule), so no token principal
equals one, and two issuers (or two principal claims of one issuer) never share a prefix (the
plan refuses a clash of ids: :func:`clash`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from scanner.plan.model import Decision, Plan
from scanner.policy.jwt import JwtAuth

NJS_ALGORITHMS: tuple[str, ...] = ("RS256", "PS256", "ES256")
ENVOY_ALGORITHMS: tuple[str, ...] = ("RS256", "PS256", "ES256", "EdDSA")
KIND = "jwt"                 # a token principal's kind, the first part of its name
ISSUER_ID_CHARS = 8          # hex digits of the issuer id
CLAIM_MAX = 256              # a principal claim value (scanner.policy.jwt.CLAIM_VALUE)
# the longest token principal: "jwt:" + issuer id + ":" + claim value
PRINCIPAL_MAX = len(KIND) + 1 + ISSUER_ID_CHARS + 1 + CLAIM_MAX


def prefix(issuer: str, claim: str) -> str:
    """What a token principal's name starts with for tokens of ``issuer`` named by its ``claim``:
    ``jwt:`` + 8 hex digits of SHA-256(issuer + newline + claim) + ``:`` (stable across policy
    edits: seals and buckets survive adding an issuer)."""
    digest = hashlib.sha256(f"{issuer}\n{claim}".encode()).hexdigest()[:ISSUER_ID_CHARS]
    return f"{KIND}:{digest}:"


def prefixes(t: JwtAuth) -> tuple[str, ...]:
    """The prefix of each of ``t.issuers``, in their order."""
    return tuple(prefix(i, t.principal_claim) for i in t.issuers)


def principal(t: JwtAuth, issuer: str, value: str) -> str:
    """The principal a verified token of ``issuer`` whose principal claim is ``value`` names."""
    return prefix(issuer, t.principal_claim) + value


def clash(auths: Iterable[JwtAuth]) -> str:
    """Two (issuer, principal claim) pairs with one issuer id: one line ("" none)."""
    seen: dict[str, tuple[str, str]] = {}
    for t in auths:
        for issuer in t.issuers:
            p, pair = prefix(issuer, t.principal_claim), (issuer, t.principal_claim)
            if seen.setdefault(p, pair) != pair:
                return (f"issuers {seen[p][0]!r} ({seen[p][1]}) and {issuer!r} ({t.principal_claim}) share "
                        f"the token principal prefix {p!r}: rename one issuer's principal claim")
    return ""


def verified(d: Decision, proxy: str) -> tuple[str, ...]:
    """The algorithms ``proxy`` ("nginx" / "envoy") accepts on ``d``: the policy's allowlist
    within what the proxy can verify and a key of the JWKS verifies."""
    if d.jwt is None:
        return ()
    can = NJS_ALGORITHMS if proxy == "nginx" else ENVOY_ALGORITHMS
    keyed = {a for k in d.jwt.keys for a in k.algorithms}
    return tuple(a for a in d.jwt.algorithms if a in can and a in keyed)


def refusal(plan: Plan, proxy: str) -> str:
    """Why ``proxy`` cannot enforce the plan's token rules ("" it can): one line."""
    for d in plan.allowed:
        if d.jwt is None:
            continue
        where = f"{d.method} {d.path} (audience {d.audience!r}, auth: jwt)"
        keyed = {a for k in d.jwt.keys for a in k.algorithms}
        lost = [a for a in d.jwt.algorithms if a in keyed and a not in verified(d, proxy)]
        if lost:
            return (f"{where}: the policy allows {', '.join(lost)} and its JWKS has such keys, but njs "
                    "WebCrypto (0.7, 0.9) verifies only RS256, PS256 and ES256 (no Ed25519): allow "
                    "those only, or use Envoy")
        if proxy == "envoy" and d.limits.concurrency is not None:
            return (f"{where}: limits.concurrency per principal: Envoy holds a cluster per principal the "
                    "plan knows (API keys), none per token subject")
    if plan.grpc is not None:
        for d in plan.grpc.allowed:
            if d.auth == "jwt":
                return (f"gRPC {d.path} (audience {d.audience!r}): auth: jwt is not supported on the gRPC "
                        "listener")
    return ""
