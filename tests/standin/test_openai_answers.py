"""The stand-in's OpenAI-shaped answers (scanner/standin/openai_answers.py): read by the official
``openai`` client (over ASGI, no server), checked against vLLM 0.29's own response models, and the
plain answer kept for everything else."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scanner.inventory.catalog import load_ref
from scanner.standin import openai_answers as oa
from scanner.standin.app import build_app

openai = pytest.importorskip("openai")
httpx2 = pytest.importorskip("httpx2")
pydantic = pytest.importorskip("pydantic")

ORACLE = Path(__file__).with_name("vllm_answer_oracle.py")
INVENTORY = load_ref("vllm-0.29.0-everything")
MESSAGES = [{"role": "user", "content": "hello"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 3}},
    "required": ["city", "days"]}}}


class Person(pydantic.BaseModel):
    name: str
    age: int
    tags: list[str]
    address: Address


class Address(pydantic.BaseModel):
    street: str
    zip: int | None


Person.model_rebuild()


def _client() -> Any:
    app, _ = build_app(INVENTORY, stream_delay=0)
    return openai.AsyncOpenAI(base_url="http://standin/v1", api_key="k", max_retries=0,
                              http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)))


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _body_bytes(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()


def test_chat_n_budget_and_usage_read_as_vllm_reads_them() -> None:
    async def go() -> Any:
        return await _client().chat.completions.create(model="m", messages=MESSAGES, n=" 3 ",  # type: ignore[arg-type]
                                                       max_completion_tokens="4", max_tokens=9)  # type: ignore[arg-type]
    r = _run(go())
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == ["".join(oa.words(4, i)) for i in range(3)]
    assert {c.finish_reason for c in r.choices} == {"length"}      # the budget cut it short
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == r.usage.prompt_tokens + 12
    body = {"model": "m", "messages": MESSAGES, "n": " 3 ", "max_completion_tokens": "4", "max_tokens": 9}
    assert r.usage.prompt_tokens <= len(_body_bytes(body)) + 16


def test_chat_without_budget_stops_naturally() -> None:
    r = _run(_client().chat.completions.create(model="m", messages=MESSAGES))
    assert r.choices[0].message.content == "".join(oa.words(oa.NATURAL_TOKENS))
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == oa.NATURAL_TOKENS
    assert r.model == "m" and r.object == "chat.completion"


def _chunks(**kw: Any) -> list[Any]:
    async def go() -> list[Any]:
        stream = await _client().chat.completions.create(model="m", messages=MESSAGES, stream=True, **kw)
        return [c async for c in stream]
    return list(_run(go()))


def test_chat_stream_usage_event_only_when_asked() -> None:
    plain = _chunks(n=2, max_tokens=3)
    assert all(c.usage is None and c.choices for c in plain)
    text = {i: "".join(c.choices[0].delta.content or "" for c in plain if c.choices[0].index == i) for i in (0, 1)}
    assert text == {i: "".join(oa.words(3, i)) for i in (0, 1)}
    assert plain[0].choices[0].delta.role == "assistant"
    asked = _chunks(n=2, max_tokens=3, stream_options={"include_usage": True})
    assert [c for c in asked if c.usage is not None] == [asked[-1]]
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 6
    assert len(asked) == len(plain) + 1
    continuous = _chunks(max_tokens=3, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert all(c.usage is not None for c in continuous)
    assert [c.usage.completion_tokens for c in continuous] == [0, 1, 2, 3, 3]
    # continuous_usage_stats alone does nothing (vLLM's should_include_usage)
    assert all(c.usage is None for c in _chunks(max_tokens=3, stream_options={"continuous_usage_stats": True}))


def test_structured_output_parses() -> None:
    r = _run(_client().chat.completions.parse(model="m", messages=MESSAGES, response_format=Person))
    person = r.choices[0].message.parsed
    assert person == Person(name="x", age=1, tags=[], address=Address(street="x", zip=1))
    obj = _run(_client().chat.completions.create(model="m", messages=MESSAGES,
                                                 response_format={"type": "json_object"}))
    assert json.loads(obj.choices[0].message.content) == {}


def test_structured_output_streamed_parses() -> None:
    async def go() -> Any:
        async with _client().chat.completions.stream(model="m", messages=MESSAGES, response_format=Person) as s:
            return await s.get_final_completion()
    assert _run(go()).choices[0].message.parsed.address.street == "x"


def test_tool_call() -> None:
    r = _run(_client().chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER]))
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "x", "days": 3}
    other = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    named = _run(_client().chat.completions.create(
        model="m", messages=MESSAGES, tools=[WEATHER, other],
        tool_choice={"type": "function", "function": {"name": "other"}}))
    assert named.choices[0].message.tool_calls[0].function.name == "other"
    assert named.choices[0].finish_reason == "stop"      # vLLM: a named tool call finishes with stop
    none = _run(_client().chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER], tool_choice="none"))
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content


def test_tool_call_streamed() -> None:
    async def go() -> Any:
        async with _client().chat.completions.stream(
                model="m", messages=MESSAGES, tools=[openai.pydantic_function_tool(Person)]) as s:
            return await s.get_final_completion()
    call = _run(go()).choices[0].message.tool_calls[0]
    assert call.function.parsed_arguments == Person(name="x", age=1, tags=[], address=Address(street="x", zip=1))


def test_chat_batch_one_choice_per_conversation() -> None:
    body = {"messages": [MESSAGES, MESSAGES, [{"role": "user", "content": "x"}]], "max_tokens": 2}
    a = oa.answer("/v1/chat/completions/batch", body, _body_bytes(body))
    assert isinstance(a, oa.Json)
    assert [c["message"]["content"] for c in a.body["choices"]] == ["".join(oa.words(2, i)) for i in range(3)]
    assert a.body["usage"]["completion_tokens"] == 6
    for refused in ({**body, "stream": True}, {**body, "n": 2}, {**body, "tools": [WEATHER]},
                    {"messages": [[]]}, {"messages": MESSAGES}):
        assert oa.answer("/v1/chat/completions/batch", refused, _body_bytes(refused)) is None, refused


def test_completions_prompt_list_and_stream() -> None:
    r = _run(_client().completions.create(model="m", prompt=["a", "b"], n=2, max_tokens=2))
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == ["".join(oa.words(2, i)) for i in range(4)]
    assert r.usage.completion_tokens == 8

    async def go(**kw: Any) -> list[Any]:
        stream = await _client().completions.create(model="m", prompt="a", max_tokens=3, stream=True, **kw)
        return [c async for c in stream]
    plain = _run(go())
    assert all(c.usage is None for c in plain) and "".join(c.choices[0].text for c in plain) == "".join(oa.words(3))
    asked = _run(go(stream_options={"include_usage": True}))
    assert [c for c in asked if c.usage is not None] == [asked[-1]] and asked[-1].choices == []
    assert asked[-1].usage.completion_tokens == 3
    ids = _run(_client().completions.create(model="m", prompt=[1, 2, 3]))
    assert len(ids.choices) == 1           # one prompt of token ids


def test_embeddings_float_base64_and_dimensions() -> None:
    r = _run(_client().embeddings.create(model="m", input=["a", "b", "c"]))   # the client asks base64
    assert [d.embedding for d in r.data] == [oa.vector(i) for i in range(3)]
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0
    f = _run(_client().embeddings.create(model="m", input="a", encoding_format="float", dimensions=4))
    assert f.data[0].embedding == oa.vector(0, 4)
    raw = oa.answer("/v1/embeddings", {"input": "a", "encoding_format": "base64"}, b"{}")
    assert isinstance(raw, oa.Json)
    packed = base64.b64decode(raw.body["data"][0]["embedding"])
    assert list(struct.unpack("<8f", packed)) == oa.vector(0)


def test_responses_plain_stream_and_structured() -> None:
    r = _run(_client().responses.create(model="m", input="hi", max_output_tokens=16))
    assert r.output_text == "".join(oa.words(oa.NATURAL_TOKENS)) and r.status == "completed"
    assert r.usage.output_tokens == oa.NATURAL_TOKENS and r.usage.total_tokens == r.usage.input_tokens + 10

    async def go() -> list[Any]:
        stream = await _client().responses.create(model="m", input="hi", stream=True, max_output_tokens=3)
        return [e async for e in stream]
    events = _run(go())
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds.count("response.output_text.delta") == 3 and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.usage.output_tokens == 3 and events[-1].response.status == "incomplete"

    async def parsed() -> Any:
        async with _client().responses.stream(model="m", input="hi", text_format=Person) as s:
            return await s.get_final_response()
    assert _run(parsed()).output_parsed.age == 1


def test_sse_framing_is_vllms() -> None:
    a = oa.answer("/v1/responses", {"input": "x", "stream": True, "max_output_tokens": 1}, b"{}")
    assert isinstance(a, oa.Stream)
    frames = [f for step in a.steps for f in step]
    assert all(f.startswith("event: response.") and "\ndata: {" in f and f.endswith("\n\n") for f in frames)
    assert not any("[DONE]" in f for f in frames)       # vLLM ends a Responses stream without it
    c = oa.answer("/v1/chat/completions", {"messages": [], "stream": "yes"}, b"{}")   # a bool as pydantic reads
    assert isinstance(c, oa.Stream) and c.steps[-1][-1] == oa.DONE
    assert all(f.startswith("data: ") for step in c.steps for f in step)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": MESSAGES, "n": 0}),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": "1e1"}),
    ("/v1/chat/completions", {"messages": MESSAGES, "stream": "maybe"}),
    ("/v1/chat/completions", {"n": 1}),
    ("/v1/completions", {"prompt": []}),
    ("/v1/embeddings", {"input": []}),
    ("/v1/responses", {"model": "m"}),
    ("/v1/models", {"messages": MESSAGES}),
])
def test_bodies_not_shaped(path: str, body: dict[str, Any]) -> None:
    assert oa.answer(path, body, _body_bytes(body)) is None


def test_plain_answer_kept_elsewhere() -> None:
    async def go() -> list[httpx.Response]:
        app, _ = build_app(INVENTORY, stream_delay=0)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as c:
            return [await c.post("/v1/chat/completions"),                                   # no body
                    await c.post("/v1/chat/completions", content=b"[1]"),                   # not an object
                    await c.post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}),
                    await c.post("/v1/chat/completions", json={"messages": MESSAGES},
                                 headers={"content-type": "text/plain"}),                  # vLLM reads no JSON
                    await c.post("/v1/chat/completions", json={"messages": MESSAGES, "n": -1}),
                    await c.post("/tokenize", json={"prompt": "x"}),
                    await c.get("/v1/models")]
    for r in _run(go()):
        assert r.status_code == 200 and r.json()["standin"] is True, r.text


def _timed_frames(delay: float, body: dict[str, Any]) -> list[tuple[float, bytes]]:
    app, _ = build_app(INVENTORY, stream_delay=delay)
    raw = _body_bytes(body)
    got: list[tuple[float, bytes]] = []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            got.append((time.monotonic(), message["body"]))

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("s", 80), "client": ("c", 1), "root_path": ""}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    return got


def test_stream_steps_spaced_by_the_delay() -> None:
    frames = _timed_frames(0.03, {"messages": MESSAGES, "stream": True, "max_tokens": 4})
    assert len(frames) == 5           # the role step, then a step per token
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(frames)]
    assert min(gaps) >= 0.025, gaps
    assert frames[-1][1].endswith(oa.DONE.encode())


def test_instance_of_schemas() -> None:
    schema = {"$defs": {"A": {"type": "object", "properties": {"k": {"enum": ["b", "a"]}}, "required": ["k"]}},
              "type": "object", "required": ["a", "n", "f", "l", "c", "u", "o", "s"],
              "properties": {"a": {"$ref": "#/$defs/A"}, "n": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
                             "f": {"type": "number", "exclusiveMinimum": 2.5}, "l": {"type": "array", "minItems": 2,
                                                                                      "items": {"type": "boolean"}},
                             "c": {"const": 7}, "u": {"type": ["null", "string"], "minLength": 3},
                             "o": {"type": "integer", "maximum": -4}, "s": {"type": "string", "format": "date"}}}
    assert oa.instance(schema) == {"a": {"k": "b"}, "n": 1, "f": 3.5, "l": [True, True], "c": 7, "u": "xxx",
                                   "o": -4, "s": "1970-01-01"}
    loop: dict[str, Any] = {"$ref": "#"}
    assert oa.instance(loop) is None        # a reference cycle ends at the depth bound


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 20) | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=8)
FIELDS = ("messages", "prompt", "input", "n", "stream", "stream_options", "max_tokens", "max_completion_tokens",
          "max_output_tokens", "tools", "tool_choice", "response_format", "text", "encoding_format", "dimensions",
          "model", "temperature")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(oa.ROUTES), st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6))
def test_any_body_gets_an_answer_or_none(path: str, body: dict[str, Any]) -> None:
    a = oa.answer(path, body, _body_bytes(body))
    if isinstance(a, oa.Json):
        json.dumps(a.body)
    elif isinstance(a, oa.Stream):
        assert a.steps and all(isinstance(f, str) for s in a.steps for f in s)


def _docs() -> list[dict[str, Any]]:
    """Each shape this module sends (every stream event on its own)."""
    tools = {"messages": MESSAGES, "tools": [WEATHER]}
    cases = [("chat", "/v1/chat/completions", {"messages": MESSAGES, "n": 2}),
             ("chat", "/v1/chat/completions", tools),
             ("chat", "/v1/chat/completions/batch", {"messages": [MESSAGES, MESSAGES]}),
             ("chat", "/v1/chat/completions", {"messages": MESSAGES, "response_format": {
                 "type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}}}),
             ("chat.chunk", "/v1/chat/completions", {"messages": MESSAGES, "n": 2, "stream": True, "stream_options": {
                 "include_usage": True, "continuous_usage_stats": True}}),
             ("chat.chunk", "/v1/chat/completions", {**tools, "stream": True, "max_tokens": 2}),
             ("completion", "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3}),
             ("completion.chunk", "/v1/completions", {"prompt": ["a", "b"], "stream": True, "stream_options": {
                 "include_usage": True, "continuous_usage_stats": True}}),
             ("embedding", "/v1/embeddings", {"input": ["a", "b"], "encoding_format": "base64"}),
             ("embedding", "/v1/embeddings", {"input": "a"}),
             ("response", "/v1/responses", {"input": "hi"}),
             ("response", "/v1/responses", {"input": "hi", "max_output_tokens": 2}),
             ("response.event", "/v1/responses", {"input": "hi", "stream": True, "max_output_tokens": 3})]
    out: list[dict[str, Any]] = []
    for kind, path, body in cases:
        a = oa.answer(path, body, _body_bytes(body))
        docs = [a.body] if isinstance(a, oa.Json) else [
            json.loads(line[6:]) for step in (a.steps if a else ()) for frame in step
            for line in frame.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]
        assert docs, (kind, body)
        out += [{"id": f"{len(out) + i}", "kind": kind, "doc": d} for i, d in enumerate(docs)]
    return out


def test_shapes_are_vllms_own(vllm_python: str) -> None:
    """Every answer and stream event validates against vLLM 0.29's response models."""
    docs = _docs()
    done = subprocess.run([vllm_python, str(ORACLE)], input="".join(json.dumps(d) + "\n" for d in docs),
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(ln[7:]) for ln in done.stdout.splitlines() if ln.startswith("ORACLE ")]
    assert len(rows) == len(docs)
    bad = [(docs[int(r["id"])]["kind"], r["error"][:300]) for r in rows if not r["valid"]]
    assert not bad, bad
