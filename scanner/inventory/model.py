"""The inventory document: which routes an app serves, and where that knowledge came from.

Format (``schema_version`` 1), as JSON::

    {
      "schema_version": 1,
      "source": {"kind": "vllm" | "asgi" | "openapi" | "sweep", "target": "..."},
      "vllm": {                              # null unless the source knows vLLM facts
        "version": "0.29.0",
        "serve_args": ["--model", "m", "--api-key", "<redacted>"],
        "env": {"VLLM_SERVER_DEV_MODE": "1"},  # VLLM_* only, secrets redacted
        "tasks": ["generate"],
        "model_config": "none" | "standin" | "local",
        "plugins": ["group:name"],
        "guarded_prefixes": ["/v1", "/v2", "/inference", "/cohere"],
        "root_path": "",
        "api_key_configured": false
      },
      "middleware": ["module.Class", ...],    # outermost first
      "routes": [
        {"path": "/v1/models", "methods": ["GET", "HEAD"], "kind": "http",
         "endpoint": "vllm.entrypoints....show_available_models",
         "guarded": true, "origin": "app.routes"}
      ],
      "content_hash": "sha256:..."           # of everything above except itself
    }

``methods`` is ``["*"]`` for a mount (a sub-application that answers any method)
and ``["GET"]`` for a WebSocket route (the upgrade request). ``guarded`` says whether
vLLM's own ``--api-key`` middleware would demand the key for that path (prefix
match, after stripping ``root_path``; vLLM skips the check for OPTIONS).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from scanner import canonical
from scanner.errors import InventoryFormatError

SCHEMA_VERSION = 1
RouteKind = Literal["http", "websocket", "mount"]
SourceKind = Literal["vllm", "asgi", "openapi", "sweep"]
ROUTE_KINDS: tuple[str, ...] = ("http", "websocket", "mount")
SOURCE_KINDS: tuple[str, ...] = ("vllm", "asgi", "openapi", "sweep")
ANY_METHOD = "*"
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


@dataclass(frozen=True, order=True)
class Route:
    path: str
    methods: tuple[str, ...]
    kind: RouteKind = "http"
    endpoint: str = ""
    guarded: bool = False
    origin: str = "app.routes"

    @property
    def key(self) -> tuple[str, RouteKind]:
        return (self.path, self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "methods": list(self.methods),
            "kind": self.kind,
            "endpoint": self.endpoint,
            "guarded": self.guarded,
            "origin": self.origin,
        }


@dataclass(frozen=True)
class VllmFacts:
    version: str
    serve_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()
    model_config: str = "none"
    plugins: tuple[str, ...] = ()
    guarded_prefixes: tuple[str, ...] = VLLM_GUARDED_PREFIXES
    root_path: str = ""
    api_key_configured: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "serve_args": list(self.serve_args),
            "env": dict(sorted(self.env.items())),
            "tasks": list(self.tasks),
            "model_config": self.model_config,
            "plugins": list(self.plugins),
            "guarded_prefixes": list(self.guarded_prefixes),
            "root_path": self.root_path,
            "api_key_configured": self.api_key_configured,
        }


@dataclass(frozen=True)
class Source:
    kind: SourceKind
    target: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target}


@dataclass(frozen=True)
class Inventory:
    source: Source
    routes: tuple[Route, ...]
    vllm: VllmFacts | None = None
    middleware: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", tuple(sorted(self.routes)))

    def body(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "source": self.source.to_dict(),
            "vllm": self.vllm.to_dict() if self.vllm else None,
            "middleware": list(self.middleware),
            "routes": [r.to_dict() for r in self.routes],
        }

    @property
    def content_hash(self) -> str:
        return canonical.digest(self.body())

    def to_dict(self) -> dict[str, Any]:
        return {**self.body(), "content_hash": self.content_hash}

    def to_json(self) -> str:
        return canonical.dumps(self.to_dict())

    def with_routes(self, routes: Sequence[Route]) -> Inventory:
        return replace(self, routes=tuple(routes))


def is_guarded(path: str, prefixes: Sequence[str] = VLLM_GUARDED_PREFIXES, root_path: str = "") -> bool:
    """Would vLLM's API-key middleware guard ``path``? (A plain ``startswith``, as vLLM does.)"""
    if root_path and path.startswith(root_path):
        path = path[len(root_path):]
    return any(path.startswith(p) for p in prefixes)


# --- loading and validation -------------------------------------------------------------


