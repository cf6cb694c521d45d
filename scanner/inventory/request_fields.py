"""Request fields from a JSON Schema: what a route's body may carry, flattened for policies.

The worker (in vLLM's own Python) hands over the JSON Schema pydantic generates for a route's
request body model; this module turns it into the inventory's field records:

* one record per top-level field: name, JSON types, required, default (when the schema states
  one), allowed constant values (``enum``, when every non-null alternative is a constant);
* under each, the nested field paths, in the notation ``messages[].content[].image_url.url``:
  ``[]`` is "each item of an array", ``.name`` a property of an object, ``.*`` any value of
  a map (``additionalProperties`` with a schema);
* ``$ref``, ``allOf`` (of one), ``anyOf`` and ``oneOf`` (discriminated unions included) are
  resolved: alternatives at one position are merged, so a position's ``types`` are the union
  of its alternatives' types and a field is ``required`` only when every object alternative
  that can hold it requires it;
* depth is bounded (:data:`MAX_DEPTH` path segments) and a ``$ref`` already being expanded
  on the way down is not expanded again; a record whose children were cut says why in
  ``truncated`` (``depth`` or ``recursion``).

Types are JSON Schema's: ``string``, ``integer``, ``number``, ``boolean``, ``null``,
``object``, ``array``, plus ``any`` for a position the schema does not constrain.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

MAX_DEPTH = 8
# how a body's models treat unknown top-level fields ("": the body is not an object)
BodyExtra = Literal["", "allow", "forbid", "ignore", "mixed"]
# a position's children not listed: depth bound reached, or a recursive $ref ("": listed)
Truncated = Literal["", "depth", "recursion"]
JSON_TYPES = ("string", "integer", "number", "boolean", "null", "object", "array", "any")
_TYPE_OF_VALUE = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                  (type(None), "null"), (list, "array"), (dict, "object"))


def json_text(value: Any) -> str:
    """Compact canonical JSON of a schema value (a default, an enum member)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class _Alt:
    """One alternative at a position: a resolved schema and the $refs expanded to reach it."""

    schema: Mapping[str, Any]
    refs: tuple[str, ...]
    recursive: bool = False  # reached through a $ref already on the way down


@dataclass
class _Position:
    """A field position being built: its alternatives and the facts gathered so far."""

    alts: list[_Alt] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)
    required_in: int = 0  # object alternatives of the parent that require this field
    present_in: int = 0  # object alternatives of the parent that have this field


@dataclass(frozen=True)
class FlatField:
    """One position of the flattened schema (``path`` is the full path)."""

    path: str
    types: tuple[str, ...]
    required: bool = False
    default: str | None = None  # canonical JSON text of the schema's default
    enum: tuple[str, ...] = ()  # canonical JSON texts of the allowed constants
    truncated: Truncated = ""
    depth: int = 1


@dataclass(frozen=True)
class FlatBody:
    """A body schema flattened: the body's own types, how unknown top-level fields are
    treated, and every field position (top-level ones have ``depth == 1``)."""

    types: tuple[str, ...]
    extra: BodyExtra
    fields: tuple[FlatField, ...]


