"""Redis key names: one key per zone and key (principal or client address), namespaced ``vp:``.

``vp:{<key>}|<zone>:b`` is a token bucket (rate and token zones), ``vp:{<key>}|<zone>:s`` the
slots of a concurrency zone. The braces are a Redis Cluster hash tag: everything one key (a
principal or a client address) owns in every zone lives in one slot, so the one script that
reserves a request's zones together (scripts.ACQUIRE) never crosses slots. Zone names and keys
hold no braces (scanner.limiter.config.NAME), so the tag is exactly ``<key>``.
"""

from __future__ import annotations

from scanner.errors import LimiterCallError
from scanner.limiter.config import KEY, NAME

PREFIX = "vp"


def checked(kind: str, value: str) -> str:
    """``value`` when it is a valid zone name or key; LimiterCallError otherwise."""
    most = 300 if kind == "key" else 200
    if not (KEY if kind == "key" else NAME).match(value):
        raise LimiterCallError(f"bad {kind}: 1-{most} printable ASCII characters, no space or braces")
    return value


def bucket(zone: str, key: str) -> str:
    return f"{PREFIX}:{{{key}}}|{zone}:b"


def slots(zone: str, key: str) -> str:
    return f"{PREFIX}:{{{key}}}|{zone}:s"
