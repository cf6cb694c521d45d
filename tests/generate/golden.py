"""Golden files of generated configs: compare, or rewrite with UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path

from scanner.generate.interface import GeneratedConfig


def assert_matches_golden(config: GeneratedConfig, directory: Path) -> None:
    update = os.environ.get("UPDATE_GOLDEN") == "1"
    for f in config.files:
        golden = directory / f.name
        if update:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(f.content, encoding="utf-8")
        assert golden.exists(), f"missing golden file {golden} (run with UPDATE_GOLDEN=1)"
        assert f.content == golden.read_text(encoding="utf-8"), f"{f.name} differs from {golden}"
