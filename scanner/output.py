"""The user's files: read with the file named in any error, written atomically (nothing
half-written on failure) or to stdout. A file that cannot be read or written is the user's
error (exit 2), never an internal one."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from scanner.errors import ConfigError, PerimeterError, UsageError


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


def read_text(path: str | Path, what: str, error: Callable[[str], PerimeterError] = ConfigError) -> str:
    """The UTF-8 text of a file the user gave, or ``error("PATH: cannot read WHAT: why")``."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        why = exc.strerror or str(exc)
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    raise error(f"{path}: cannot read {what}: {why}") from None


def read_json(path: str | Path, what: str, error: Callable[[str], PerimeterError] = ConfigError) -> Any:
    """:func:`read_text`, parsed as JSON; a syntax error names the file and line."""
    try:
        return json.loads(read_text(path, what, error))
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None


def make_dir(path: str | Path) -> Path:
    """Create an output directory (and its parents), or raise UsageError naming it."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create directory {p}: {exc.strerror or exc}") from None
    return p
