"""The built-in checks, registered in this order (``--check`` choices and report order):
access (matrix, bypass, spoof, mounts, sweep), limits (limits, rate, concurrency),
upstream (normalise, headers)."""

from scanner.probe.checks import access, limits, upstream

__all__ = ["access", "limits", "upstream"]
