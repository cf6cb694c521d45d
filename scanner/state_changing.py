"""Which vLLM routes change a live server's state (0.28 - 0.33), whatever a policy says.

One list for the prober (never sends such routes a real request in safe mode) and
the stand-in (counts every request that would have reached such a handler).
Patterns use :mod:`scanner.patterns` syntax.
"""

from __future__ import annotations

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


def is_state_changing(path: str) -> bool:
    """Does the route template ``path`` change state when its handler runs?"""
    return any(patterns.covers(p, path) for p in STATE_CHANGING)
