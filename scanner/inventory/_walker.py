"""Walk an ASGI app's route table into plain dicts.

Standard library only: this file also runs inside vLLM's own Python (through
``_worker.py``), where vllm-perimeter is not installed. Starlette classes are
recognised by duck typing so that any Starlette/FastAPI version works.
"""

from __future__ import annotations

from typing import Any


def _qualname(obj: Any) -> str:
    target = obj
    for attr in ("__wrapped__", "func"):  # functools.wraps / partial
        while hasattr(target, attr) and callable(getattr(target, attr)):
            target = getattr(target, attr)
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{name}"


def walk_routes(routes: Any, prefix: str = "", origin: str = "app.routes") -> list[dict[str, Any]]:
    """One dict per route: path, methods, kind, endpoint, origin."""
    out: list[dict[str, Any]] = []
    for route in routes:
        cls = type(route).__name__
        path = prefix + (getattr(route, "path", "") or "")
        if cls == "Mount" or (hasattr(route, "routes") and hasattr(route, "app") and cls != "Host"):
            sub = getattr(route, "app", None)
            sub_routes = getattr(route, "routes", None) or []
            if sub_routes:
                out.extend(walk_routes(sub_routes, prefix=path, origin=f"mount:{path or '/'}"))
            else:
                out.append({"path": path or "/", "methods": ["*"], "kind": "mount",
                            "endpoint": _qualname(sub), "origin": origin})
            continue
        if cls == "Host":
            out.extend(walk_routes(getattr(route, "routes", []), prefix=prefix,
                                   origin=f"host:{getattr(route, 'host', '')}"))
            continue
        if cls in ("WebSocketRoute", "APIWebSocketRoute") or (
            "WebSocket" in cls and not hasattr(route, "methods")
        ):
            out.append({"path": path, "methods": ["GET"], "kind": "websocket",
                        "endpoint": _qualname(getattr(route, "endpoint", route)), "origin": origin})
            continue
        methods = getattr(route, "methods", None)
        out.append({
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
