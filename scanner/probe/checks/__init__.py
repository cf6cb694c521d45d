"""The built-in checks, registered in this order (``--check`` choices and report order):
access (matrix, bypass, spoof, mounts, sweep), near-miss (strings close to a given key), limits
(limits), load (rate, concurrency: zones of routes sharing a limiter), token-budget
(tokens_per_minute), media (URLs, data, embeddings), ssrf-canary (media URLs the upstream
fetches; only with --ssrf-canary), timeout (upstream timeouts at their value), upstream
(normalise, headers), protocol (h2c, gRPC on the HTTP listener), grpc (the gRPC listener's
methods), identity (bearer tokens of auth: jwt audiences), mtls (client certificates of auth:
cert audiences), ownership (stored responses owned by their principal: responses: owned), tls
(the listener's TLS versions and cipher suites)."""

from scanner.probe.checks import access, near_miss, limits, load, tokens, media, canary  # noqa: I001
from scanner.probe.checks import timeouts, protocol, upstream, grpc, identity, mtls, ownership, tls

__all__ = ["access", "canary", "grpc", "identity", "limits", "load", "media", "mtls", "near_miss",
           "ownership", "protocol", "timeouts", "tls", "tokens", "upstream"]
