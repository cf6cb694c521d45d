"""The built-in checks, registered in this order (``--check`` choices and report order):
access (matrix, bypass, spoof, mounts, sweep), limits (limits), load (rate, concurrency: zones
of routes sharing a limiter), token-budget (tokens_per_minute), media (URLs, data, embeddings),
ssrf-canary (media URLs the upstream fetches; only with --ssrf-canary), upstream (normalise,
headers), protocol (h2c, gRPC on the HTTP listener), grpc (the gRPC listener's methods)."""

from scanner.probe.checks import access, limits, load, tokens, media, canary, protocol, upstream, grpc  # noqa: I001

__all__ = ["access", "canary", "grpc", "limits", "load", "media", "protocol", "tokens", "upstream"]
