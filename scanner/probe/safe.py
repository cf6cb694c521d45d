"""Safe by default: requests that prove a state-changing route is reachable without acting.

A state-changing route (``Decision.state_changing``, or a path in
:data:`scanner.state_changing.STATE_CHANGING`) is never sent its real request unless
``--allow-state-changes``. Reachability is proved instead with a request the real vLLM
app rejects *before* the handler runs:

* a method the path does not declare: Starlette's router answers 405 without calling any
  handler (``/pause`` PATCH -> 405). Works for every route; the proxy should deny it too.
* for some routes, the declared method with input FastAPI validates before the handler:
  a query parameter of the wrong type (``/pause?mode=...``), or a body field of the wrong
  type for a route with a pydantic body (``/v1/load_lora_adapter``). The JSON stays valid,
  so a perimeter that parses bodies forwards it. vLLM answers 400 "validation error".

Handlers that take the raw request (``/sleep``, ``/resume``, ``/reset_mm_cache``,
``/collective_rpc`` ...) parse their own input, so only the wrong method is safe for them.
``tests/probe/test_safe_real_vllm.py`` sends every probe below to the real vLLM app and
asserts the validation answer, never a handler's 500.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from scanner.inventory.model import HTTP_METHODS

# The safe request body for JSON-bodied probes of routes that are *not* state-changing:
# vLLM rejects it in validation (missing fields), so no inference runs.
NEUTRAL_JSON = b"{}"
MALFORMED_JSON = b"{"
# Answers that show FastAPI/vLLM validation rejected the request before the handler.
VALIDATION_MARKERS: tuple[str, ...] = ("validation error", "Method Not Allowed")


@dataclass(frozen=True)
class SafeRequest:
    """A non-acting request: method, query suffix, body and content type."""

    method: str
    query: str = ""
    body: bytes | None = None
    content_type: str = ""
    how: str = ""                  # for the evidence: why this is safe
    upstream_status: tuple[int, ...] = (400, 405, 422)


# Declared-method probes verified against vLLM 0.29.0 (see the module docstring).
_DECLARED: dict[tuple[str, str], SafeRequest] = {
    ("POST", "/pause"): SafeRequest("POST", query="mode=__probe__",
                                    how="invalid 'mode' query value, rejected by FastAPI validation"),
    ("POST", "/reset_prefix_cache"): SafeRequest(
        "POST", query="reset_running_requests=__probe__",
        how="invalid boolean query value, rejected by FastAPI validation"),
    # Valid JSON (a JSON-checking perimeter forwards it) with a field of the wrong type:
    # pydantic rejects it before the handler runs.
    **{("POST", p): SafeRequest("POST", body=body, content_type="application/json",
                                how="a body field of the wrong type, rejected by pydantic validation")
       for p, body in (
           ("/v1/load_lora_adapter", b'{"lora_name": [], "lora_path": []}'),
           ("/v1/unload_lora_adapter", b'{"lora_name": []}'),
           ("/finish_weight_update", b'{"weight_version": []}'),
           ("/update_weight_version", b'{"new_version": []}'),
       )},
}


def declared_probe(method: str, path: str) -> SafeRequest | None:
    """A verified non-acting request with the route's own method, if one is known."""
    return _DECLARED.get((method, path))


def carrier(method: str, path: str) -> tuple[str, dict[str, object]] | None:
    """(query, JSON fields) of the verified non-acting request for ``method path``: a body
    built on these fields (plus a padding string, a capped field, ...) with this query is
    still rejected by vLLM's validation before the handler runs. None if there is none."""
    req = declared_probe(method, path)
    if req is None:
        return None
    fields = json.loads(req.body) if req.body else {}
    return req.query, dict(fields)


def wrong_method(declared: tuple[str, ...] | list[str] | set[str]) -> str:
    """A method the path does not declare (router 405, before any handler)."""
    for m in ("PATCH", "PUT", "DELETE", "GET", "POST", "OPTIONS"):
        if m not in declared:
            return m
    return "TRACE"


def safe_request(method: str, path: str, declared: tuple[str, ...] | list[str] | set[str],
                 state_changing: bool, allow_state_changes: bool) -> SafeRequest | None:
    """The request to send for ``method path``; None when it must not be sent."""
    if method not in declared or not state_changing or allow_state_changes:
        body = NEUTRAL_JSON if method in ("POST", "PUT", "PATCH") else None
        return SafeRequest(method, body=body, content_type="application/json" if body else "")
    return declared_probe(method, path)


ALL_METHODS: tuple[str, ...] = HTTP_METHODS
