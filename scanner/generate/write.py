"""Write a generated config to a directory: every file or none (atomic per file, temp first)."""

from __future__ import annotations

from pathlib import Path

from scanner.generate.interface import GeneratedConfig
from scanner.output import write_text


def write_config(config: GeneratedConfig, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for f in config.files:
        target = out / f.name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, f.content, mode=f.mode)
        written.append(target)
    return written