def load(path: str | Path) -> Inventory:
    """Read and validate an inventory file; raise :class:`InventoryFormatError` with the reason."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryFormatError(f"{p}: cannot read inventory: {exc.strerror or exc}") from None
    return loads(text, name=str(p))


def loads(text: str, name: str = "<inventory>") -> Inventory:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryFormatError(
            f"{name}:{exc.lineno}: not valid JSON: {exc.msg}"
        ) from None
    return from_dict(data, name=name)


def from_dict(data: Any, name: str = "<inventory>") -> Inventory:
    v = _Validator(name)
    doc = v.mapping(data, "document")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        v.fail(f"schema_version is {version!r}; this tool reads version {SCHEMA_VERSION}")
    src = v.mapping(doc.get("source"), "source")
    kind = v.choice(src.get("kind"), SOURCE_KINDS, "source.kind")
    target = v.string(src.get("target", ""), "source.target")
    source = Source(kind=cast(SourceKind, kind), target=target)
    routes = tuple(_route(v, r, i) for i, r in enumerate(v.sequence(doc.get("routes"), "routes")))
    vllm = _vllm(v, doc["vllm"]) if doc.get("vllm") is not None else None
    middleware = v.strings(doc.get("middleware", []), "middleware")
    inv = Inventory(source=source, routes=routes, vllm=vllm, middleware=middleware)
    claimed = doc.get("content_hash")
    if claimed is not None and claimed != inv.content_hash:
        v.fail(f"content_hash {claimed} does not match the content ({inv.content_hash}); "
               "the file was edited after it was written")
    return inv


def _route(v: _Validator, raw: Any, i: int) -> Route:
    where = f"routes[{i}]"
    r = v.mapping(raw, where)
    path = v.string(r.get("path"), f"{where}.path")
    if not path.startswith("/"):
        v.fail(f"{where}.path {path!r} must start with '/'")
    methods = tuple(m.upper() for m in v.strings(r.get("methods"), f"{where}.methods"))
    if not methods:
        v.fail(f"{where}.methods is empty")
    for m in methods:
        if m != ANY_METHOD and not m.isalpha():
            v.fail(f"{where}.methods has an invalid method {m!r}")
    kind = v.choice(r.get("kind", "http"), ROUTE_KINDS, f"{where}.kind")
    return Route(
        path=path,
        methods=tuple(sorted(set(methods))),
        kind=cast(RouteKind, kind),
        endpoint=v.string(r.get("endpoint", ""), f"{where}.endpoint"),
        guarded=v.boolean(r.get("guarded", False), f"{where}.guarded"),
        origin=v.string(r.get("origin", "app.routes"), f"{where}.origin"),
    )


def _vllm(v: _Validator, raw: Any) -> VllmFacts:
    d = v.mapping(raw, "vllm")
    env = v.mapping(d.get("env", {}), "vllm.env")
    return VllmFacts(
        version=v.string(d.get("version"), "vllm.version"),
        serve_args=v.strings(d.get("serve_args", []), "vllm.serve_args"),
        env={str(k): v.string(val, f"vllm.env.{k}") for k, val in env.items()},
        tasks=v.strings(d.get("tasks", []), "vllm.tasks"),
        model_config=v.string(d.get("model_config", "none"), "vllm.model_config"),
        plugins=v.strings(d.get("plugins", []), "vllm.plugins"),
        guarded_prefixes=v.strings(d.get("guarded_prefixes", list(VLLM_GUARDED_PREFIXES)),
                                   "vllm.guarded_prefixes"),
        root_path=v.string(d.get("root_path", ""), "vllm.root_path"),
        api_key_configured=v.boolean(d.get("api_key_configured", False),
                                     "vllm.api_key_configured"),
    )


class _Validator:
    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, msg: str) -> None:
        raise InventoryFormatError(f"{self.name}: invalid inventory: {msg}")

    def mapping(self, x: Any, what: str) -> dict[str, Any]:
        if not isinstance(x, dict):
            self.fail(f"{what} must be an object, not {type(x).__name__}")
        return cast(dict[str, Any], x)

    def sequence(self, x: Any, what: str) -> list[Any]:
        if not isinstance(x, list):
            self.fail(f"{what} must be a list, not {type(x).__name__}")
        return cast(list[Any], x)

    def string(self, x: Any, what: str) -> str:
        if not isinstance(x, str):
            self.fail(f"{what} must be a string, not {type(x).__name__}")
        return cast(str, x)

    def strings(self, x: Any, what: str) -> tuple[str, ...]:
        return tuple(self.string(item, f"{what}[]") for item in self.sequence(x, what))

    def boolean(self, x: Any, what: str) -> bool:
        if not isinstance(x, bool):
            self.fail(f"{what} must be true or false")
        return cast(bool, x)

    def choice(self, x: Any, choices: Sequence[str], what: str) -> str:
        if x not in choices:
            self.fail(f"{what} is {x!r}; expected one of {', '.join(choices)}")
        return cast(str, x)
