"""The inventory document: validation on load, content hash, round trip, guard rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scanner.errors import EXIT_USAGE, InventoryFormatError
from scanner.inventory import model
from scanner.inventory.model import (
    Inventory,
    NestedField,
    RequestBody,
    RequestField,
    Route,
    Source,
    VllmFacts,
)


def sample() -> Inventory:
    return Inventory(
        source=Source(kind="vllm", target="vllm==0.29.0"),
        routes=(
            Route("/v1/models", ("GET",), "http", "m.show", True),
            Route("/metrics", ("*",), "mount", "prom.app", False),
            Route("/v1/realtime", ("GET",), "websocket", "m.rt", True),
            Route("/health", ("GET",), "http", "m.health", False),
        ),
        vllm=VllmFacts(version="0.29.0", serve_args=("--model", "m"), tasks=("generate",),
                       env={"VLLM_SERVER_DEV_MODE": "1"}),
        middleware=("starlette.middleware.cors.CORSMiddleware",),
    )


def doc() -> dict[str, Any]:
    return sample().to_dict()


def test_round_trip_is_identical_and_hash_stable() -> None:
    inv = sample()
    text = inv.to_json()
    again = model.loads(text)
    assert again == inv
    assert again.to_json() == text
    assert again.content_hash == inv.content_hash
    assert json.loads(text)["content_hash"] == inv.content_hash
    assert inv.content_hash.startswith("sha256:") and len(inv.content_hash) == 7 + 64


def test_routes_are_sorted_whatever_the_input_order() -> None:
    inv = sample()
    assert [r.path for r in inv.routes] == ["/health", "/metrics", "/v1/models", "/v1/realtime"]
    shuffled = inv.with_routes(tuple(reversed(inv.routes)))
    assert shuffled.content_hash == inv.content_hash


def test_file_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "inv.json"
    p.write_text(sample().to_json(), encoding="utf-8")
    assert model.load(p) == sample()


def test_edited_file_fails_the_hash_check() -> None:
    d = doc()
    d["routes"][0]["guarded"] = True  # /health made to look guarded
    with pytest.raises(InventoryFormatError, match=r"content_hash .* does not match"):
        model.from_dict(d, name="edited.json")


def test_document_without_hash_is_accepted_and_gets_one() -> None:
    d = doc()
    del d["content_hash"]
    assert model.from_dict(d).content_hash == sample().content_hash


def _without_hash(mutate: Any) -> dict[str, Any]:
    d = doc()
    del d["content_hash"]
    mutate(d)
    return d


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(schema_version=2), "schema_version: Input should be 1"),
    (lambda d: d.pop("schema_version"), "schema_version: Field required"),
    (lambda d: d.update(source={"kind": "ftp"}), "source.kind: Input should be 'vllm'"),
    (lambda d: d.update(routes={}), "routes: Input should be a valid list"),
    (lambda d: d["routes"][0].update(path="health"), r"routes\[0\].path: String should match pattern '\^/'"),
    (lambda d: d["routes"][0].update(methods=[]), r"routes\[0\].methods: List should have at least 1 item"),
    (lambda d: d["routes"][0].update(methods=["GE T"]), r"routes\[0\].methods\[0\]: String should match"),
    (lambda d: d["routes"][0].update(methods="GET"), r"routes\[0\].methods: Input should be a valid list"),
    (lambda d: d["routes"][0].update(kind="grpc"), r"routes\[0\].kind: Input should be 'http'"),
    (lambda d: d["routes"][0].update(guarded="yes"), r"routes\[0\].guarded: Input should be a valid boolean"),
    (lambda d: d["vllm"].update(tasks="generate"), "vllm.tasks: Input should be a valid list"),
    (lambda d: d["vllm"].update(version=29), "vllm.version: Input should be a valid string"),
    (lambda d: d.update(middleware=[1]), r"middleware\[0\]: Input should be a valid string"),
    (lambda d: d["routes"][0].update(colour="red"), r"routes\[0\].colour: Extra inputs are not permitted"),
])
def test_validation_names_the_field(mutate: Any, message: str) -> None:
    with pytest.raises(InventoryFormatError, match=message) as exc:
        model.from_dict(_without_hash(mutate), name="x.json")
    assert str(exc.value).startswith("x.json: invalid inventory: ")
    assert exc.value.exit_code == EXIT_USAGE


def test_not_json_gives_line_number(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{\n  "schema_version": 1,\n  oops\n}\n', encoding="utf-8")
    with pytest.raises(InventoryFormatError, match=r"bad.json:3: not valid JSON"):
        model.load(p)


def test_top_level_not_an_object() -> None:
    with pytest.raises(InventoryFormatError, match="document: Input should be a valid dictionary"):
        model.loads("[]")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryFormatError, match="cannot read inventory"):
        model.load(tmp_path / "nope.json")


def test_methods_are_normalised_on_load() -> None:
    d = _without_hash(lambda d: d["routes"][0].update(methods=["post", "get", "GET"]))
    assert model.from_dict(d).routes[0].methods == ("GET", "POST")


@pytest.mark.parametrize(("path", "root", "guarded"), [
    ("/v1/models", "", True),
    ("/v2/rerank", "", True),
    ("/inference/v1/generate", "", True),
    ("/cohere/v1/chat", "", True),
    ("/health", "", False),
    ("/invocations", "", False),
    ("/v10/x", "", True),  # vLLM uses a plain startswith: /v10 is "guarded" too
    ("/api/v1/models", "/api", True),
    ("/api/health", "/api", False),
    ("/v1x", "", True),
])
def test_guard_rule_is_vllms_startswith(path: str, root: str, guarded: bool) -> None:
    assert model.is_guarded(path, model.VLLM_GUARDED_PREFIXES, root) is guarded


# --- request bodies ------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent.parent
OLD_FORMAT = REPO / "tests" / "generate" / "golden" / "nginx" / "inventory-vllm-0.29.0-everything.json"


def with_bodies() -> Inventory:
    chat = RequestBody(
        source="fastapi", media_type="application/json", models=("m.ChatCompletionRequest",),
        types=("object",), extra="allow",
        fields=(
            RequestField("messages", ("array",), required=True, nested=(
                NestedField("messages[]", ("object",)),
                NestedField("messages[].content", ("string", "array")),
                NestedField("messages[].content[].type", ("string",), required=True,
                            enum=('"image_url"', '"text"')),
                NestedField("messages[].tree", ("object",), truncated="recursion"),
            )),
            RequestField("max_tokens", ("integer", "null"), default_json="null"),
            RequestField("n", ("integer",), default_json="1"),
            RequestField("request_id", ("string",)),  # no default stated
        ))
    routes = (*sample().routes,
              Route("/v1/chat/completions", ("POST",), "http", "m.chat", True, request=chat),
              Route("/version", ("GET",), "http", "m.v", False,
                    request=RequestBody("none", note="nothing reads the body")))
    return sample().with_routes(routes)


def test_old_documents_without_request_bodies_still_load_with_their_hash() -> None:
    text = OLD_FORMAT.read_text(encoding="utf-8")
    assert '"request"' not in text
    inv = model.loads(text)  # validates the recorded content_hash against the content
    assert inv.content_hash == json.loads(text)["content_hash"]
    assert all(r.request is None for r in inv.routes)
    assert inv.to_json() == text
    assert "request" not in sample().to_dict()["routes"][0]  # absent, not null


def test_request_bodies_round_trip() -> None:
    inv = with_bodies()
    text = inv.to_json()
    again = model.loads(text)
    assert again == inv and again.to_json() == text
    chat = next(r for r in again.routes if r.path == "/v1/chat/completions").request
    assert chat is not None and chat.known
    data = json.loads(text)
    as_doc = next(r for r in data["routes"] if r["path"] == "/v1/chat/completions")["request"]
    fields = {f["name"]: f for f in as_doc["fields"]}
    assert fields["max_tokens"] == {"name": "max_tokens", "types": ["integer", "null"], "default": None}
    assert fields["request_id"] == {"name": "request_id", "types": ["string"]}  # no default key
    assert fields["messages"]["nested"][2]["enum"] == ["image_url", "text"]
    top = chat.top_field("max_tokens")
    assert top is not None and top.default is None and top.default_json == "null"
    assert chat.positions()["messages[].tree"].truncated == "recursion"
    assert inv.content_hash != inv.with_routes(sample().routes).content_hash


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b.update(source="guess"), r"request.source: Input should be 'fastapi'"),
    (lambda b: b["fields"][0].update(types=[]), r"request.fields\[0\].types: List should have at least 1"),
    (lambda b: b["fields"][0].update(name=""), r"request.fields\[0\].name: String should have at least"),
    (lambda b: b["fields"][0]["nested"][0].update(truncated="deep"),
     r"request.fields\[0\].nested\[0\].truncated: Input should be"),
    (lambda b: b.update(extra="maybe"), r"request.extra: Input should be"),
])
def test_request_body_validation_names_the_field(mutate: Any, message: str) -> None:
    d = with_bodies().to_dict()
    del d["content_hash"]
    mutate(next(r for r in d["routes"] if r["path"] == "/v1/chat/completions")["request"])
    with pytest.raises(InventoryFormatError, match=message):
        model.from_dict(d, name="x.json")
