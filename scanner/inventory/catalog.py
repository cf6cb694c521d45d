"""Bundled catalogs: inventories of real vLLM releases, made by this tool.

``policies/catalog/vllm-<version>-<profile>.json`` (shipped in the wheel as
``scanner/policies/catalog``). Each one is ``inventory vllm`` run against that vLLM
release with one of the :data:`PROFILES` below, in an isolated environment so the
bytes are reproducible::

    vllm-perimeter inventory catalog build --python ~/venvs/vllm-0.29.0/bin/python \\
        --profile everything -o policies/catalog/vllm-0.29.0-everything.json

The profiles are data, defined here and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from scanner import resources
from scanner.errors import UsageError
from scanner.inventory import model, vllm_app
from scanner.inventory.model import Inventory

# Where the torch profiler would write (never written: no engine runs). Absolute, so the
# recorded serve arguments do not depend on the working directory.
PROFILER_DIR = "/tmp/vllm-perimeter-profiles"
PROFILER_CONFIG = json.dumps({"profiler": "torch", "torch_profiler_dir": PROFILER_DIR},
                             separators=(",", ":"))


@dataclass(frozen=True)
class Profile:
    """One reproducible ``inventory vllm`` invocation."""

    name: str
    summary: str
    serve_args: tuple[str, ...]
    tasks: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    # Boolean flags added only if the release's serve parser has them.
    optional_flags: tuple[str, ...] = ()
    model_config: str = "auto"

    def extraction(self, python: str) -> vllm_app.VllmExtraction:
        return vllm_app.VllmExtraction(
            python=python,
            serve_args=self.serve_args,
            tasks=self.tasks,
            env=dict(self.env),
            isolated_env=True,
            model_config=self.model_config,
            optional_flags=self.optional_flags,
        )


PROFILES: Mapping[str, Profile] = {
    "default": Profile(
        name="default",
        summary="plain `vllm serve m`: task generate, no optional surface",
        serve_args=("--model", "m"),
        tasks=("generate",),
    ),
    "everything": Profile(
        name="everything",
        summary="every optional surface on: dev mode, runtime LoRA, tokenizer info, torch "
                "profiler, fault tolerance and scale-out endpoints (where the release has "
                "them), generate + transcription + realtime + embed + classify (offline "
                "model-config stand-in)",
        serve_args=("--model", "m", "--enable-lora", "--enable-tokenizer-info-endpoint",
                    "--profiler-config", PROFILER_CONFIG),
        tasks=("generate", "transcription", "realtime", "embed", "classify"),
        env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
        # 0.33 registers the scale-out routes (render, derender, token-in-token-out) either
        # way; without --enable-scale-out they answer 403 and read no body.
        optional_flags=("--enable-fault-tolerance", "--enable-scale-out"),
        model_config="standin",
    ),
}


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    path: Path
    inventory: Inventory

    @property
    def version(self) -> str:
        if self.inventory.vllm:
            return self.inventory.vllm.version
        # a catalog made by `inventory live` (vllm-0.33.0-rust-render) has no vLLM facts
        return self.name.split("-")[1] if self.name.startswith("vllm-") else "?"

    @property
    def outside_guard(self) -> int:
        return sum(1 for r in self.inventory.routes if not r.guarded)


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(f"unknown profile {name!r} (profiles: {', '.join(PROFILES)})") from None


def catalog_dir() -> Path:
    return resources.data_dir("policies") / "catalog"


def names() -> tuple[str, ...]:
    """Bundled catalog names, oldest vLLM first."""
    return tuple(sorted((p.stem for p in catalog_dir().glob("*.json")), key=_sort_key))


def _sort_key(name: str) -> tuple[tuple[int, ...], str]:
    _, _, rest = name.partition("-")
    version, _, prof = rest.partition("-")
    numbers = tuple(int(x) if x.isdigit() else -1 for x in version.split("."))
    return numbers, prof


def load_catalog(name: str) -> Inventory:
    stem = name.removesuffix(".json")
    if stem not in names():
        raise UsageError(f"no bundled catalog {name!r} (bundled: {', '.join(names()) or 'none'})")
    return model.load(catalog_dir() / f"{stem}.json")


def entries() -> tuple[CatalogEntry, ...]:
    return tuple(CatalogEntry(n, catalog_dir() / f"{n}.json", load_catalog(n)) for n in names())


def load_ref(ref: str) -> Inventory:
    """An inventory file path, or the name of a bundled catalog."""
    path = Path(ref)
    if path.is_file():
        return model.load(path)
    if ref.removesuffix(".json") in names():
        return load_catalog(ref)
    if path.suffix == ".json" or "/" in ref:
        return model.load(path)  # a missing file: the loader says so, exit 2
    raise UsageError(f"{ref!r} is neither an inventory file nor a bundled catalog "
                     f"(bundled: {', '.join(names()) or 'none'})")


def build(python: str, profile_name: str) -> Inventory:
    """Extract the inventory of the vLLM in ``python`` for a named profile."""
    inv, _ = vllm_app.extract(profile(profile_name).extraction(python))
    return inv
