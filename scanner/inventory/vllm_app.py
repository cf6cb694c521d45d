"""Inventory of the real vLLM app, built in vLLM's own Python with no GPU and no engine."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scanner import secrets
from scanner.inventory._runner import run_worker
from scanner.inventory.model import (
    Inventory,
    NestedField,
    RequestBody,
    RequestField,
    Route,
    Source,
    VllmFacts,
    is_guarded,
)
from scanner.inventory.request_fields import MAX_DEPTH, FlatField, flatten

MODEL_CONFIG_CHOICES = ("auto", "none", "standin", "local")
_OWN_PREFIX = "VLLM_PERIMETER_"
_ISOLATED_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HF_HOME")


@dataclass(frozen=True)
class VllmTimings:
    import_s: float
    build_s: float


@dataclass(frozen=True)
class VllmExtraction:
    """What to build: the Python that has vLLM, ``vllm serve`` arguments, tasks and env."""

    python: str = sys.executable
    serve_args: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ("generate",)
    env: Mapping[str, str] = field(default_factory=dict)
    isolated_env: bool = False
    model_config: str = "auto"
    allow_unsupported: bool = False
    timeout: float = 300.0
    # Flags appended only when this vLLM's serve parser knows them (e.g. a flag added in 0.29).
    optional_flags: tuple[str, ...] = ()

    def effective_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        base = os.environ if base is None else base
        keep = _ISOLATED_KEEP if self.isolated_env else tuple(base)
        env = {k: v for k, v in base.items() if k in keep}
        env.update(self.env)
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no GPU needed to build the app
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        return env

    def secret_values(self, env: Mapping[str, str]) -> tuple[str, ...]:
        hidden = set()
        redacted = secrets.redact_args(self.serve_args)
        for raw, shown in zip(self.serve_args, redacted, strict=True):
            if raw != shown:
                hidden.add(raw.partition("=")[2] if "=" in raw and raw.startswith("--") else raw)
        hidden.update(v for k, v in env.items() if secrets.is_secret_env(k) and v)
        return tuple(sorted(h for h in hidden if len(h) >= 4))

    def inventory(self) -> Inventory:
        """The routes of the app vLLM's ``build_app()`` builds for these serve arguments."""
        return extract(self)[0]


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The ``VLLM_*`` variables that shape the app, secrets redacted."""
    return secrets.redact_env(
        {k: v for k, v in env.items() if k.startswith("VLLM_") and not k.startswith(_OWN_PREFIX)}
    )


def worker_request(spec: VllmExtraction, mode: str = "vllm", **extra: Any) -> dict[str, Any]:
    """The worker request for ``spec`` (mode ``vllm`` extracts, ``serve`` serves the app)."""
    return {
        "mode": mode,
        "serve_args": list(spec.serve_args),
        "tasks": list(spec.tasks),
        "model_config": spec.model_config,
        "allow_unsupported": spec.allow_unsupported,
        "optional_flags": list(spec.optional_flags),
        **extra,
    }


def extract(spec: VllmExtraction) -> tuple[Inventory, VllmTimings]:
    env = spec.effective_env()
    request = worker_request(spec)
    data = run_worker(spec.python, request, env, secrets=spec.secret_values(env),
                      timeout=spec.timeout)
    return _inventory(spec, env, data), VllmTimings(**data["timings"])


def _inventory(spec: VllmExtraction, env: Mapping[str, str], data: Mapping[str, Any]) -> Inventory:
    prefixes = tuple(data["guarded_prefixes"])
    root_path = str(data.get("root_path", ""))
    facts = VllmFacts(
        version=str(data["version"]),
        serve_args=tuple(secrets.redact_args(data.get("serve_args", spec.serve_args))),
        env=recorded_env(env),
        tasks=tuple(data["tasks"]),
        model_config=str(data["model_config"]),
        plugins=tuple(data["plugins"]),
        guarded_prefixes=prefixes,
        root_path=root_path,
        api_key_configured=bool(data["api_key_configured"]),
    )
    routes = [route_from_raw(r, prefixes, root_path) for r in data["routes"]]
    return Inventory(
        source=Source(kind="vllm", target=f"vllm=={facts.version}"),
        routes=tuple(routes),
        vllm=facts,
        middleware=tuple(data["middleware"]),
    )


def route_from_raw(raw: Mapping[str, Any], prefixes: Sequence[str], root_path: str = "") -> Route:
    return Route(
        path=str(raw["path"]),
        methods=tuple(sorted(raw["methods"])),
        kind=raw["kind"],
        endpoint=str(raw["endpoint"]),
        guarded=is_guarded(str(raw["path"]), prefixes, root_path),
        origin=str(raw["origin"]),
        request=body_from_raw(raw["request"]) if raw.get("request") else None,
    )


_SOURCES = ("fastapi", "handler", "none", "unknown")


def body_from_raw(raw: Mapping[str, Any], max_depth: int = MAX_DEPTH) -> RequestBody:
    """The worker's description of a body (``_bodies.request_body``), its JSON Schema flattened."""
    source = str(raw.get("source", "unknown"))
    body = RequestBody(
        source=source if source in _SOURCES else "unknown",  # type: ignore[arg-type]
        media_type=str(raw.get("media_type", "")),
        models=tuple(str(m) for m in raw.get("models", ())),
        note=str(raw.get("note", "")),
    )
    schema = raw.get("schema")
    if not isinstance(schema, Mapping):
        return body
    flat = flatten(schema, max_depth)
    tops: list[RequestField] = []
    nested: list[list[NestedField]] = []
    for f in flat.fields:
        if f.depth == 1:
            tops.append(RequestField(f.path, f.types, f.required, f.default, f.enum, f.truncated))
            nested.append([])
        elif tops:
            nested[-1].append(_nested(f))
    fields = tuple(replace(t, nested=tuple(n)) for t, n in zip(tops, nested, strict=True))
    return replace(body, types=flat.types, extra=flat.extra, fields=fields)


def _nested(f: FlatField) -> NestedField:
    return NestedField(f.path, f.types, f.required, f.default, f.enum, f.truncated)
