"""Which vLLM routes change a live server's state (0.28 - 0.33), whatever a policy says.

One list for the prober (never sends such routes a real request in safe mode) and
the stand-in (counts every request that would have reached such a handler).
Patterns use :mod:`scanner.patterns` syntax.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scanner import patterns

STATE_CHANGING: tuple[str, ...] = (
    "/pause", "/resume", "/sleep", "/wake_up", "/collective_rpc",
    "/update_weights", "/update_weight_version", "/init_weight_transfer_engine",
    "/start_weight_update", "/start_draft_weight_update", "/finish_weight_update",
    "/shutdown_weight_transfer_engine", "/weight_checker", "/release_kv_cache_memory",
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters", "/adapters/*",
    "/reset_*_cache", "/abort_requests", "/inference/v1/abort_requests",
    "/scale_elastic_ep", "/start_profile", "/stop_profile", "/fault_tolerance/apply",
)


# gRPC methods (vLLM's gRPC server, smg-grpc-proto's VllmEngine) that change a live server's state.
GRPC_STATE_CHANGING: tuple[str, ...] = (
    "/vllm.grpc.engine.VllmEngine/Abort", "/vllm.grpc.engine.VllmEngine/FlushCache",
    "/vllm.grpc.engine.VllmEngine/StartProfile", "/vllm.grpc.engine.VllmEngine/StopProfile",
)


def is_state_changing(path: str) -> bool:
    """Does the route template ``path`` (or gRPC method) change state when its handler runs?"""
    return path in GRPC_STATE_CHANGING or any(patterns.covers(p, path) for p in STATE_CHANGING
                                              if not path.startswith("/vllm.grpc."))


@dataclass(frozen=True)
class Param:
    """A parameter vLLM validates before a state-changing handler runs (FastAPI/pydantic)."""

    name: str
    where: Literal["query", "body"]
    type: Literal["bool", "str", "int", "enum"]
    choices: tuple[str, ...] = ()
    required: bool = False


# What vLLM 0.29.0 validates before these handlers run (read from its route signatures;
# tests/standin/test_validation_real_vllm.py checks each against the real app). The
# prober's declared-method safe probes violate one of these; the stand-in enforces them.
PRE_HANDLER_VALIDATION: dict[tuple[str, str], tuple[Param, ...]] = {
    ("POST", "/pause"): (
        Param("mode", "query", "enum", ("abort", "wait", "keep")),
        Param("wait_for_inflight_requests", "query", "bool"),
        Param("clear_cache", "query", "bool"),
    ),
    ("POST", "/reset_prefix_cache"): (
        Param("reset_running_requests", "query", "bool"),
        Param("reset_external", "query", "bool"),
    ),
    ("POST", "/v1/load_lora_adapter"): (
        Param("lora_name", "body", "str", required=True),
        Param("lora_path", "body", "str", required=True),
    ),
    ("POST", "/v1/unload_lora_adapter"): (Param("lora_name", "body", "str", required=True),),
    ("POST", "/finish_weight_update"): (Param("weight_version", "body", "str"),),
    ("POST", "/update_weight_version"): (Param("new_version", "body", "str", required=True),),
}
_BOOL_WORDS = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})


def validation_error(method: str, path: str, query: Mapping[str, str], body: bytes) -> str | None:
    """Why vLLM would reject this request before the handler, or None if it would not."""
    params = PRE_HANDLER_VALIDATION.get((method, path), ())
    doc: Any = None
    if any(p.where == "body" for p in params):
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            return "body is not valid JSON"
        if not isinstance(doc, dict):
            return "body is not a JSON object"
    for p in params:
        value = query.get(p.name) if p.where == "query" else (doc or {}).get(p.name)
        if value is None:
            if p.required:
                return f"{p.name}: field required"
            continue
        why = _type_error(p, value)
        if why:
            return f"{p.name}: {why}"
    return None


def _type_error(p: Param, value: Any) -> str | None:
    if p.type == "bool":
        return None if str(value).lower() in _BOOL_WORDS else "not a valid boolean"
    if p.type == "enum":
        return None if value in p.choices else f"not one of {', '.join(p.choices)}"
    if p.type == "int":
        return None if isinstance(value, int) and not isinstance(value, bool) else "not an integer"
    return None if isinstance(value, str) else "not a string"
