"""What request body a route's code validates, found in the app itself.

Standard library only, like ``_walker.py``: this file runs inside the target's Python (through
``_worker.py``). pydantic and FastAPI are used only when the target has them.

For one route, :func:`request_body` says where the body's shape comes from:

``fastapi``
    FastAPI validates the body before the handler runs: the route's ``body_field`` (one body
    parameter, or several that FastAPI embeds as the keys of one JSON object).
``handler``
    The handler takes the raw ``Request`` and validates the JSON body itself against pydantic
    ``TypeAdapter`` objects it holds in its closure (vLLM's ``/invocations``: the validators it
    tries in order, first match wins).
``none``
    No body parameter and no ``Request`` anywhere in the route's dependencies: nothing in the
    app reads the body.
``unknown``
    The handler (or a dependency) takes the raw ``Request`` and parses whatever it reads with
    its own code; or the route is not a FastAPI route (a plain Starlette endpoint, a mount).

With ``fastapi`` or ``handler`` the result carries the models' qualified class names and the
JSON Schema pydantic generates for the body (validation mode), for the caller to flatten.
"""

from __future__ import annotations

import importlib
import inspect
import typing
import warnings
from typing import Any

_MAX_CHAIN = 8  # wrapper and closure hops followed from a route's endpoint
NOTE_UNKNOWN = ("the handler takes the raw Request and parses the body it reads (if any) with "
                "its own code")


