"""The built-in checks, registered in this order (``--check`` choices and report order):
access (matrix, bypass, spoof, mounts, sweep), limits (limits), load (rate, concurrency: zones
of routes sharing a limiter), token-budget (tokens_per_minute), media (URLs, data, embeddings),
upstream (normalise, headers), protocol (h2c, gRPC on the HTTP listener), grpc (the gRPC
listener's methods)."""

from scanner.probe.checks import access, limits, load, tokens, media, protocol, upstream, grpc  # noqa: I001

__all__ = ["access", "grpc", "limits", "load", "media", "protocol", "tokens", "upstream"]
