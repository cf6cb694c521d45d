"""The wheel ships every subpackage and the data directories (a plain `pip install .` works)."""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "scanner").rglob("*.py")}
    missing = found - listed
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
    assert {"scanner.policies", "scanner.templates"} <= listed


def test_templates_and_policies_match_package_data() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    import fnmatch

    for pkg, folder in (("scanner.templates", "templates"), ("scanner.policies", "policies")):
        for path in (REPO / folder).rglob("*"):
            if path.is_file():
                rel = str(path.relative_to(REPO / folder))
                assert any(fnmatch.fnmatch(rel, g) for g in data[pkg]), f"{folder}/{rel} would not ship"
