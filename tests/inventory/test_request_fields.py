"""Flattening a body's JSON Schema into field records: types, required, defaults, enums, nesting
(``a[].b.*``), $ref and anyOf/oneOf resolution, discriminated unions, the depth and recursion
bounds. The schemas are pydantic's, from small models (the worker hands over the same kind)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from scanner.inventory.request_fields import FlatBody, FlatField, flatten
from scanner.inventory.vllm_app import body_from_raw


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: dict[str, str]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]] | None = None
    name: str | None = None


class Node(BaseModel):
    """Recursive: a tree."""

    label: str
    children: list[Node] = []


class Chat(BaseModel):
    model_config = ConfigDict(extra="allow")

    messages: list[Message]
    max_tokens: int | None = 16
    temperature: float = 1.0
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    tree: Node | None = None
    pair: tuple[int, str] | None = None
    mode: Literal["fast", "slow"] = "fast"
    request_id: str = Field(default_factory=lambda: "generated")


def by_path(body: FlatBody) -> dict[str, FlatField]:
    return {f.path: f for f in body.fields}


def schema_of(tp: Any) -> dict[str, Any]:
    out: dict[str, Any] = TypeAdapter(tp).json_schema()
    return out


@pytest.fixture(scope="module")
def chat() -> dict[str, FlatField]:
    return by_path(flatten(schema_of(Chat)))


def test_top_level_fields_types_required_defaults(chat: dict[str, FlatField]) -> None:
    body = flatten(schema_of(Chat))
    assert body.types == ("object",) and body.extra == "allow"
    top = [f.path for f in body.fields if f.depth == 1]
    assert top == ["messages", "max_tokens", "temperature", "stop", "logit_bias",
                   "kv_transfer_params", "tree", "pair", "mode", "request_id"]  # schema order
    assert chat["messages"].types == ("array",) and chat["messages"].required
    assert chat["max_tokens"].types == ("integer", "null") and not chat["max_tokens"].required
    assert chat["max_tokens"].default == "16"  # canonical JSON text
    assert chat["temperature"].types == ("number",) and chat["temperature"].default == "1.0"
    assert chat["stop"].types == ("string", "null", "array") and chat["stop"].default == "null"
    assert chat["mode"].enum == ('"fast"', '"slow"') and chat["mode"].default == '"fast"'
    assert chat["request_id"].default is None  # default_factory: the schema states none
    assert chat["kv_transfer_params"].types == ("null", "object")
    assert "kv_transfer_params.*" not in chat  # dict[str, Any]: any value, nothing under it


def test_nested_paths_through_arrays_unions_and_maps(chat: dict[str, FlatField]) -> None:
    assert chat["messages[]"].types == ("object",)
    assert chat["messages[].role"].required and chat["messages[].role"].enum == (
        '"assistant"', '"system"', '"user"')
    assert chat["messages[].content"].types == ("string", "null", "array")
    part = chat["messages[].content[]"]
    assert part.types == ("object",)
    # discriminated union (oneOf + discriminator): both parts' properties, merged
    assert chat["messages[].content[].type"].enum == ('"image_url"', '"text"')
    assert chat["messages[].content[].type"].required  # every part requires it
    assert not chat["messages[].content[].text"].required  # only TextPart has it
    assert chat["messages[].content[].image_url"].types == ("object",)
    assert chat["messages[].content[].image_url.*"].types == ("string",)
    assert chat["stop[]"].types == ("string",)
    assert chat["logit_bias.*"].types == ("number",)
    assert chat["pair[]"].types == ("string", "integer")  # prefixItems: either position
    assert chat["messages[].content[].image_url.*"].depth == 6


def test_recursive_ref_is_expanded_once(chat: dict[str, FlatField]) -> None:
    assert chat["tree.label"].required
    assert chat["tree.children"].types == ("array",)
    inner = chat["tree.children[]"]
    assert inner.types == ("object",) and inner.truncated == "recursion"
    assert not any(p.startswith("tree.children[].") for p in chat)


def test_depth_bound_cuts_and_says_so() -> None:
    shallow = by_path(flatten(schema_of(Chat), max_depth=3))
    assert shallow["messages[].content"].truncated == "depth"
    assert "messages[].content[]" not in shallow
    assert all(f.depth <= 3 for f in shallow.values())
    assert shallow["messages[].name"].truncated == ""  # a scalar has nothing to cut


def test_all_of_single_ref_and_nullable_union_of_models() -> None:
    class Inner(BaseModel):
        x: int

    class Outer(BaseModel):
        a: Inner | None = None
        b: Inner = Inner(x=1)

    flat = by_path(flatten(schema_of(Outer)))
    assert flat["a"].types == ("null", "object") and flat["a.x"].required
    assert flat["b"].types == ("object",) and flat["b"].default == '{"x":1}'
    # the older pydantic shape: {"allOf": [{"$ref": ...}], "default": ...}
    legacy = {"type": "object", "properties": {"b": {"allOf": [{"$ref": "#/$defs/I"}], "default": {"x": 1}}},
              "$defs": {"I": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
    flat = by_path(flatten(legacy))
    assert flat["b"].types == ("object",) and flat["b.x"].required and flat["b"].default == '{"x":1}'


def test_union_body_merges_models_and_their_extra() -> None:
    class A(BaseModel):
        model_config = ConfigDict(extra="forbid")
        prompt: str
        shared: int

    class B(BaseModel):
        messages: list[str]
        shared: int | None = None

    body = flatten(schema_of(A | B))
    flat = by_path(body)
    assert body.types == ("object",) and body.extra == "mixed"
    assert set(flat) == {"prompt", "shared", "messages", "messages[]"}
    assert not flat["prompt"].required  # B has no prompt: a body without it is valid
    assert not flat["shared"].required
    assert flat["shared"].types == ("integer", "null")
    assert flat["shared"].default is None  # stated by B only: not the default of the route


def test_non_object_bodies_and_odd_schemas() -> None:
    assert flatten({"type": "string"}) == FlatBody(types=("string",), extra="", fields=())
    assert flatten({}).types == ("any",)
    assert flatten({"$ref": "#/$defs/Missing"}).types == ("any",)  # an unresolvable $ref
    arr = flatten({"type": "array"})
    assert arr.types == ("array",) and arr.fields[0].path == "[]" and arr.fields[0].types == ("any",)
    mixed = by_path(flatten({"type": "object", "properties": {"n": {"type": ["integer", "number"]},
                                                              "c": {"const": 3}}}))
    assert mixed["n"].types == ("number",)  # every integer is a number
    assert mixed["c"].types == ("integer",) and mixed["c"].enum == ("3",)


def test_worker_description_becomes_a_request_body() -> None:
    body = body_from_raw({"source": "fastapi", "media_type": "application/json",
                          "models": ["m.Chat"], "schema": schema_of(Chat)})
    assert body.known and body.models == ("m.Chat",) and body.extra == "allow"
    names = [f.name for f in body.fields]
    assert names[0] == "messages" and "kv_transfer_params" in names
    msgs = body.top_field("messages")
    assert msgs is not None and msgs.required
    assert [n.path for n in msgs.nested][:3] == ["messages[]", "messages[].role", "messages[].content"]
    assert "messages[].content[].image_url.*" in body.positions()
    unknown = body_from_raw({"source": "unknown", "note": "raw"})
    assert not unknown.known and unknown.fields == () and unknown.note == "raw"
    odd = body_from_raw({"source": "bogus"})
    assert odd.source == "unknown"
