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

These dataclasses are the document's model: pydantic reads a file into them and writes them
back (``scanner.jsondoc``: each field's type, check, JSON name and omission is stated on the
field), and ``schemas/inventory.schema.json`` is generated from them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

from scanner import canonical, jsondoc
from scanner.errors import InventoryFormatError
from scanner.inventory.request_fields import BodyExtra, Truncated, json_text
from scanner.jsondoc import CONFIG, Flag, Str, Version1, absent, empty
from scanner.output import read_text

SCHEMA_VERSION: Final = 1
HttpKind = Literal["http", "websocket", "mount"]     # a route of an app (an inventory's)
RouteKind = HttpKind | Literal["grpc"]                # grpc: a plan decision on a gRPC method
SourceKind = Literal["vllm", "asgi", "openapi", "sweep", "live"]
BodySource = Literal["fastapi", "handler", "none", "unknown"]
ANY_METHOD = "*"
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


# a JSON value kept as its compact canonical text (hashable, ordered); the document holds the value
JsonText = Annotated[str, BeforeValidator(json_text), PlainSerializer(json.loads), WithJsonSchema({})]
JsonType = Annotated[Str, Field(description="a JSON Schema type, or 'any' (unconstrained)")]
Types = Annotated[tuple[JsonType, ...], Field(min_length=1)]
# keys at their default value are left out of a field record (catalogs stay small)
Required = Annotated[Flag, Field(exclude_if=empty, description="required in the enclosing object")]
# a stated default (null included) kept as its JSON text; None: the schema states none (absent)
DefaultJson = Annotated[str | None, BeforeValidator(json_text), PlainSerializer(json.loads),
                        WithJsonSchema({}), Field(alias="default", exclude_if=absent,
                              description="present only when the schema states a default")]
Enum = Annotated[tuple[JsonText, ...], Field(
    exclude_if=empty, description="the allowed constants, when every non-null alternative is one")]
Truncation = Annotated[Truncated, Field(
    exclude_if=empty, description="children not listed: depth bound reached, or a recursive $ref")]


@dataclass(frozen=True, order=True)
class NestedField:
    """A position under a top-level field: ``messages[].content[].image_url.url``.

    ``[]`` is each item of an array, ``.name`` a property, ``.*`` any value of a map.
    ``required`` is relative to the enclosing object. Defaults and enum members are kept as
    compact canonical JSON text (hashable, ordered); the document holds the JSON values.
    """

    __pydantic_config__: ClassVar = CONFIG
    path: Annotated[Str, Field(min_length=1)]
    types: Types
    required: Required = False
    default_json: DefaultJson = None
    enum: Enum = ()
    truncated: Truncation = ""

    @property
    def default(self) -> Any:
        return None if self.default_json is None else json.loads(self.default_json)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True, order=True)
class RequestField:
    """A top-level field of a request body, with its nested positions (bounded depth)."""

    __pydantic_config__: ClassVar = CONFIG
    name: Annotated[Str, Field(min_length=1)]
    types: Types
    required: Required = False
    default_json: DefaultJson = None
    enum: Enum = ()
    truncated: Truncation = ""
    nested: Annotated[tuple[NestedField, ...], Field(exclude_if=empty)] = ()

    @property
    def default(self) -> Any:
        return None if self.default_json is None else json.loads(self.default_json)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True, order=True)
