"""The zones as an envoyproxy/ratelimit configuration (its ``config.yaml``: ``domain`` and nested
``descriptors``), for users who run that service on their own Redis with the descriptors of
scanner.limiter.rls: ``(zone, NAME)`` then ``(principal, P)`` or ``(remote_address, IP)``.

What it can express: a fixed window of ``requests_per_unit`` per ``second`` or ``minute`` per key,
charged ``hits_addend``. So a rate zone becomes ``rps`` per second (``round(rps * 60)`` per minute
below 1 r/s or for a fractional rate) with no burst (a window admits its whole count at once,
and twice that across a window's edge); a token zone ``per_minute`` per minute charged with the
request's cost, without settlement (refunds are not sent); a concurrency zone has no counterpart
and is left out (this project's service keeps slots). The mapping is lossy by design: the
project's own service (``vllm-perimeter limiter``) is the one the probe proves.
"""

from __future__ import annotations

from typing import Any

from scanner.limiter.config import LimiterConfig, per_unit
from scanner.limiter.rls import KEY_ENTRIES
from scanner.plan.zones import Zone


def rate_limit(zone: Zone) -> dict[str, Any] | None:
    """``{unit, requests_per_unit}`` for ``zone``; None for a concurrency zone."""
    unit = per_unit(zone)
    return None if unit is None else {"unit": unit[1], "requests_per_unit": unit[0]}


def config(limiter: LimiterConfig) -> dict[str, Any]:
    """The envoyproxy/ratelimit configuration of ``limiter``'s rate and token zones (sorted)."""
    descriptors = []
    for name, zone in sorted(limiter.zones.items()):
        limit = rate_limit(zone)
        if limit is None:
            continue
        descriptors.append({"key": "zone", "value": name,
                            "descriptors": [{"key": k, "rate_limit": dict(limit)} for k in KEY_ENTRIES]})
    return {"domain": limiter.domain, "descriptors": descriptors}
