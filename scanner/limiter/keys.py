"""Redis key names: one key per zone and key (principal or client address), namespaced ``vp:``.

``vp:{<key>}|<zone>:b`` is a token bucket (rate and token zones), ``vp:{<key>}|<zone>:s`` the
slots of a concurrency zone. The braces are a Redis Cluster hash tag: everything one key (a
principal or a client address) owns in every zone lives in one slot, so the one script that
reserves a request's zones together (scripts.ACQUIRE) never crosses slots. Zone names and keys
hold no braces (scanner.limiter.config.NAME), so the tag is exactly ``<key>``.

The leases' facts (scanner.limiter.store.renew), so that any limiter can carry them on:
``vp:{owner:<owner>}|leases`` is the index of one owner's slots (a hash: ``<slots key> <slot id>``
-> until, Redis ms: the zone's slot_ttl_s after admission), its own hash tag (one key per
command, cluster-safe); ``vp:owners`` the registry of the owners some limiter vouches for (a
hash: owner -> Redis ms of the last vouch). Owners without a name (njs 0.7, hand-made calls)
share the index of ANONYMOUS.
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


# the registry of lease owners a limiter vouches for (scanner.limiter.store.renew)
OWNERS = f"{PREFIX}:owners"
# the owner of slots whose caller names none
ANONYMOUS = "-"


def leases(owner: str) -> str:
    """The index of ``owner``'s slots (ANONYMOUS for none named)."""
    return f"{PREFIX}:{{owner:{owner or ANONYMOUS}}}|leases"
