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

__all__ = ["GENERATORS", "GenerateError", "GenerateOptions", "GeneratedConfig", "Generator", "RuntimeFile",
           "get"]


@dataclass(frozen=True)
class GenerateOptions:
    """Deployment knobs that are not policy: where the files go and where the proxy keeps its own.

    The config directory (where the proxy opens the key-hash files at run time) is the
    generator's ``config_dir`` option if given (where the files will be deployed), else
    ``output_dir`` (:func:`scanner.generate.common.config_dir`).
    """

    runtime_dir: str = "/var/lib/vllm-perimeter"   # NGINX: pid and temp files (Envoy keeps none)
    access_log: str = "/dev/stdout"                # JSON lines, one per request
    error_log: str = "/dev/stderr"
    extra: Mapping[str, str] = field(default_factory=dict)  # generator-specific, documented per generator
    output_dir: str = ""   # absolute directory the files are written to (`generate -o`); "" unknown


@dataclass(frozen=True)
class GeneratedFile:
    name: str          # relative to the output directory
    content: str
    mode: int = 0o644  # secrets files (key hashes) are 0o600


@dataclass(frozen=True)
class RuntimeFile:
    """A file the proxy opens at run time by the path its config names (``generate`` lists them)."""

    path: str            # as the proxy opens it: absolute (NGINX without config_dir: relative to
                         # the directory of nginx.conf)
    generated: str = ""  # the generated file that goes there; "" for the user's own file
    holds: str = ""      # "key hashes", "vLLM's API key": a secret's file; "" for plain config
    access: str = ""     # its mode, who reads it and when


@dataclass(frozen=True)
class GeneratedConfig:
    generator: str
    files: tuple[GeneratedFile, ...]
    main: str          # the file to point the proxy at (nginx -c / envoy -c)
    runtime_files: tuple[RuntimeFile, ...] = ()


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
