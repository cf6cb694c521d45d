"""Redaction and fingerprints: no secret ever leaves the process in clear."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "<redacted>"

# Serve flags whose value is a secret (the value after the flag, or after '=').
SECRET_FLAGS = frozenset({"--api-key", "--ssl-keyfile-password", "--hf-token"})
_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)


def fingerprint(secret: str) -> str:
    """A short, stable, non-reversible name for a secret: ``sha256:`` + 12 hex chars."""
    return "sha256:" + hashlib.sha256(secret.encode("utf-8")).hexdigest()[:12]


def is_secret_env(name: str) -> bool:
    return bool(_SECRET_ENV.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_env(k) and v else v) for k, v in sorted(env.items())}


def redact_args(args: Iterable[str]) -> list[str]:
    """Replace the value of every secret flag, in ``--flag v`` and ``--flag=v`` forms."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, sep, _ = arg.partition("=")
        if _is_secret_flag(flag):
            if sep:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def _is_secret_flag(flag: str) -> bool:
    normalised = flag.replace("_", "-").lower()
    return normalised in SECRET_FLAGS or bool(_SECRET_FLAG.match(normalised))


# A flag whose last word names a secret: --api-key, --hf-token, --ssl-keyfile-password ...
_SECRET_FLAG = re.compile(r"^--([a-z0-9-]+-)?(key|api-key|token|password|passwd|secret|credentials?)$")


def redact_url(url: str) -> str:
    """``url`` without userinfo, and with the values of secret-looking query parameters hidden."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    query = urlencode(
        [(k, REDACTED if is_secret_env(k) else v) for k, v in parse_qsl(parts.query, True)],
        safe="<>",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> tuple[str, ...]:
    """The secret parts of ``url``: userinfo, and values of secret-looking query parameters."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    found = [p for p in userinfo.split(":") if p]
    found += [v for k, v in parse_qsl(parts.query, True) if is_secret_env(k) and v]
    return tuple(sorted(set(found), key=len, reverse=True))


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret value replaced by ``<redacted>``."""
    for value in sorted(values, key=len, reverse=True):
        if value:
            text = text.replace(value, REDACTED)
    return text
