"""Stored responses in the stand-in, as vLLM keeps them (``OpenAIServingResponses``: one
``response_store`` dictionary, no owner): ``POST /v1/responses`` with ``store`` (vLLM's default
true) keeps its response under a fresh id (``resp_`` and 16 hex digits, vLLM's ``random_uuid``);
``previous_response_id`` must name a stored one (else 404) and is echoed in the answer;
``background`` keeps it ``queued`` (never run here); ``GET /v1/responses/{response_id}``
answers the stored response, ``POST .../cancel`` cancels a queued or in-progress one (400 "Cannot
cancel a synchronous response." otherwise); an unknown id: 404 "Response with id '...' not
found." (vLLM's ErrorResponse). Whoever names an id reaches it: the perimeter's ``responses:
owned`` is what binds it to a principal.

Only ids of vLLM's shape (:data:`VLLM_ID`) are looked up: any other (the probe's filler values,
``probe-x1``) gets the stand-in's plain answer as before (the route reached, nothing stored)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scanner.standin import openai_answers as oa

LIMIT = 4096                      # the most responses kept (oldest dropped): a bounded stand-in
VLLM_ID = re.compile(r"resp_[0-9a-f]{16}")


def is_vllm_id(value: object) -> bool:
    return isinstance(value, str) and VLLM_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class Error:
    """vLLM's ErrorResponse: status and its JSON body."""

    status: int
    body: dict[str, Any]


def error(status: int, message: str, param: str) -> Error:
    return Error(status, {"error": {"message": message, "type": "invalid_request_error",
                                    "param": param, "code": status}})


def not_found(rid: str, param: str = "response_id") -> Error:
    return error(404, f"Response with id '{rid}' not found.", param)


def new_id() -> str:
    return f"resp_{secrets.randbits(64):016x}"


@dataclass
class Store:
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)

    def create(self, body: Mapping[str, Any], raw: bytes) -> oa.Answer | Error | None:
        """The answer to ``POST /v1/responses`` (None: a body the stand-in does not shape)."""
        prev = body.get("previous_response_id")
        if is_vllm_id(prev) and prev not in self.responses:
            return not_found(str(prev), "previous_response_id")
        prev = prev if is_vllm_id(prev) else None
        store = oa.vllm_bool(body.get("store", True))
        background = oa.vllm_bool(body.get("background", False))
        rid = new_id()
        got = oa.responses(body, raw, rid=rid, previous=prev)
        if got is None or not store:
            return got
        final = got.body if isinstance(got, oa.Json) else got.final
        if final is None:
            return got
        if background:
            final = {**final, "status": "queued", "background": True, "output": [], "usage": None}
            got = oa.Json(final)
        self._keep(rid, final)
        return got

    def get(self, rid: str) -> dict[str, Any] | Error:
        found = self.responses.get(rid)
        return found if found is not None else not_found(rid)

    def cancel(self, rid: str) -> dict[str, Any] | Error:
        found = self.responses.get(rid)
        if found is None:
            return not_found(rid)
        if found.get("status") not in ("queued", "in_progress"):
            return error(400, "Cannot cancel a synchronous response.", "response_id")
        found = {**found, "status": "cancelled"}
        self.responses[rid] = found
        return found

    def _keep(self, rid: str, response: dict[str, Any]) -> None:
        if len(self.responses) >= LIMIT:
            self.responses.pop(next(iter(self.responses)))
        self.responses[rid] = response

