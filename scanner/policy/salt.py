"""Tenant-scoped prefix cache (``body: cache_salt: per-principal | per-audience``).

vLLM shares prefix-cache hits only among requests with one ``cache_salt`` (vLLM PR #17045, the
timing side channel of CVE-2025-46570). The perimeter writes its own salt over any client's:
hex HMAC-SHA256(secret, "principal:NAME") or (secret, "audience:NAME"). The secret lives in one
0600 file (``cache_salt_secret_file``); the generator computes each salt and writes it only into
the 0600 files it already writes (the key hashes): neither the secret nor HMAC code reach the proxy.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from scanner.errors import ConfigError
from scanner.output import read_text, write_text

_SECRET = re.compile(r"^[A-Za-z0-9._~+/=:-]{32,1024}$")


def new_secret(path: str | Path) -> None:
    """Write a fresh secret (256 random bits, URL-safe) to ``path``, mode 0600."""
    write_text(Path(path).absolute(), secrets.token_urlsafe(32) + "\n", mode=0o600)


def read_secret(path: str, what: str = "cache_salt_secret_file") -> bytes:
    """The secret of ``cache_salt_secret_file`` (or ``what``, e.g. responses_secret_file); refused
    when others may read the file. Never echoed: errors name the file only."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        hint = (" (`vllm-perimeter init DIR` makes the secrets of a new deployment)"
                if what in ("cache_salt_secret_file", "responses_secret_file") else "")
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}{hint}") from None
    if mode & 0o077:
        raise ConfigError(f"{path}: {what} is readable by others (mode {mode & 0o777:o}); chmod 600 it")
    text = read_text(path, what).strip()
    if not _SECRET.match(text):
        raise ConfigError(f"{path}: {what} must hold one line of at least 32 characters "
                          "(letters, digits and . _ ~ + / = : -); make one with "
                          "`vllm-perimeter keys salt-secret --out FILE`")
    return text.encode("utf-8")


def salt(secret: bytes, subject: str) -> str:
    """The cache_salt of ``subject`` ("principal:NAME" or "audience:NAME"): hex HMAC-SHA256."""
    return hmac.new(secret, subject.encode("utf-8"), hashlib.sha256).hexdigest()
