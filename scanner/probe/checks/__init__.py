"""The built-in checks, registered in this order (``--check`` choices and report order):
access (matrix, bypass, spoof, mounts, sweep), limits (limits), load (rate, concurrency:
zones of routes sharing a limiter), upstream (normalise, headers)."""

from scanner.probe.checks import access, limits, load, upstream

__all__ = ["access", "limits", "load", "upstream"]
