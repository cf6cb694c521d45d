"""What every JSON document the tool writes and reads back shares: the models' strict scalars
(a ``"yes"`` is no boolean, a ``29`` no string), the schema version, writing a model as its
document (:func:`dump`) and reading one back through it (:func:`read`), each error one line
naming the source and the field (``routes[0].path``).

The document models are the concepts' own frozen dataclasses (``scanner.inventory.model``,
``scanner.probe.interface``, ...), read by pydantic through a :class:`~pydantic.TypeAdapter`;
each class states its pydantic settings in ``__pydantic_config__`` (:data:`CONFIG`).
``scanner.documents`` names them, one per document, for ``vllm-perimeter schema``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BeforeValidator, ConfigDict, GetCoreSchemaHandler, Strict, TypeAdapter, ValidationError
from pydantic_core import CoreSchema, PydanticCustomError

from scanner.errors import ConfigError

T = TypeVar("T")

# a document's keys are its model's fields, no others
CONFIG = ConfigDict(extra="forbid")
Str = Annotated[str, Strict()]
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]   # an integer too, as JSON writes 2.0
Flag = Annotated[bool, Strict()]


def _whole(value: Any) -> Any:
    if type(value) is not int:
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def absent(value: Any) -> bool:
    """A field left out of its document when None (``Field(exclude_if=absent)``)."""
    return value is None


def empty(value: Any) -> bool:
    """A field left out of its document when empty, false or zero (``Field(exclude_if=empty)``)."""
    return not value


# schema_version 1, as a JSON integer (not true, not 1.0)
Version1 = Annotated[Literal[1], BeforeValidator(_whole)]


def required(*names: str) -> Any:
    """A dataclass's ``__get_pydantic_core_schema__``: ``names`` are required in a document (and
    its schema), though Python code building the class may leave them at their defaults (a
    schema version)."""

    def schema(cls: type, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        core = handler(source)
        for f in core["schema"]["fields"]:
            if f["name"] in names and f["schema"]["type"] == "default":
                f["schema"] = f["schema"]["schema"]
        return core

    return classmethod(schema)


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def adapter(model: Any) -> TypeAdapter[Any]:
    """The (cached) pydantic reader and writer of ``model``."""
    if model not in _ADAPTERS:
        _ADAPTERS[model] = TypeAdapter(model)
    return _ADAPTERS[model]


def dump(obj: Any, model: Any = None) -> Any:
    """``obj`` as its document's JSON value (lists, dicts, scalars): its fields by their
    document names, each model's own omissions applied."""
    return adapter(type(obj) if model is None else model).dump_python(obj, mode="json", by_alias=True)


def where(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the field path users read: ``routes[0].path``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "document"


# pydantic's words for a dataclass's arguments, as a document's reader says them
_MESSAGES = {"unexpected_keyword_argument": "Extra inputs are not permitted",
             "unexpected_positional_argument": "Extra inputs are not permitted",
             "dataclass_type": "Input should be a valid dictionary"}


def read(model: type[T], data: Any, source: str, name: str, error: type[ConfigError] = ConfigError) -> T:
    """``data`` (parsed JSON) validated as document ``name`` of ``model``; ``error`` naming
    ``source`` and the field, one line."""
    try:
        out: T = adapter(model).validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = _MESSAGES.get(first["type"]) or first["msg"].replace("valid tuple", "valid list").replace(
            "Tuple should", "List should")   # a JSON array, whatever the model holds it in
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise error(f"{source}: invalid {name}: {where(first['loc'])}: {msg}{more}") from None
    return out
