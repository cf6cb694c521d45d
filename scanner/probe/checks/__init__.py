"""The built-in checks, registered in this order (``--check`` choices and report order):
access (matrix, bypass, spoof, mounts, sweep), limits (limits), load (rate, concurrency: zones
of routes sharing a limiter), token-budget (tokens_per_minute), media (URLs, data, embeddings),
upstream (normalise, headers), protocol (h2c, gRPC)."""

from scanner.probe.checks import access, limits, load, tokens, media, protocol, upstream  # noqa: I001

__all__ = ["access", "limits", "load", "media", "protocol", "tokens", "upstream"]
