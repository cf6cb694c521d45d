"""The inventory document: which routes an app serves, and where that knowledge came from.

Format (``schema_version`` 1), as JSON::

    {
      "schema_version": 1,
      "source": {"kind": "vllm" | "asgi" | "openapi" | "sweep" | "live", "target": "..."},
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
         "guarded": true, "origin": "app.routes",
         "request": {"source": "unknown", "note": "..."}},
        {"path": "/v1/completions", "methods": ["POST"], ...,
         "request": {                        # optional (absent in older documents)
           "source": "fastapi",              # | "handler" | "none" | "unknown"
           "media_type": "application/json",
           "models": ["vllm.entrypoints.openai.completion.protocol.CompletionRequest"],
           "types": ["object"], "extra": "allow",
           "fields": [
             {"name": "max_tokens", "types": ["integer", "null"], "default": 16},
             {"name": "prompt", "types": ["string", "null", "array"], "default": null,
              "nested": [{"path": "prompt[]", "types": ["string", "integer", "array"]}, ...]}
           ]}}
      ],
      "content_hash": "sha256:..."           # of everything above except itself
    }

``methods`` is ``["*"]`` for a mount (a sub-application that answers any method)
and ``["GET"]`` for a WebSocket route (the upgrade request). ``guarded`` says whether
vLLM's own ``--api-key`` middleware would demand the key for that path (prefix
match, after stripping ``root_path``; vLLM skips the check for OPTIONS).

``request`` (optional) is the route's request body as the app's code validates it: see
:class:`RequestBody` and ``scanner/inventory/request_fields.py`` for the field records. In a
field record, keys at their default are left out (``required`` false, no ``default`` stated
by the schema, no ``enum``, not ``truncated``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from scanner import canonical
from scanner.errors import InventoryFormatError
from scanner.inventory.request_fields import json_text
from scanner.output import read_text

SCHEMA_VERSION = 1
RouteKind = Literal["http", "websocket", "mount", "grpc"]   # grpc: a plan decision on a gRPC method
SourceKind = Literal["vllm", "asgi", "openapi", "sweep", "live"]
BodySource = Literal["fastapi", "handler", "none", "unknown"]
ANY_METHOD = "*"
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


def _field_dict(key: str, name: str, types: tuple[str, ...], required: bool, default_json: str | None,
                enum: tuple[str, ...], truncated: str) -> dict[str, Any]:
    """One field record as JSON: keys at their default value are left out (catalogs stay small)."""
    out: dict[str, Any] = {key: name, "types": list(types)}
    if required:
        out["required"] = True
    if default_json is not None:
        out["default"] = json.loads(default_json)
    if enum:
        out["enum"] = [json.loads(v) for v in enum]
    if truncated:
        out["truncated"] = truncated
    return out


@dataclass(frozen=True, order=True)
class NestedField:
    """A position under a top-level field: ``messages[].content[].image_url.url``.

    ``[]`` is each item of an array, ``.name`` a property, ``.*`` any value of a map.
    ``required`` is relative to the enclosing object. Defaults and enum members are kept as
    compact canonical JSON text (hashable, ordered); the document holds the JSON values.
    """

    path: str
    types: tuple[str, ...]
    required: bool = False
    default_json: str | None = None
    enum: tuple[str, ...] = ()
    truncated: str = ""  # "" | "depth" | "recursion": children not listed, and why

    @property
    def default(self) -> Any:
        return None if self.default_json is None else json.loads(self.default_json)

    def to_dict(self) -> dict[str, Any]:
        return _field_dict("path", self.path, self.types, self.required, self.default_json,
                           self.enum, self.truncated)


@dataclass(frozen=True, order=True)
class RequestField:
    """A top-level field of a request body, with its nested positions (bounded depth)."""

    name: str
    types: tuple[str, ...]
    required: bool = False
    default_json: str | None = None
    enum: tuple[str, ...] = ()
    truncated: str = ""
    nested: tuple[NestedField, ...] = ()

    @property
    def default(self) -> Any:
        return None if self.default_json is None else json.loads(self.default_json)

    def to_dict(self) -> dict[str, Any]:
        out = _field_dict("name", self.name, self.types, self.required, self.default_json,
                          self.enum, self.truncated)
        if self.nested:
            out["nested"] = [n.to_dict() for n in self.nested]
        return out


@dataclass(frozen=True, order=True)
class RequestBody:
    """What the app validates a route's request body against (``source``, see
    ``scanner/inventory/_bodies.py``): the models' qualified class names, the body's JSON
    types, how unknown top-level fields are treated (``extra``: pydantic's allow / forbid /
    ignore, ``mixed`` across a union) and the fields. ``note`` says how it was found, or why
    it is unknown."""

    source: BodySource
    media_type: str = ""
    models: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    extra: str = ""
    fields: tuple[RequestField, ...] = ()
    note: str = ""

    @property
    def known(self) -> bool:
        return self.source in ("fastapi", "handler")

    def top_field(self, name: str) -> RequestField | None:
        return next((f for f in self.fields if f.name == name), None)

    def positions(self) -> dict[str, NestedField]:
        """Every field position by path, top-level ones included (as NestedField)."""
        out: dict[str, NestedField] = {}
        for f in self.fields:
            out[f.name] = NestedField(f.name, f.types, f.required, f.default_json, f.enum, f.truncated)
            for n in f.nested:
                out[n.path] = n
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source}
        if self.media_type:
            out["media_type"] = self.media_type
        if self.models:
            out["models"] = list(self.models)
        if self.types:
            out["types"] = list(self.types)
        if self.extra:
            out["extra"] = self.extra
        if self.fields:
            out["fields"] = [f.to_dict() for f in self.fields]
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True, order=True)
class Route:
    path: str
    methods: tuple[str, ...]
    kind: RouteKind = "http"
    endpoint: str = ""
    guarded: bool = False
    origin: str = "app.routes"
    # What the body is validated against; None when the source does not say (older
    # inventories, ``inventory openapi``, WebSocket routes).
    request: RequestBody | None = None

    @property
    def key(self) -> tuple[str, RouteKind]:
        return (self.path, self.kind)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "methods": list(self.methods),
            "kind": self.kind,
            "endpoint": self.endpoint,
            "guarded": self.guarded,
            "origin": self.origin,
        }
        if self.request is not None:  # absent, not null: older documents keep their hash
            out["request"] = self.request.to_dict()
        return out


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
                           endpoint=r.endpoint, guarded=r.guarded, origin=r.origin,
                           request=_body_from_doc(r.request)) for r in doc.routes),
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


def _json_or_none(doc: Any, key: str) -> str | None:
    """The canonical JSON text of ``doc.<key>`` when the document states it (null included)."""
    return json_text(getattr(doc, key)) if key in doc.model_fields_set else None


def _body_from_doc(doc: Any) -> RequestBody | None:
    if doc is None:
        return None
    return RequestBody(
        source=doc.source, media_type=doc.media_type, models=tuple(doc.models), types=tuple(doc.types),
        extra=doc.extra, note=doc.note,
        fields=tuple(RequestField(
            name=f.name, types=tuple(f.types), required=f.required, default_json=_json_or_none(f, "default"),
            enum=tuple(json_text(v) for v in f.enum), truncated=f.truncated,
            nested=tuple(NestedField(
                path=n.path, types=tuple(n.types), required=n.required,
                default_json=_json_or_none(n, "default"), enum=tuple(json_text(v) for v in n.enum),
                truncated=n.truncated) for n in f.nested),
        ) for f in doc.fields),
    )
