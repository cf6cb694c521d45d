"""Locate the data directories that ship with the tool (``policies/``, ``templates/``).

Installed from a wheel, ``pyproject.toml`` maps the repository's ``policies/`` and
``templates/`` into the package as ``scanner/policies`` and ``scanner/templates``.
In a source checkout (editable install, or running from the tree) they sit at the
repository root, beside the ``scanner`` package. The wheel layout wins.
"""

from __future__ import annotations

from pathlib import Path

import scanner
from scanner.errors import InternalError

PACKAGE_DIR = Path(scanner.__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent


def candidates(name: str) -> tuple[Path, ...]:
    """Where ``name`` may live, in the order they are tried."""
    return (PACKAGE_DIR / name, REPO_ROOT / name)


def data_dir(name: str) -> Path:
    """The first existing directory named ``name``; :class:`InternalError` if none exists."""
    for path in candidates(name):
        if path.is_dir():
            return path
    tried = ", ".join(str(p) for p in candidates(name))
    raise InternalError(f"data directory {name!r} not found (tried {tried}); "
                        "the installation is incomplete")


def data_file(name: str, *parts: str) -> Path:
    """A path inside the data directory ``name`` (which must exist; the file need not)."""
    return data_dir(name).joinpath(*parts)
