"""Why the perimeter refused a request: the one vocabulary both generators write into
``X-Perimeter-Reason`` and the prober reads back as proof of a denial.

A reason header value is ``KIND`` or ``KIND:DETAIL`` (``json-cap:max_tokens``,
``forbidden-field:cache_salt``); every kind has exactly one status. A denial is proven
only when the status and the kind (and, where the case names one, the field) are the
ones the plan expects: a 429 where a 413 was expected proves nothing.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal[
    "not-allowlisted", "method-not-allowed", "missing-key", "unknown-key", "role", "network",
    "body-too-large", "headers-too-large", "json-cap", "forbidden-field", "unknown-field", "bad-json",
    "bad-request", "upgrade",
    "grpc", "rate", "concurrency", "token-budget", "media-url", "media-data", "media-items", "media-embeds",
    "envelope-sequences", "envelope-tokens", "shared-store-unavailable",
    "jwt-missing", "jwt-invalid", "jwt-expired", "jwt-not-yet-valid", "jwt-issuer", "jwt-audience",
    "jwt-claim", "jwt-role", "not-owner", "cert-missing", "cert-invalid", "cert-unknown",
]

# kind -> the status the perimeter answers with
STATUS: dict[str, int] = {
    "not-allowlisted": 404,
    "method-not-allowed": 405,
    "missing-key": 401,
    "unknown-key": 401,
    "role": 403,
    "network": 403,
    "body-too-large": 413,
    "json-cap": 400,
    "forbidden-field": 400,      # a field the route's rules reject by name
    "unknown-field": 400,        # a field they do not name, with unknown: reject
    "bad-json": 400,
    "bad-request": 400,          # a request the proxy cannot parse or will not route (encoded slash; two
                                 # Authorization headers)
    # request headers over the proxy's own limit (with bearer tokens: a 32 KiB header line on
    # NGINX, 32 KiB of headers on Envoy), answered before any route's check
    "headers-too-large": 431,
    "upgrade": 403,              # a protocol upgrade (WebSocket) on a route that is not one
    "grpc": 415,                 # gRPC (content-type application/grpc*) on the HTTP/1.1 listener
    "media-url": 400,            # a media URL the route's media rules refuse (denied, scheme, host, ...)
    "media-data": 400,           # a data: URL or base64 media over data_max_bytes
    "media-items": 400,          # more media items than max_items
    "media-embeds": 400,         # embeddings (tensors vLLM deserializes) where they are denied
    # the admitted envelope over a per-request cap (scanner/plan/envelope.py): more sequences than
    # limits.max_sequences, more tokens than limits.max_request_tokens. 400, as a json-cap: the
    # body asks for more than one request may (not its size: 413; not a throttle: 429)
    "envelope-sequences": 400,
    "envelope-tokens": 400,
    # a bearer token on an audience with ``auth: jwt`` (scanner/policy/jwt.py): none sent; one that
    # does not verify (its form, size, alg, kid or signature: ``jwt-invalid:DETAIL``); expired or not
    # yet valid (exp / nbf beyond the clock skew); another issuer; another audience: 401 (details:
    # size, format, crit, alg, kid, exp, nbf, iat, signature: scanner/plan/credential.py). A verified
    # token without a required claim value (or a principal claim the perimeter can name), or whose
    # role claim maps to no role: 403
    "jwt-missing": 401,
    "jwt-invalid": 401,
    "jwt-expired": 401,
    "jwt-not-yet-valid": 401,
    "jwt-issuer": 401,
    "jwt-audience": 401,
    "jwt-claim": 403,
    "jwt-role": 403,
    # a client certificate on a route of an ``auth: cert`` audience (scanner/plan/certs.py): none
    # presented; presented and not verified (NGINX and Envoy refuse a certificate from another CA
    # or an expired one for the whole connection before any route: the handshake fails, or NGINX
    # answers 400 itself); verified but naming no principal (its URI SAN or subject unknown: a
    # revoked principal too): 403
    "cert-missing": 401,
    "cert-invalid": 401,
    "cert-unknown": 403,
    # a stored response named by a principal it was not handed to (body: responses: owned,
    # scanner/plan/owner.py): a raw id, another principal's seal, a forged one
    "not-owner": 403,
    "rate": 429,
    "concurrency": 429,
    "token-budget": 429,         # the principal's tokens_per_minute spent (Retry-After says when)
    # the shared limiter (scanner/limiter) could not reach its store, under on_unavailable: deny
    "shared-store-unavailable": 503,
}
KINDS: tuple[str, ...] = tuple(STATUS)
# Not a refusal: the reason on the perimeter's own error that replaced an upstream 5xx (its body
# never reaches the client); the request reached the upstream.
UPSTREAM_ERROR = "upstream-error"
# Denials that depend on timing and load, not on the request: never proof of another reason.
THROTTLE: frozenset[str] = frozenset({"rate", "concurrency", "token-budget", "shared-store-unavailable"})


# The access checks, which both perimeters apply before any other check of a matched route
# (NGINX: the location's rewrite-phase checks; Envoy: route match, RBAC, then the Lua key check).
ACCESS: frozenset[str] = frozenset({"not-allowlisted", "method-not-allowed", "network", "missing-key",
                                    "unknown-key", "role", "jwt-missing", "jwt-invalid", "jwt-expired",
                                    "jwt-not-yet-valid", "jwt-issuer", "jwt-audience", "jwt-claim",
                                    "jwt-role", "cert-missing", "cert-invalid", "cert-unknown"})
# Refusals only a later check gives: the key named a principal (its role), or the body was read and
# judged (its declared size is not one: NGINX refuses that before the location's own checks).
LATER: frozenset[str] = frozenset({"role", "jwt-claim", "jwt-role",
                                   "json-cap", "forbidden-field", "unknown-field", "bad-json",
                                   "media-url", "media-data", "media-items", "media-embeds",
                                   "envelope-sequences", "envelope-tokens", "not-owner"})


def past(expected: tuple[str, ...], value: str) -> bool:
    """Did a refusal ``value`` come from a check that runs only after the access checks the
    ``expected`` reasons name had admitted the request (an unknown key refused for its role, a
    network-denied caller refused for its body)? Then those checks let it through."""
    kind, _detail = parse(value)
    wanted = {e.partition(":")[0] for e in expected}
    return kind in LATER and kind not in wanted and bool(wanted & ACCESS)


def token(kind: str, detail: str = "") -> str:
    """The header value for ``kind`` (and a field name or other detail)."""
    if kind not in STATUS:
        raise ValueError(f"unknown reason kind {kind!r}")
    return f"{kind}:{detail}" if detail else kind


def parse(value: str) -> tuple[str, str]:
    """``"json-cap:max_tokens:over-4096"`` -> ``("json-cap", "max_tokens")``; unknown -> ("", "")."""
    kind, _, rest = value.strip().partition(":")
    if kind not in STATUS:
        return "", ""
    return kind, rest.partition(":")[0]


ANY = "*"                      # any refusal but a throttle proves it


def proves(expected: str, status: int | None, value: str) -> bool:
    """Does an answer (status, reason header) prove the expected reason (``KIND[:FIELD]``, or
    ``*`` for any refusal that is not a throttle)?"""
    want_kind, _, want_detail = expected.partition(":")
    kind, detail = parse(value)
    if expected == ANY:
        return bool(kind) and kind not in THROTTLE and status == STATUS[kind]
    if kind != want_kind or status != STATUS.get(kind):
        return False
    return not want_detail or detail == want_detail
