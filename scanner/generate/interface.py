"""The generate seam: a :class:`~scanner.plan.model.Plan` in, proxy config files out.

Generators render only from the plan (the single truth the prober also reads),
through Jinja templates in ``templates/``. Output is deterministic: the same
plan and options give the same bytes. Base error: :class:`GenerateError`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from scanner.errors import GenerateError
from scanner.plan.model import Plan

__all__ = ["GENERATORS", "GenerateError", "GenerateOptions", "GeneratedConfig", "Generator", "get"]


@dataclass(frozen=True)
class GenerateOptions:
    """Deployment knobs that are not policy: where the proxy keeps its runtime files."""

    runtime_dir: str = "/var/lib/vllm-perimeter"   # pid, temp files, secrets file
    access_log: str = "/dev/stdout"                # JSON lines, one per request
    error_log: str = "/dev/stderr"
    extra: Mapping[str, str] = field(default_factory=dict)  # generator-specific, documented per generator


@dataclass(frozen=True)
class GeneratedFile:
    name: str          # relative to the output directory
    content: str
    mode: int = 0o644  # secrets files (key hashes) are 0o600


@dataclass(frozen=True)
class GeneratedConfig:
    generator: str
    files: tuple[GeneratedFile, ...]
    main: str          # the file to point the proxy at (nginx -c / envoy -c)


class Generator(Protocol):
    name: str

    def render(self, plan: Plan, options: GenerateOptions) -> GeneratedConfig: ...


# name -> "module:class", imported only when asked for.
GENERATORS: dict[str, str] = {
    "nginx": "scanner.generate.nginx:NginxGenerator",
    "envoy": "scanner.generate.envoy:EnvoyGenerator",
}


def get(name: str) -> Generator:
    target = GENERATORS.get(name)
    if target is None:
        raise GenerateError(f"unknown generator {name!r} (known: {', '.join(sorted(GENERATORS))})")
    module_name, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    generator: Generator = cls()
    return generator
