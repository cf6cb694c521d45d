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
from typing import Any, Literal

from scanner import canonical
from scanner.errors import InventoryFormatError
from scanner.output import read_text

SCHEMA_VERSION = 1
RouteKind = Literal["http", "websocket", "mount"]
SourceKind = Literal["vllm", "asgi", "openapi", "sweep"]
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
    return loads(read_text(p, "inventory", InventoryFormatError), name=str(p))


def loads(text: str, name: str = "<inventory>") -> Inventory:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryFormatError(
            f"{name}:{exc.lineno}: not valid JSON: {exc.msg}"
        ) from None
    return from_dict(data, name=name)


def from_dict(data: Any, name: str = "<inventory>") -> Inventory:
    """A validated inventory (scanner.documents.InventoryDoc) whose content hash, if it has one,
    matches its content."""
    from scanner.documents import InventoryDoc, validate

    doc: InventoryDoc = validate("inventory", data, name, InventoryFormatError)
    facts = doc.vllm
    inv = Inventory(
        source=Source(kind=doc.source.kind, target=doc.source.target),
        routes=tuple(Route(path=r.path, methods=tuple(sorted({m.upper() for m in r.methods})), kind=r.kind,
                           endpoint=r.endpoint, guarded=r.guarded, origin=r.origin) for r in doc.routes),
        vllm=VllmFacts(version=facts.version, serve_args=tuple(facts.serve_args), env=dict(facts.env),
                       tasks=tuple(facts.tasks), model_config=facts.model_config_,
                       plugins=tuple(facts.plugins),
                       guarded_prefixes=tuple(facts.guarded_prefixes), root_path=facts.root_path,
                       api_key_configured=facts.api_key_configured) if facts else None,
        middleware=tuple(doc.middleware),
    )
    if doc.content_hash is not None and doc.content_hash != inv.content_hash:
        raise InventoryFormatError(f"{name}: invalid inventory: content_hash {doc.content_hash} does not "
                                   f"match the content ({inv.content_hash}); the file was edited after it "
                                   "was written")
    return inv
