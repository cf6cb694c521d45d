"""A stand-in for vLLM: serves an inventory's route table on loopback, no GPU, no vLLM.

Same ``--api-key`` semantics as the vLLM version the inventory came from (its
guarded prefixes after ``root_path``, OPTIONS skipped, ``{"error": "Unauthorized"}``
with 401), real 404/405 answers, and a counter of every request that would have
reached the handler of a state-changing route. Proxy CI uses it where the real app
cannot run; ``/__standin__/stats`` reports the counters and ``/__standin__/witness`` what
reached it per probe request (neither path is a vLLM route). A JSON body on vLLM's inference
routes (chat, completions, embeddings, Responses) gets an OpenAI-shaped answer as vLLM 0.29 sends
it, streams included (scanner.standin.openai_answers); every other request a small JSON naming
the route.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import threading
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from scanner.inventory.model import VLLM_GUARDED_PREFIXES, Inventory
from scanner.inventory.model import Route as InvRoute
from scanner.plan.vllm_json import loads, reads_json
from scanner.standin import openai_answers, stored
from scanner.standin._witness import LoopbackWitness
from scanner.state_changing import is_state_changing, validation_error

STATS_PATH = "/__standin__/stats"

@dataclass
class Counters:
    """Thread-safe request counters (the app runs in one uvicorn worker)."""

    requests: int = 0
    state_changes: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hit(self, method: str, path: str, changes_state: bool) -> None:
        with self.lock:
            self.requests += 1
            if changes_state:
                self.state_changes[f"{method} {path}"] += 1

    def total_state_changes(self) -> int:
        with self.lock:
            return sum(self.state_changes.values())

    def snapshot(self) -> dict[str, object]:
        with self.lock:
            return {"requests": self.requests,
                    "state_changes": sum(self.state_changes.values()),
                    "state_changing_requests": dict(sorted(self.state_changes.items()))}


class ApiKeyGuard:
    """vLLM's AuthenticationMiddleware semantics, with the inventory's guarded prefixes."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], prefixes: tuple[str, ...],
                 root_path: str = "") -> None:
        self.app, self.prefixes, self.root_path = app, prefixes, root_path
        self.hashes = [hashlib.sha256(k.encode()).digest() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = str(scope["path"]).removeprefix(self.root_path)
        if path.startswith(self.prefixes) and not self._ok(scope):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _ok(self, scope: Scope) -> bool:
        header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        return any(hmac.compare_digest(digest, h) for h in self.hashes)


RESPONSE = "/v1/responses/{response_id}"            # a stored response (scanner/standin/stored.py)
CANCEL = "/v1/responses/{response_id}/cancel"


def _endpoint(route: InvRoute, counters: Counters, stream_delay: float,  # type: ignore[no-untyped-def]
              store: stored.Store, end_delay: float = 0.0):
    changes_state = is_state_changing(route.path)
    shaped = route.kind == "http" and route.path in openai_answers.ROUTES
    kept = route.kind == "http" and route.path in (RESPONSE, CANCEL)

    async def handler(request: Request) -> Response:
        body = await request.body()
        why = validation_error(request.method, route.path, request.query_params, body)
        if why is not None:  # vLLM's validation answer: the handler never runs
            return JSONResponse({"error": {"message": f"1 validation error: {why}",
                                           "type": "BadRequestError", "code": 400}}, status_code=400)
        counters.hit(request.method, route.path, changes_state)
        rid = str(request.path_params.get("response_id", ""))
        if kept and stored.is_vllm_id(rid):
            found = store.cancel(rid) if route.path == CANCEL else store.get(rid)
            if isinstance(found, stored.Error):
                return JSONResponse(found.body, status_code=found.status)
            return JSONResponse(found)
        answer = _openai_answer(route.path, request, body, store) if shaped else None
        if isinstance(answer, stored.Error):
            return JSONResponse(answer.body, status_code=answer.status)
        if answer is not None:
            return _respond(answer, stream_delay, end_delay)
        return JSONResponse({"standin": True, "route": route.path, "method": request.method})

    return handler


def _openai_answer(path: str, request: Request, body: bytes,
                   store: stored.Store) -> openai_answers.Answer | stored.Error | None:
    """The OpenAI-shaped answer of an inference route (scanner.standin.openai_answers) to a JSON
    object vLLM would read; None for any other request (the plain answer)."""
    if request.method != "POST" or not reads_json(request.headers.get("content-type")):
        return None
    try:
        doc = loads(body)
    except (ValueError, RecursionError):
        return None
    if path == "/v1/responses" and isinstance(doc, dict):
        return store.create(doc, body)
    return openai_answers.answer(path, doc, body)


def _respond(answer: openai_answers.Answer, delay: float, end_delay: float = 0.0) -> Response:
    """A JSON answer, or a stream of its steps ``delay`` apart whose body ends ``end_delay``
    seconds after its last step (``data: [DONE]``), as a slow upstream's may."""
    if isinstance(answer, openai_answers.Json):
        return JSONResponse(answer.body)
    steps = answer.steps

    async def frames() -> AsyncIterator[str]:
        for i, step in enumerate(steps):
            if i and delay > 0:
                await asyncio.sleep(delay)
            yield "".join(step)
        if end_delay > 0:
            await asyncio.sleep(end_delay)

    return StreamingResponse(frames(), media_type="text/event-stream")


def _routes(inventory: Inventory, counters: Counters, stream_delay: float,
            end_delay: float = 0.0) -> list[BaseRoute]:
    out: list[BaseRoute] = []
    store = stored.Store()
    for r in inventory.routes:
        handler = _endpoint(r, counters, stream_delay, store, end_delay)
        if r.kind == "http":
            out.append(Route(r.path, handler, methods=list(r.methods)))
        elif r.kind == "mount":
            sub = Starlette(routes=[Route("/{rest:path}", handler,
                                          methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])])
            out.append(Mount(r.path, app=sub))
        # WebSocket routes answer the HTTP upgrade only in the real app; the stand-in
        # serves them as GET so that reachability through a proxy is visible.
        elif r.kind == "websocket":
            out.append(Route(r.path, handler, methods=["GET"]))
    return out