class RequestBody:
    """What the app validates a route's request body against (``source``, see
    ``scanner/inventory/_bodies.py``): the models' qualified class names, the body's JSON
    types, how unknown top-level fields are treated (``extra``: pydantic's allow / forbid /
    ignore, ``mixed`` across a union) and the fields. ``note`` says how it was found, or why
    it is unknown."""

    __pydantic_config__: ClassVar = CONFIG
    source: Annotated[BodySource, Field(description=(
        "fastapi: FastAPI validates the body (the route's body parameter); handler: the handler "
        "validates the raw body against TypeAdapters it holds; none: nothing reads the body; "
        "unknown: the handler parses the raw request with its own code"))]
    media_type: Annotated[Str, Field(exclude_if=empty)] = ""
    models: Annotated[tuple[Str, ...], Field(exclude_if=empty,
                                             description="qualified class names of the body models")] = ()
    types: Annotated[tuple[JsonType, ...], Field(exclude_if=empty)] = ()
    extra: Annotated[BodyExtra, Field(exclude_if=empty,
                                      description="how the models treat unknown top-level fields")] = ""
    fields: Annotated[tuple[RequestField, ...], Field(exclude_if=empty)] = ()
    note: Annotated[Str, Field(exclude_if=empty)] = ""

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
        out: dict[str, Any] = jsondoc.dump(self)
        return out


def _app_kind(kind: RouteKind) -> RouteKind:
    if kind not in get_args(HttpKind):
        *most, last = (repr(k) for k in get_args(HttpKind))
        raise PydanticCustomError("literal_error", f"Input should be {', '.join(most)} or {last}")
    return kind


def _methods(methods: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({m.upper() for m in methods}))


@dataclass(frozen=True, order=True)
class Route:
    __pydantic_config__: ClassVar = CONFIG
    path: Annotated[Str, Field(pattern=r"^/")]
    # read upper-cased, sorted, each once
    methods: Annotated[tuple[Annotated[Str, Field(pattern=r"^([A-Za-z]+|\*)$")], ...], Field(min_length=1),
                       AfterValidator(_methods)]
    # grpc only in a plan (scanner.plan.build): no route of an app's inventory
    kind: Annotated[RouteKind, AfterValidator(_app_kind),
                    WithJsonSchema({"enum": list(get_args(HttpKind)), "type": "string"})] = "http"
    endpoint: Str = ""
    guarded: Flag = False
    origin: Str = "app.routes"
    # What the body is validated against; None when the source does not say (older
    # inventories, ``inventory openapi``, WebSocket routes): absent, not null (older documents
    # keep their hash)
    request: Annotated[RequestBody | None, Field(exclude_if=absent, description=(
        "the request body (absent when the source does not say)"))] = None

    @property
    def key(self) -> tuple[str, RouteKind]:
        return (self.path, self.kind)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True)
class VllmFacts:
    __pydantic_config__: ClassVar = CONFIG
    version: Str
    serve_args: tuple[Str, ...] = ()
    env: Mapping[Str, Str] = field(default_factory=dict)
    tasks: tuple[Str, ...] = ()
    model_config: Str = "none"
    plugins: tuple[Str, ...] = ()
    guarded_prefixes: tuple[Str, ...] = VLLM_GUARDED_PREFIXES
    root_path: Str = ""
    api_key_configured: Flag = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True)
class Source:
    __pydantic_config__: ClassVar = CONFIG
    kind: SourceKind
    target: Str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True)
class Inventory:
    """The routes an app serves, and where that knowledge came from (``inventory ...``)."""

    __pydantic_config__: ClassVar = CONFIG
    source: Source
    routes: tuple[Route, ...]
    vllm: VllmFacts | None = None
    middleware: tuple[Str, ...] = ()
    schema_version: Version1 = SCHEMA_VERSION
    # the content hash a file states (its key ``content_hash``): it must match the content
    stated_hash: InitVar[Annotated[Str | None, Field(alias="content_hash")]] = None

    __get_pydantic_core_schema__ = jsondoc.required("schema_version")

    def __post_init__(self, stated_hash: str | None) -> None:
        object.__setattr__(self, "routes", tuple(sorted(self.routes)))
        if stated_hash is not None and stated_hash != self.content_hash:
            raise PydanticCustomError(
                "content_hash", "content_hash {stated} does not match the content ({actual}); the file was "
                "edited after it was written", {"stated": stated_hash, "actual": self.content_hash})

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out

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
    """A validated inventory whose content hash, if it has one, matches its content."""
    return jsondoc.read(Inventory, data, name, "inventory", InventoryFormatError)
