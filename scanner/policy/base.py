"""What every policy model shares: frozen pydantic dataclasses that validate the YAML a user
writes (each error at its key's position), and the reading of a pydantic error as one line.

A model's fields are the keys a user writes, except those marked ``Internal`` (set by the
model itself: a line, a name from its mapping key, keys read from a file). A model whose YAML
differs from its fields in places says so in two class attributes read by :class:`Base`:
``_renames`` (YAML key -> field) and ``_inputs`` (YAML key -> its JSON Schema, for keys its
``_reshape`` turns into fields). Checks that read files or other sections run only while a
policy file is read (:func:`reading`), so code may build any model (tests build broken ones).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError, ValidationInfo, model_validator
from pydantic.dataclasses import dataclass
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

# the strict scalars every JSON or YAML document's model reads (the policy models import them here)
from scanner.jsondoc import Flag as Flag
from scanner.jsondoc import Int as Int
from scanner.jsondoc import Num as Num
from scanner.jsondoc import Str as Str

Text = Annotated[str, Strict(), Field(min_length=1)]   # a non-empty string, as YAML gives it
Path_ = tuple[str | int, ...]
T = TypeVar("T")


class YamlMap(dict[str, Any]):
    """A YAML mapping as read: its keys and values, its position (``path``, ``line``) and what
    its model takes beside the user's keys (``internal``: a line, a name)."""

    def __init__(self, items: Mapping[str, Any], path: Path_, line: int, **internal: Any) -> None:
        super().__init__(items)
        self.path, self.line, self.internal = path, line, {"line": line, **internal}

    def but(self, **internal: Any) -> YamlMap:
        out = YamlMap(self, self.path, self.line)
        out.internal = {**self.internal, **internal}
        return out


def fail(message: str, *at: str | int, shown: str | None = None) -> PydanticCustomError:
    """An error ``at`` a key (or index) under the model raising it; ``shown``: the path printed."""
    return PydanticCustomError("policy", "{message}", {"message": message, "at": at, "shown": shown})


