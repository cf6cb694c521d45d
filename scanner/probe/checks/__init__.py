"""The built-in checks, registered in this order (``--check`` choices and report order):
access (matrix, bypass, spoof, mounts, sweep), limits (limits), load (rate, concurrency: zones
of routes sharing a limiter), media (URLs, data, embeddings), upstream (normalise, headers),
protocol (h2c, gRPC on the HTTP listener), grpc (the gRPC listener's methods)."""

from scanner.probe.checks import access, grpc, limits, load, media, protocol, upstream

__all__ = ["access", "grpc", "limits", "load", "media", "protocol", "upstream"]
