"""Where a route's body shape comes from (scanner/inventory/_bodies.py), on a small FastAPI app
imported in a Python that has FastAPI (the real vLLM venv): FastAPI's body field (one model, a
union, embedded parameters, form fields), a handler's closure TypeAdapters, nothing reading
the body, and a raw Request parsed by the handler's own code."""

from __future__ import annotations

import pytest

from scanner.inventory import asgi
from scanner.inventory.asgi import AsgiExtraction
from scanner.inventory.model import Inventory, RequestBody

pytestmark = pytest.mark.vllm

APP = '''
from typing import Annotated, Literal
import pydantic
from fastapi import Body, FastAPI, Form, Request
from pydantic import BaseModel, ConfigDict
from starlette.routing import Route
from starlette.responses import PlainTextResponse


class Chat(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[dict[str, str]]
    max_tokens: int | None = 16


class Completion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str


class Speech(BaseModel):
    language: str = "en"


class Opaque:
    pass


class Odd(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    thing: Opaque


app = FastAPI()


@app.post("/v1/chat")
async def chat(request: Chat, raw_request: Request) -> dict:
    return {}


@app.post("/tokenize")
async def tokenize(request: Completion | Chat) -> dict:
    return {}


@app.post("/weights")
async def weights(version: Annotated[str, Body(embed=True)], force: Annotated[bool, Body()] = False) -> dict:
    return {}


@app.post("/speech")
async def speech(request: Annotated[Speech, Form()]) -> dict:
    return {}


@app.post("/odd")
async def odd(request: Odd) -> dict:
    return {}


def attach(app: FastAPI) -> None:
    VALIDATORS = [(pydantic.TypeAdapter(Chat), "chat"), (pydantic.TypeAdapter(Completion), "completion")]

    @app.post("/invocations")
    async def invocations(raw_request: Request) -> dict:
        body = await raw_request.json()
        for adapter, _ in VALIDATORS:
            try:
                adapter.validate_python(body)
            except pydantic.ValidationError:
                continue
        return {}


attach(app)


@app.get("/version")
async def version() -> dict:
    return {}


@app.post("/collective_rpc")
async def collective_rpc(raw_request: Request) -> dict:
    return await raw_request.json()


async def plain(request):
    return PlainTextResponse("x")


app.router.routes.append(Route("/plain", plain, methods=["POST"]))
'''


@pytest.fixture(scope="module")
def inventory(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    where = tmp_path_factory.mktemp("bodies")
    (where / "bodies_app.py").write_text(APP, encoding="utf-8")
    return asgi.extract(AsgiExtraction(target="bodies_app:app", python=vllm_python, app_dir=str(where)))


def body(inv: Inventory, path: str) -> RequestBody:
    route = next(r for r in inv.routes if r.path == path)
    assert route.request is not None, path
    return route.request


def test_one_model_checked_by_fastapi(inventory: Inventory) -> None:
    chat = body(inventory, "/v1/chat")
    assert (chat.source, chat.media_type, chat.models) == ("fastapi", "application/json", ("bodies_app.Chat",))
    assert chat.extra == "allow" and chat.types == ("object",)
    assert [(f.name, f.types, f.required, f.default) for f in chat.fields] == [
        ("messages", ("array",), True, None), ("max_tokens", ("integer", "null"), False, 16)]
    assert [n.path for n in chat.fields[0].nested] == ["messages[]", "messages[].*"]


def test_union_embedded_and_form_bodies(inventory: Inventory) -> None:
    tok = body(inventory, "/tokenize")
    assert tok.models == ("bodies_app.Completion", "bodies_app.Chat") and tok.extra == "mixed"
    assert {f.name for f in tok.fields} == {"prompt", "messages", "max_tokens"}
    assert not any(f.required for f in tok.fields)  # each is required by one alternative only
    weights = body(inventory, "/weights")
    assert weights.models == () and "embeds the body parameters" in weights.note
    assert [(f.name, f.required) for f in weights.fields] == [("version", True), ("force", False)]
    speech = body(inventory, "/speech")
    assert speech.models == ("bodies_app.Speech",) and "form fields" in speech.note
    assert speech.media_type == "application/x-www-form-urlencoded"


def test_handler_validators_none_and_unknown(inventory: Inventory) -> None:
    inv = body(inventory, "/invocations")
    assert inv.source == "handler" and "closure variable VALIDATORS" in inv.note
    assert inv.models == ("bodies_app.Chat", "bodies_app.Completion")
    assert {f.name for f in inv.fields} == {"messages", "max_tokens", "prompt"}
    assert body(inventory, "/version").source == "none"
    rpc = body(inventory, "/collective_rpc")
    assert rpc.source == "unknown" and rpc.fields == () and "raw Request" in rpc.note
    plain = body(inventory, "/plain")
    assert plain.source == "unknown" and "not a FastAPI route" in plain.note


def test_a_schema_pydantic_cannot_write_keeps_the_model_and_says_why(inventory: Inventory) -> None:
    odd = body(inventory, "/odd")
    assert odd.source == "fastapi" and odd.models == ("bodies_app.Odd",)
    assert odd.fields == () and odd.types == ()
    assert odd.note.startswith("JSON schema not generated: PydanticInvalidForJsonSchema")


def test_table_shows_the_field_counts(inventory: Inventory) -> None:
    from scanner.report.inventory import to_table

    table = to_table(inventory)
    row = next(line for line in table.splitlines() if "/v1/chat " in line)
    assert row.rstrip().endswith("│ 2      │")
    inv_row = next(line for line in table.splitlines() if "/invocations" in line)
    assert "3 *" in inv_row
