"""Write a generated config to a directory: every file or none (atomic per file, temp first)."""

from __future__ import annotations

from pathlib import Path

from scanner.generate.interface import GeneratedConfig
from scanner.output import make_dir, write_text


def write_config(config: GeneratedConfig, out_dir: str | Path) -> list[Path]:
    out = make_dir(out_dir)
    written = []
    for f in config.files:
        target = out / f.name
        make_dir(target.parent)
        write_text(target, f.content, mode=f.mode)
        written.append(target)
    return written