class _Flattener:
    def __init__(self, root: Mapping[str, Any], max_depth: int) -> None:
        self.root = root
        self.max_depth = max_depth

    def ref_target(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#/"):
            return {}  # an external $ref: unknown shape, recorded as "any"
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                return {}
            node = node[part]
        return node if isinstance(node, Mapping) else {}

    def alternatives(self, schema: Any, refs: tuple[str, ...]) -> list[_Alt]:
        """The leaf alternatives of ``schema`` ($ref followed, allOf of one, any/oneOf split)."""
        if schema is True or not isinstance(schema, Mapping):
            return [_Alt({}, refs)]
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref in refs:
                return [_Alt(self.ref_target(ref), refs, recursive=True)]
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            target = self.ref_target(ref)
            merged = {**target, **{k: v for k, v in siblings.items() if k not in ("title", "description")}}
            return self.alternatives(merged, (*refs, ref))
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            if len(all_of) == 1:
                inner = all_of[0]
                return [_Alt({**a.schema, **_object_parts(rest)}, a.refs, a.recursive)
                        for a in self.alternatives(inner, refs)] if rest else self.alternatives(inner, refs)
            return [_Alt(_merge_all_of([a.schema for part in all_of
                                        for a in self.alternatives(part, refs)], rest), refs)]
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                out: list[_Alt] = []
                for option in options:
                    out.extend(self.alternatives(option, refs))
                return out
        return [_Alt(schema, refs)]

    def flatten(self) -> FlatBody:
        alts = self.alternatives(self.root, ())
        objects = [a for a in alts if "object" in _types_of(a.schema)]
        extras = sorted({_extra(a.schema) for a in objects})
        extra: BodyExtra = "" if not objects else (extras[0] if len(extras) == 1 else "mixed")
        out: list[FlatField] = []
        self.children("", alts, 0, out)
        return FlatBody(types=_merge_types(a.schema for a in alts), extra=extra, fields=tuple(out))

    def children(self, path: str, alts: Sequence[_Alt], depth: int, out: list[FlatField]) -> None:
        """Append the positions under ``path`` (whose alternatives are ``alts``) to ``out``."""
        expandable = [a for a in alts if not a.recursive]
        objects = [a for a in expandable if "object" in _types_of(a.schema)]
        props: dict[str, _Position] = {}
        mapping = _Position()
        for a in objects:
            required_names = set(a.schema.get("required", ()) or ())
            for name, sub in (a.schema.get("properties") or {}).items():
                pos = props.setdefault(str(name), _Position())
                pos.present_in += 1
                pos.required_in += name in required_names
                if isinstance(sub, Mapping) and "default" in sub:
                    pos.defaults.append(json_text(sub["default"]))
                pos.alts.extend(self.alternatives(sub, a.refs))
            extra = a.schema.get("additionalProperties")
            if isinstance(extra, Mapping) and extra:
                mapping.alts.extend(self.alternatives(extra, a.refs))
        items = _Position()
        for a in expandable:
            if "array" not in _types_of(a.schema):
                continue
            for part in a.schema.get("prefixItems") or ():
                items.alts.extend(self.alternatives(part, a.refs))
            each = a.schema.get("items")
            if isinstance(each, Mapping) or each is True:
                items.alts.extend(self.alternatives(each, a.refs))
            elif each is None and not a.schema.get("prefixItems"):
                items.alts.append(_Alt({}, a.refs))  # an array of anything
        for name, pos in props.items():
            required = bool(objects) and pos.present_in == len(objects) and pos.required_in == len(objects)
            self.emit(_join(path, name), pos, required, depth + 1, out)
        if mapping.alts:
            self.emit(f"{path}.*" if path else "*", mapping, False, depth + 1, out)
        if items.alts:
            self.emit(f"{path}[]", items, False, depth + 1, out)

    def emit(self, path: str, pos: _Position, required: bool, depth: int, out: list[FlatField]) -> None:
        # a default is stated when every alternative that has the field states the same one
        defaults = sorted(set(pos.defaults)) if len(pos.defaults) == max(pos.present_in, 1) else []
        has_children = any(_has_children(a.schema) for a in pos.alts)
        truncated: Truncated = ""
        if any(a.recursive and _has_children(a.schema) for a in pos.alts):
            truncated = "recursion"
        if has_children and depth >= self.max_depth:
            truncated = "depth"
        out.append(FlatField(
            path=path,
            types=_merge_types(a.schema for a in pos.alts),
            required=required,
            default=defaults[0] if len(defaults) == 1 else None,
            enum=_enum(pos.alts),
            truncated=truncated,
            depth=depth,
        ))
        if has_children and depth < self.max_depth:
            self.children(path, pos.alts, depth, out)


def flatten(schema: Mapping[str, Any], max_depth: int = MAX_DEPTH) -> FlatBody:
    """The body described by the JSON Schema ``schema`` (its ``$defs`` included), flattened."""
    return _Flattener(schema, max_depth).flatten()


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _object_parts(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in ("title", "description", "default")}


def _merge_all_of(parts: Iterable[Mapping[str, Any]], rest: Mapping[str, Any]) -> dict[str, Any]:
    """allOf of several object schemas: their properties and required lists together."""
    merged: dict[str, Any] = dict(_object_parts(rest))
    props: dict[str, Any] = {}
    required: list[str] = []
    for part in parts:
        for k, v in part.items():
            if k == "properties" and isinstance(v, Mapping):
                props.update(v)
            elif k == "required" and isinstance(v, list):
                required += [str(x) for x in v if x not in required]
            elif k not in merged:
                merged[k] = v
    if props:
        merged["properties"] = props
    if required:
        merged["required"] = required
    return merged


def _types_of(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The JSON types one resolved alternative admits."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, list) and declared:
        return tuple(str(t) for t in declared)
    values: list[Any] = []
    if "const" in schema:
        values.append(schema["const"])
    if isinstance(schema.get("enum"), list):
        values += schema["enum"]
    if values:
        return tuple(sorted({_value_type(v) for v in values}))
    if "properties" in schema or "additionalProperties" in schema:
        return ("object",)
    if "items" in schema or "prefixItems" in schema:
        return ("array",)
    return ("any",)


def _value_type(value: Any) -> str:
    for cls, name in _TYPE_OF_VALUE:
        if isinstance(value, cls):
            return name
    return "any"


def _merge_types(schemas: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    found = {t for s in schemas for t in _types_of(s)}
    if "integer" in found and "number" in found:
        found.discard("integer")  # every integer is a number
    return tuple(t for t in JSON_TYPES if t in found) + tuple(sorted(found - set(JSON_TYPES)))


def _enum(alts: Sequence[_Alt]) -> tuple[str, ...]:
    """The allowed constants, when every non-null alternative is a constant (else none)."""
    values: set[str] = set()
    for a in alts:
        s = a.schema
        if _types_of(s) == ("null",) and "const" not in s and "enum" not in s:
            continue
        if "const" in s:
            values.add(json_text(s["const"]))
        elif isinstance(s.get("enum"), list):
            values.update(json_text(v) for v in s["enum"])
        else:
            return ()
    return tuple(sorted(values))


def _has_children(schema: Mapping[str, Any]) -> bool:
    types = _types_of(schema)
    if "object" in types:
        extra = schema.get("additionalProperties")
        if schema.get("properties") or (isinstance(extra, Mapping) and extra):
            return True
    return "array" in types


def _extra(schema: Mapping[str, Any]) -> BodyExtra:
    """How a pydantic model treats unknown fields, as its schema says."""
    extra = schema.get("additionalProperties")
    if extra is False:
        return "forbid"
    if extra is None:
        return "ignore"
    return "allow"
