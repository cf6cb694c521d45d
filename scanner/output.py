"""Writing results: atomic files (nothing half-written on failure) or stdout."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from scanner.errors import UsageError


def text_console(file: object, width: int) -> Console:
    """A plain-text console for reports: data is shown as it is (no markup, no emoji codes:
    a zone ``inference:key:10/20`` must not turn into a key emoji, a path ``[x]`` into a style)."""
    return Console(file=file, width=width, force_terminal=False, color_system=None,  # type: ignore[arg-type]
                   markup=False, emoji=False, highlight=False)


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