def _qualname(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


def _is_model(obj: Any) -> bool:
    """A pydantic BaseModel subclass (by duck typing: no import of pydantic needed)."""
    return isinstance(obj, type) and hasattr(obj, "model_fields") and hasattr(obj, "model_json_schema")


def models_in(annotation: Any, depth: int = 0) -> list[str]:
    """Qualified names of the pydantic models an annotation accepts at its top (Annotated,
    Union and Optional unwrapped), in order."""
    if depth > 8:
        return []
    if _is_model(annotation):
        return [_qualname(annotation)]
    out: list[str] = []
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated and args:
        return models_in(args[0], depth + 1)
    if args and (origin is typing.Union or type(annotation).__name__ == "UnionType"):
        for arg in args:
            out += [m for m in models_in(arg, depth + 1) if m not in out]
    return out


def _json_schema(annotation: Any) -> tuple[dict[str, Any] | None, str]:
    """pydantic's validation-mode JSON Schema of ``annotation``, or None and why not."""
    try:
        import pydantic
    except ImportError:
        return None, "pydantic is not installed in the target"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # defaults that are not JSON are left out, silently
            schema = pydantic.TypeAdapter(annotation).json_schema(mode="validation")
    except Exception as exc:  # reported as data: the route keeps its models, fields unknown
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"JSON schema not generated: {type(exc).__name__}: {first}"
    return schema, ""


def _takes_request(dependant: Any, depth: int = 0) -> bool:
    """Does the handler, or any dependency, take the raw Request (and so could read the body)?"""
    if depth > 16 or dependant is None:
        return False
    if getattr(dependant, "request_param_name", None):
        return True
    return any(_takes_request(d, depth + 1) for d in getattr(dependant, "dependencies", []) or [])


def _adapters_in(value: Any) -> list[Any]:
    """TypeAdapters held by a closure value: the adapter itself, or a list/tuple of adapters or
    of tuples that start with one (vLLM: ``[(TypeAdapter(Model), (get_handler, endpoint)), ...]``)."""
    if _is_adapter(value):
        return [value]
    if isinstance(value, (list, tuple)) and value:
        found = []
        for item in value:
            if _is_adapter(item):
                found.append(item)
            elif isinstance(item, tuple) and item and _is_adapter(item[0]):
                found.append(item[0])
            else:
                return []  # a mixed container: not a validator list
        return found
    return []


def _is_adapter(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "TypeAdapter" and cls.__module__.startswith("pydantic")


def closure_validators(endpoint: Any) -> list[tuple[str, list[Any]]]:
    """``(variable name, adapters)`` for each closure variable of the endpoint (or a function it
    wraps or closes over) that holds pydantic TypeAdapters."""
    found: list[tuple[str, list[Any]]] = []
    seen: set[int] = set()
    queue: list[tuple[Any, int]] = [(endpoint, 0)]
    while queue:
        fn, hops = queue.pop(0)
        if id(fn) in seen or hops > _MAX_CHAIN:
            continue
        seen.add(id(fn))
        for attr in ("__wrapped__", "func"):
            inner = getattr(fn, attr, None)
            if callable(inner):
                queue.append((inner, hops + 1))
        code = getattr(fn, "__code__", None)
        cells = getattr(fn, "__closure__", None) or ()
        for name, cell in zip(getattr(code, "co_freevars", ()), cells, strict=False):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            adapters = _adapters_in(value)
            if adapters:
                found.append((name, adapters))
            elif inspect.isfunction(value) or inspect.ismethod(value):
                queue.append((value, hops + 1))
    return found


def _same_field(a: Any, b: Any) -> bool:
    return bool(getattr(a, "name", None) == getattr(b, "name", "")
                and getattr(a, "type_", None) is getattr(b, "type_", 0))


def _body_params(route: Any) -> list[Any]:
    """The route's body parameters, those of its dependencies included (FastAPI's flat view)."""
    dependant = getattr(route, "dependant", None)
    try:
        utils = importlib.import_module("fastapi.dependencies.utils")
        return list(utils.get_flat_dependant(dependant).body_params)
    except Exception:  # another FastAPI: the route's own parameters
        return list(getattr(dependant, "body_params", []) or [])


def _from_body_field(route: Any, body_field: Any) -> dict[str, Any]:
    info = getattr(body_field, "field_info", None)
    annotation = getattr(info, "annotation", None)
    if annotation is None:
        annotation = getattr(body_field, "type_", None)
    params = _body_params(route)
    embedded = getattr(route, "_embed_body_fields", None)  # FastAPI's own decision (0.113+)
    if not isinstance(embedded, bool):
        embedded = not any(p is body_field or _same_field(p, body_field) for p in params)
    out: dict[str, Any] = {
        "source": "fastapi",
        "media_type": str(getattr(info, "media_type", None) or "application/json"),
        "models": [] if embedded else models_in(annotation),
        "note": ("FastAPI embeds the body parameters as the keys of one JSON object: "
                 + ", ".join(str(getattr(p, "alias", None) or getattr(p, "name", "?")) for p in params)
                 if embedded else ""),
    }
    if type(info).__name__ in ("Form", "File"):
        form = ("form fields: FastAPI reads them with Starlette's form parser (multipart/form-data "
                "or application/x-www-form-urlencoded)")
        out["note"] = "; ".join(n for n in (out["note"], form) if n)
    schema, why = _json_schema(annotation)
    out["schema"] = schema
    if why:
        out["note"] = "; ".join(n for n in (out["note"], why) if n)
    return out


def _from_closure(found: list[tuple[str, list[Any]]]) -> dict[str, Any]:
    names = sorted({name for name, _ in found})
    if len(names) != 1:
        return {"source": "unknown", "note": NOTE_UNKNOWN + " (TypeAdapters in several closure "
                f"variables: {', '.join(names)})"}
    adapters = [a for _, group in found for a in group]
    types = [getattr(a, "_type", None) for a in adapters]
    if any(t is None for t in types):
        return {"source": "unknown", "note": NOTE_UNKNOWN + f" (closure variable {names[0]} holds "
                "TypeAdapters whose types cannot be read)"}
    ordered: list[Any] = []
    for t in types:
        if t not in ordered:
            ordered.append(t)
    annotation: Any = ordered[0] if len(ordered) == 1 else typing.Union[tuple(ordered)]  # noqa: UP007
    schema, why = _json_schema(annotation)
    models: list[str] = []
    for t in ordered:
        models += [m for m in models_in(t) if m not in models]
    note = (f"the handler reads the raw JSON body and validates it against the TypeAdapters in its "
            f"closure variable {names[0]}, in order (first match wins)")
    return {"source": "handler", "media_type": "application/json", "models": models,
            "schema": schema, "note": "; ".join(n for n in (note, why) if n)}


def request_body(route: Any, kind: str) -> dict[str, Any] | None:
    """Where the body of an HTTP route or a mount is described (see the module docstring);
    None for a WebSocket route."""
    if kind == "websocket":
        return None
    if kind == "mount":
        return {"source": "unknown", "note": "a mounted ASGI application: it reads the request itself"}
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return {"source": "unknown", "note": "not a FastAPI route: the endpoint reads the request itself"}
    body_field = getattr(route, "body_field", None)
    if body_field is not None:
        return _from_body_field(route, body_field)
    if not _takes_request(dependant):
        return {"source": "none", "note": "no body parameter and no Request: nothing reads the body"}
    found = closure_validators(getattr(route, "endpoint", None))
    if found:
        return _from_closure(found)
    return {"source": "unknown", "note": NOTE_UNKNOWN}
