"""Writing results: atomic files (nothing half-written on failure) or stdout."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from scanner.errors import UsageError


def write_text(path: str | Path | None, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically, or to stdout when ``path`` is None or ``-``."""
    if path is None or str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {target}: directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
