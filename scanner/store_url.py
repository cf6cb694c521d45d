"""The store's URL: one Redis, Redis Sentinel, or Redis Cluster (read once, here: by the limiter's
``--redis``, the policy's ``shared.redis`` and the Kubernetes bundle)::

    redis://HOST:PORT[/DB]                                 one Redis (rediss://: TLS)
    redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]  the sentinels and the master's name
    redis+cluster://HOST:PORT[,HOST:PORT...]               some nodes of a Redis Cluster

(``rediss+sentinel://``, ``rediss+cluster://``: TLS.) A user name may precede the hosts
(``user@``); a password never does (the limiter reads it from its password file)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Layout = Literal["single", "sentinel", "cluster"]
URL_FORMS = ("redis://HOST:PORT[/DB], redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB] or "
             "redis+cluster://HOST:PORT[,HOST:PORT...] (rediss...: TLS)")
SCHEMES: dict[str, tuple[Layout, bool]] = {
    "redis": ("single", False), "rediss": ("single", True),
    "redis+sentinel": ("sentinel", False), "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False), "rediss+cluster": ("cluster", True)}
DEFAULT_PORTS: dict[Layout, int] = {"single": 6379, "sentinel": 26379, "cluster": 6379}


class UrlError(ValueError):
    """A store URL that is not one of URL_FORMS (the message names no secret)."""


@dataclass(frozen=True)
class Parsed:
    """A store URL read: its layout, the addresses (one Redis, the sentinels, or cluster nodes),
    the database, the user, TLS, the Sentinel master's name."""

    layout: Layout
    hosts: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    tls: bool
    master: str = ""


def parse_url(url: str) -> Parsed:
    """``url`` read; UrlError (one line) when it is not one of URL_FORMS."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise UrlError(f"expected {URL_FORMS}")
    layout, tls = SCHEMES[scheme]
    netloc, _slash, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if at and ":" in userinfo:
        raise UrlError("no password in the URL; give the password file")
    hosts = tuple(_host_port(h, DEFAULT_PORTS[layout]) for h in hostlist.split(","))
    segments = [x for x in path.split("/") if x]
    master = segments.pop(0) if layout == "sentinel" and segments else ""
    if layout == "sentinel" and not master:
        raise UrlError("a redis+sentinel:// URL names its master: .../MASTER[/DB]")
    if len(segments) > 1 or (segments and not (segments[0].isdigit() and int(segments[0]) < 100)):
        raise UrlError("the database must be a number (0-99)")
    db = int(segments[0]) if segments else 0
    if layout == "cluster" and db:
        raise UrlError("a Redis Cluster has database 0 only")
    if layout == "single" and len(hosts) > 1:
        raise UrlError("one Redis in redis://; several addresses: redis+sentinel:// or redis+cluster://")
    return Parsed(layout, hosts, db, userinfo or None, tls, master)


def _host_port(text: str, default: int) -> tuple[str, int]:
    parts = urlsplit(f"//{text}")
    try:
        port = parts.port or default
    except ValueError:
        port = -1
    if not parts.hostname or port <= 0:
        raise UrlError(f"{text[:80]!r} is not HOST[:PORT] (the port 1-65535)")
    return parts.hostname, port