def build_app(inventory: Inventory, api_keys: tuple[str, ...] = (), fetch_media: bool = False,
              stream_delay: float = openai_answers.STREAM_DELAY_S,
              stream_end_delay: float = 0.0) -> tuple[ASGIApp, Counters]:
    """The stand-in app behind its upstream witness (scanner.standin._witness), which records
    every request that reaches it, vLLM's key check included, as the real app would be wrapped
    (``fetch_media``: and fetches a body's media URLs first, as vLLM does). ``stream_delay``:
    the seconds between a stream's steps (scanner.standin.openai_answers); ``stream_end_delay``:
    the seconds a stream's body stays open after its last event (``[DONE]``)."""
    app, counters = _app(inventory, api_keys, stream_delay, stream_end_delay)
    return cast(ASGIApp, LoopbackWitness(app, fetch_media=fetch_media)), counters


def _app(inventory: Inventory, api_keys: tuple[str, ...], stream_delay: float,
         end_delay: float = 0.0) -> tuple[ASGIApp, Counters]:
    counters = Counters()

    async def stats(_: Request) -> Response:
        return JSONResponse(counters.snapshot())

    async def fastapi_style(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", "Internal Server Error")
        return JSONResponse({"detail": detail}, status_code=status)

    app = Starlette(routes=[Route(STATS_PATH, stats, methods=["GET"]),
                            *_routes(inventory, counters, stream_delay, end_delay)],
                    exception_handlers={404: fastapi_style, 405: fastapi_style})
    if not api_keys:
        return app, counters
    facts = inventory.vllm
    prefixes = tuple(facts.guarded_prefixes) if facts else VLLM_GUARDED_PREFIXES
    return ApiKeyGuard(app, api_keys, prefixes, facts.root_path if facts else ""), counters
