"""API keys: made here, shown once, stored only as sha256; files and logs see fingerprints."""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

from scanner.errors import ConfigError, UsageError
from scanner.output import read_text, write_text
from scanner.secrets import fingerprint

__all__ = ["KEY_PREFIX", "append_principal", "fingerprint", "key_sha256", "new_key", "read_upstream_key"]

KEY_PREFIX = "vp_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def new_key() -> str:
    """A fresh API key: ``vp_`` + 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def append_principal(path: str | Path, name: str, role: str, key: str) -> None:
    """Append a principal (name, role, key hash) to a principals YAML file, keeping its comments."""
    if not _NAME.match(name):
        raise UsageError(f"principal name {name!r}: use letters, digits, '.', '_' or '-'")
    if not _NAME.match(role):
        raise UsageError(f"role {role!r}: use letters, digits, '.', '_' or '-'")
    p = Path(path)
    text = read_text(p, "principals file", UsageError) if p.exists() else ""
    if re.search(rf"^\s*-\s*name:\s*{re.escape(name)}\s*$", text, re.MULTILINE):
        raise UsageError(f"{p}: principal {name!r} already exists; pick another name or remove it")
    if not text.strip():
        text = "# Principals for vllm-perimeter: key hashes only, never keys.\nprincipals:\n"
    elif "principals:" not in text:
        raise UsageError(f"{p}: not a principals file (no 'principals:' key)")
    if not text.endswith("\n"):
        text += "\n"
    text += f"  - name: {name}\n    role: {role}\n    key_sha256: {key_sha256(key)}\n"
    write_text(p.absolute(), text, mode=0o600)   # a file named "-" too, never stdout


# vLLM's --api-key as a proxy writes it into a header: a token NGINX and Lua take as it is.
UPSTREAM_KEY = re.compile(r"^[A-Za-z0-9._~+/=:-]{1,1024}$")


def read_upstream_key(path: str) -> str:
    """vLLM's own key from the policy's ``upstream.api_key_file`` (surrounding whitespace ignored).
    Never echoed: errors name the file only."""
    key = read_text(path, "upstream.api_key_file").strip()
    if not UPSTREAM_KEY.match(key):
        raise ConfigError(f"{path}: upstream.api_key_file must hold one key (letters, digits and "
                          ". _ ~ + / = : -, at most 1024)")
    return key
