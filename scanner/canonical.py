"""Canonical JSON and content hashes: same input, same bytes."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def dumps(obj: Any) -> str:
    """Deterministic, human-diffable JSON (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def digest(obj: Any) -> str:
    """``sha256:<hex>`` of the compact canonical JSON of ``obj``."""
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()
