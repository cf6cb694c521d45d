"""Walk an ASGI app's route table into plain dicts.

Standard library only: this file also runs inside vLLM's own Python (through
``_worker.py``), where vllm-perimeter is not installed. Starlette classes are
recognised by duck typing so that any Starlette/FastAPI version works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# (route object, kind) -> what describes its request body, or None (see _bodies.py)
Describe = Callable[[Any, str], dict[str, Any] | None]


def _qualname(obj: Any) -> str:
    target = obj
    for attr in ("__wrapped__", "func"):  # functools.wraps / partial
        while hasattr(target, attr) and callable(getattr(target, attr)):
            target = getattr(target, attr)
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{name}"


def walk_routes(routes: Any, prefix: str = "", origin: str = "app.routes",
                describe: Describe | None = None) -> list[dict[str, Any]]:
    """One dict per route: path, methods, kind, endpoint, origin; plus ``request`` when
    ``describe`` says what the route's body is (see ``_bodies.py``)."""
    out: list[dict[str, Any]] = []

    def add(route: Any, row: dict[str, Any]) -> None:
        body = describe(route, row["kind"]) if describe is not None else None
        if body is not None:
            row["request"] = body
        out.append(row)

    for route in routes:
        cls = type(route).__name__
        path = prefix + (getattr(route, "path", "") or "")
        if cls == "Mount" or (hasattr(route, "routes") and hasattr(route, "app") and cls != "Host"):
            sub = getattr(route, "app", None)
            sub_routes = getattr(route, "routes", None) or []
            if sub_routes:
                out.extend(walk_routes(sub_routes, prefix=path, origin=f"mount:{path or '/'}",
                                       describe=describe))
            else:
                add(route, {"path": path or "/", "methods": ["*"], "kind": "mount",
                            "endpoint": _qualname(sub), "origin": origin})
            continue
        if cls == "Host":
            out.extend(walk_routes(getattr(route, "routes", []), prefix=prefix,
                                   origin=f"host:{getattr(route, 'host', '')}", describe=describe))
            continue
        if cls in ("WebSocketRoute", "APIWebSocketRoute") or (
            "WebSocket" in cls and not hasattr(route, "methods")
        ):
            add(route, {"path": path, "methods": ["GET"], "kind": "websocket",
                        "endpoint": _qualname(getattr(route, "endpoint", route)), "origin": origin})
            continue
        methods = getattr(route, "methods", None)
        add(route, {
            "path": path,
            "methods": sorted(methods) if methods else ["*"],
            "kind": "http" if methods else "mount",
            "endpoint": _qualname(getattr(route, "endpoint", route)),
            "origin": origin,
        })
    return out


def middleware_names(app: Any) -> list[str]:
    """Class names of ``app.user_middleware``, outermost first. Never their options (they hold keys)."""
    names: list[str] = []
    for mw in getattr(app, "user_middleware", []) or []:
        cls = getattr(mw, "cls", None) or mw
        names.append(f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}")
    return names


def find_routes(app: Any) -> Any:
    """The route list of a Starlette/FastAPI app (or a Router), else None."""
    routes = getattr(app, "routes", None)
    if routes is None and hasattr(app, "router"):
        routes = getattr(app.router, "routes", None)
    return routes