def hint(value: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def reading(info: ValidationInfo) -> dict[str, Any] | None:
    """The reading's context (``base_dir``, ``lines``) while a policy file is read, else None."""
    ctx = info.context
    return ctx if isinstance(ctx, dict) and "base_dir" in ctx else None


def base_dir(info: ValidationInfo) -> Path:
    ctx = reading(info)
    return Path(ctx["base_dir"]) if ctx else Path(".")


def line_of(info: ValidationInfo, path: Path_, default: int = 0) -> int:
    ctx = reading(info)
    return int(ctx["lines"].get(path, default)) if ctx else default


def _internal(field: Any) -> bool:
    return any(isinstance(m, _Internal) for m in getattr(field, "metadata", ()))


def _input_schema(schema: dict[str, Any], cls: type) -> None:
    """The JSON Schema of what a user writes: renamed keys under their YAML names, the keys
    ``_reshape`` reads added, internal fields (already skipped) left out."""
    props: dict[str, Any] = schema.setdefault("properties", {})
    required: list[str] = schema.get("required", [])
    for yaml_key, name in getattr(cls, "_renames", {}).items():
        if name in props:
            props[yaml_key] = props.pop(name)
        required = [yaml_key if r == name else r for r in required]
    for key, extra in getattr(cls, "_inputs", {}).items():
        props[key] = extra(props) if callable(extra) else {**props.get(key, {}), **extra}
    required = [r for r in required if r not in getattr(cls, "_filled", ())]
    required += getattr(cls, "_required", ())
    if required:
        schema["required"] = required
    else:
        schema.pop("required", None)


CONFIG = ConfigDict(extra="forbid", json_schema_extra=_input_schema)


@dataclass(frozen=True, config=CONFIG)
class Base:
    """The policy models' base: a YAML mapping's keys checked (unknown ones with a hint),
    reshaped into fields, and given its internal values."""

    _renames: ClassVar[Mapping[str, str]] = {}
    _inputs: ClassVar[Mapping[str, Any]] = {}   # a schema, or a function of the fields' schemas
    _required: ClassVar[tuple[str, ...]] = ()    # YAML keys required beside the required fields
    _filled: ClassVar[tuple[str, ...]] = ()      # required fields ``_reshape`` fills when the YAML has none

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data     # built by code (pydantic's ArgsKwargs)
        if not isinstance(data, YamlMap):
            data = YamlMap(data, (), 0)    # a document read as plain data (scanner.documents)
        fields = getattr(cls, "__pydantic_fields__", {})
        by_name = {v: k for k, v in cls._renames.items()}
        allowed = cls.yaml_keys()
        for key in data:
            if key not in allowed:
                raise fail(f"unknown key {key!r}" + hint(key, allowed), key)
        needed = [by_name.get(n, n) for n, f in fields.items()
                  if f.is_required() and not _internal(f) and n not in cls._filled] + list(cls._required)
        for key in needed:
            if key not in data:
                raise fail(f"missing required key {key!r}")
        out = {cls._renames.get(k, k): v for k, v in data.items()}
        out = cls._reshape(out, data, info)
        out.update({k: v for k, v in data.internal.items() if k in fields})
        return out

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        """The YAML's keys as fields (the keys are known and required ones present)."""
        return out

    @classmethod
    def yaml_keys(cls) -> list[str]:
        """The keys a user may write: the fields (renamed ones by their YAML key) but internal
        ones, and the keys ``_reshape`` reads."""
        by_name = {v: k for k, v in cls._renames.items()}
        fields = getattr(cls, "__pydantic_fields__", {})
        return list(dict.fromkeys([by_name.get(n, n) for n, f in fields.items() if not _internal(f)]
                                  + list(cls._inputs)))


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def validate(cls: type[T], data: Any, context: dict[str, Any] | None) -> T:
    adapter = _ADAPTERS.get(cls) or _ADAPTERS.setdefault(cls, TypeAdapter(cls))
    out: T = adapter.validate_python(data, context=context)
    return out


def sub(cls: type[T], data: Any, info: ValidationInfo, *at: str | int) -> T:
    """``data`` validated as ``cls`` inside a validator; its first error raised ``at`` the key."""
    try:
        return validate(cls, data, info.context)
    except ValidationError as exc:
        path, _, message = explain(exc, cls)
        raise fail(message, *at, *path) from None


def replace(obj: T, **changes: Any) -> T:
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


_SCALAR = {"string_type": "expected a non-empty string", "string_too_short": "expected a non-empty string",
           "int_type": "expected a whole number", "float_type": "expected a positive number",
           "greater_than": "expected a positive number", "bool_type": "expected true or false"}


def _yaml_path(cls: Any, loc: Path_) -> Path_:
    """A pydantic location under model ``cls`` with each renamed field under its YAML key."""
    out: list[str | int] = []
    for part in loc:
        cls = _unwrap(cls)
        fields = getattr(cls, "__pydantic_fields__", None) if isinstance(cls, type) else None
        if fields is not None and isinstance(part, str) and part in fields:
            out.append({v: k for k, v in getattr(cls, "_renames", {}).items()}.get(part, part))
            cls = fields[part].annotation
        else:
            out.append(part)
            args = typing.get_args(cls)
            cls = args[-1] if args and args[-1] is not Ellipsis else (args[0] if args else None)
    return tuple(out)


def _unwrap(cls: Any) -> Any:
    """``X`` of ``Annotated[X, ...]``, ``X | None``."""
    while True:
        args = typing.get_args(cls)
        if typing.get_origin(cls) is Annotated or (args and type(None) in args and len(args) == 2):
            cls = next(a for a in args if a is not type(None))
        else:
            return cls


def explain(exc: ValidationError, cls: Any = None) -> tuple[Path_, str | None, str]:
    """The first error of ``exc`` (validating ``cls``) as (the path of the key at fault, the path
    to print if not that one, one line)."""
    err = exc.errors()[0]
    loc: Path_ = _yaml_path(cls, tuple(p for p in err["loc"] if p != "[key]"))
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "policy":
        return (*loc, *ctx["at"]), ctx["shown"], str(ctx["message"])
    if kind == "missing":
        return loc[:-1], None, f"missing required key {loc[-1]!r}"
    if kind == "unexpected_keyword_argument":
        return loc, None, f"unknown key {loc[-1]!r}"
    if kind in ("dataclass_type", "dict_type", "model_type", "mapping_type"):
        return loc, None, "expected a mapping (key: value)"
    if kind in ("list_type", "tuple_type"):
        return loc, None, "expected a list"
    if kind == "too_short":
        return loc, None, f"name at least one {str(loc[-1]).removesuffix('s') if loc else 'item'}"
    if isinstance(value, dict | list | tuple):
        return loc, None, "expected a single value"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        if not isinstance(value, str) or not value:
            return loc, None, f"expected a non-empty string, got {value!r}"
        return loc, None, f"{value!r} is not one of {', '.join(choices)}" + hint(value, choices)
    if kind == "greater_than_equal":
        return loc, None, f"expected a whole number >= {ctx['ge']}, got {value!r}"
    if kind == "less_than_equal":
        if ctx["le"] == 65535:
            return loc, None, f"port {value} is not in 1..65535"
        return loc, None, f"{value}: at most {ctx['le']}"
    if kind == "string_pattern_mismatch":
        return loc, None, f"{value!r} does not match {ctx['pattern']}"
    if kind in _SCALAR:
        return loc, None, f"{_SCALAR[kind]}, got {value!r}"
    return loc, None, str(err["msg"]).removeprefix("Value error, ")


def shown(path: Path_) -> str:
    """``routes[0].audience``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Internal:
    """Marks a field no user writes: set by the model or the reader."""


Internal: Any = _Internal()
Hidden: Any = SkipJsonSchema()  # type: ignore[type-arg]   # left out of the JSON Schema
Line = Annotated[int, Internal, Hidden]


def absolute_file(value: str | None, *at: str | int) -> None:
    """A file a proxy opens at run time: an absolute path with nothing a config could misread."""
    if value is not None and (not value.startswith("/") or any(c in value for c in "\"\\$;{}\n\r\t ")):
        raise fail(f"{value!r}: give an absolute path without quotes, spaces, '$', ';' or braces "
                   "(the proxy opens it at run time)", *at)
