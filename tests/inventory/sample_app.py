"""A small Starlette app for ``inventory asgi`` tests (imported only by the worker subprocess)."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route, Router, WebSocketRoute
from starlette.websockets import WebSocket


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def chat(request: Request) -> PlainTextResponse:
    return PlainTextResponse("chat")


async def item(request: Request) -> PlainTextResponse:
    return PlainTextResponse("item")


async def stream(ws: WebSocket) -> None:
    await ws.accept()
    await ws.close()


async def raw_asgi(scope: Any, receive: Any, send: Any) -> None:
    await PlainTextResponse("raw")(scope, receive, send)


def create_app() -> Starlette:
    """Zero-argument factory (like ``uvicorn --factory``)."""
    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            WebSocketRoute("/v1/realtime", stream),
            Mount("/admin", routes=[Route("/items/{item_id}", item, methods=["GET", "DELETE"])]),
            Mount("/metrics", app=raw_asgi),
        ],
        middleware=[Middleware(GZipMiddleware)],
    )


app = create_app()
wrapped = GZipMiddleware(app)  # an app behind plain ASGI middleware: unwrapped through .app
router = Router(routes=[Route("/only", health)])
not_an_app = 42


def needs_argument(name: str) -> Starlette:
    return create_app()
