"""OpenAI-shaped answers of the stand-in for vLLM's inference routes, shaped as vLLM 0.29 sends them.

The stand-in (``scanner.standin.app``) answers a JSON-object body on these routes with them; every
other request keeps its ``{"standin": true, ...}`` answer:

* ``POST /v1/chat/completions``: a ``chat.completion`` with ``n`` choices (``n`` read as vLLM reads
  an integer, :func:`scanner.plan.vllm_json.vllm_int`); with ``tools`` (``tool_choice`` not
  ``"none"``) a call of the first tool (or the named one) whose arguments are a minimal instance of
  its ``parameters``; with ``response_format`` ``json_schema`` a minimal instance of the schema
  (:func:`instance`: every required property, a value of its type), ``json_object`` ``{}``.
* ``POST /v1/chat/completions/batch``: the same, one choice per conversation (never streamed).
* ``POST /v1/completions``: a ``text_completion`` with prompts x ``n`` choices (a prompt list runs
  each prompt; choice index ``output.index + prompt_index * n`` as vLLM numbers them).
* ``POST /v1/embeddings``: one short deterministic vector per input item (``encoding_format``
  ``base64``: little-endian float32, as vLLM and the openai client's default).
* ``POST /v1/responses``: a ``response`` with one output message (``text.format`` ``json_schema``
  honoured as for chat).

Tokens: each choice generates ``min(budget, NATURAL_TOKENS)`` tokens, the budget being the first of
``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens`` present (vLLM's integer reading;
absent: :data:`NATURAL_TOKENS`); a choice cut short by it ends with ``finish_reason`` ``"length"``
(the Responses API: ``status`` ``"incomplete"``). The prompt is ``max(1, body bytes // 4)`` tokens
(never above the body's size). Every non-streamed answer carries ``usage`` summed over its choices.

Streams (``"stream"`` read as pydantic reads a bool): ``text/event-stream``, one ``data:`` event per
token per choice (chat opens each choice with a role event), the steps spaced by ``delay`` seconds
(:data:`STREAM_DELAY_S` unless the stand-in was started with another: ``build_app(stream_delay=)``,
``StandinThread(stream_delay=)``, ``vllm-perimeter standin --stream-delay-ms``), then
``data: [DONE]``. The usage-only event (``"choices": []`` with ``usage``) comes last, only when the
body asks ``stream_options.include_usage``; with ``continuous_usage_stats`` too every event carries
the usage so far (vLLM's ``should_include_usage``). The Responses API streams its typed events
(``event: <type>`` lines, ``response.created`` ... ``response.completed`` carrying
``response.usage``) and no ``[DONE]``, as vLLM does.

A body vLLM would refuse on a field read here (``n`` below 1 or not an integer, an empty prompt
list, ``stream`` not a bool) gets no shaped answer (the stand-in's plain one). At most
:data:`MAX_CHOICES` choices (or embedding vectors) are sent: the stand-in stays cheap whatever a
probe sends.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scanner.plan.vllm_json import vllm_int

STREAM_DELAY_S = 0.002      # default spacing of a stream's steps (seconds)
NATURAL_TOKENS = 10         # tokens a choice generates when no budget stops it earlier
MAX_CHOICES = 64            # choices (prompts x n) or embedding vectors actually sent
EMBEDDING_SIZE = 8
MAX_DIMENSIONS = 64
MAX_MODEL_LEN = 8192        # the context length the Responses API's max_output_tokens default reads
MAX_SCHEMA_DEPTH = 16
BUDGET_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
ROUTES = ("/v1/chat/completions", "/v1/chat/completions/batch", "/v1/completions", "/v1/embeddings",
          "/v1/responses")
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


@dataclass(frozen=True)
class Json:
    """A JSON answer."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Stream:
    """A ``text/event-stream`` answer: the frames of each step, sent ``delay`` apart."""

    steps: tuple[tuple[str, ...], ...]
    final: dict[str, Any] | None = None     # a Responses stream's completed response (kept if stored)


Answer = Json | Stream


def answer(path: str, body: object, raw: bytes) -> Answer | None:
    """The answer vLLM would shape for ``body`` (the decoded JSON of ``raw``) on the inference
    route ``path``; None: not such a route, or a body this module does not shape."""
    if not isinstance(body, Mapping):
        return None
    shape = _SHAPES.get(path)
    return shape(body, raw) if shape is not None else None


# --- how vLLM reads the fields -------------------------------------------------------------------

def vllm_bool(value: object) -> bool | None:
    """A bool field as pydantic's lax mode reads it; None: refused."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        return True if text in _TRUE else False if text in _FALSE else None
    return None


def _flag(body: Mapping[str, Any], name: str) -> bool | None:
    """An optional bool field (absent or null: False); None: refused."""
    value = body.get(name)
    return False if value is None else vllm_bool(value)


def output_budget(body: Mapping[str, Any]) -> int | None:
    """The first output budget the body sets (:data:`BUDGET_FIELDS`); None: none readable."""
    for name in BUDGET_FIELDS:
        if body.get(name) is not None:
            return vllm_int(body[name])
    return None


def tokens_per_choice(body: Mapping[str, Any]) -> int:
    budget = output_budget(body)
    return NATURAL_TOKENS if budget is None else max(0, min(budget, NATURAL_TOKENS))


def prompt_tokens(size: int) -> int:
    return max(1, size // 4)


def sequences(body: Mapping[str, Any]) -> int | None:
    """``n`` (absent or null: 1); None when vLLM would refuse it."""
    n = 1 if body.get("n") is None else vllm_int(body["n"])
    return n if n is not None and n >= 1 else None


def include_usage(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(the usage event at the end, usage in every event) as vLLM's should_include_usage."""
    options = body.get("stream_options")
    if not isinstance(options, Mapping):
        return False, False
    usage = vllm_bool(options.get("include_usage")) is True
    return usage, usage and vllm_bool(options.get("continuous_usage_stats")) is True


def _finish(tokens: int) -> str:
    return "length" if tokens < NATURAL_TOKENS else "stop"


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else "standin"


def _ident(prefix: str, raw: bytes) -> str:
    return f"{prefix}-{hashlib.sha256(raw).hexdigest()[:24]}"


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


# --- what is generated ---------------------------------------------------------------------------

def words(tokens: int, index: int = 0) -> tuple[str, ...]:
    """The plain text of choice ``index``, one piece per token."""
    return tuple(f"{' ' if k else ''}c{index}t{k}" for k in range(tokens))


def split(text: str, tokens: int) -> tuple[str, ...]:
    """``text`` in exactly ``tokens`` pieces (some empty when the text is short; none for 0)."""
    if tokens <= 0:
        return ()
    cuts = [round(len(text) * k / tokens) for k in range(tokens + 1)]
    return tuple(text[cuts[k]:cuts[k + 1]] for k in range(tokens))


def instance(schema: object, root: object = None, depth: int = 0) -> Any:
    """A minimal JSON instance of ``schema``: an object's required properties, each a value of its
    type (strings ``"x"``, numbers 1, within the schema's bounds), enums and consts their first
    value, ``anyOf`` / ``oneOf`` their first non-null branch, ``$ref`` into ``$defs``."""
    root = schema if root is None else root
    if depth > MAX_SCHEMA_DEPTH or not isinstance(schema, Mapping):
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return instance(_resolve(root, ref), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            pick = next((b for b in branches if not (isinstance(b, Mapping) and b.get("type") == "null")),
                        branches[0])
            return instance(pick, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _of_type(kind, schema, root, depth)


def _of_type(kind: object, schema: Mapping[str, Any], root: object, depth: int) -> Any:
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        names = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        return {name: instance(props.get(name, {}), root, depth + 1) for name in names}
    if kind == "array":
        count = vllm_int(schema.get("minItems", 0)) or 0
        return [instance(schema.get("items", {}), root, depth + 1) for _ in range(min(count, 16))]
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema)


def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
    value: float = 1
    low, high = schema.get("minimum"), schema.get("maximum")
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(low, int | float) and value < low:
        value = low
    if isinstance(ex_low, int | float) and value <= ex_low:
        value = ex_low + 1
    if isinstance(high, int | float) and value > high:
        value = high
    if isinstance(ex_high, int | float) and value >= ex_high:
        value = ex_high - 1
    return math.ceil(value) if integer else float(value)


_FORMATS = {"date-time": "1970-01-01T00:00:00Z", "date": "1970-01-01", "time": "00:00:00Z",
            "email": "x@example.com", "uri": "https://example.com/",
            "uuid": "00000000-0000-0000-0000-000000000000"}


def _string(schema: Mapping[str, Any]) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    low = vllm_int(schema.get("minLength", 1)) or 0
    high = vllm_int(schema.get("maxLength", max(low, 1)))
    return "x" * min(max(low, 1), high if high is not None else 1, 4096)


def _resolve(root: object, ref: str) -> object:
    node = root
    for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else ():
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, Mapping) else None
    return node


def structured_text(body: Mapping[str, Any]) -> str | None:
    """The JSON text answering a structured-output request (chat ``response_format``, Responses
    ``text.format``); None when none is asked."""
    fmt = body.get("response_format")
    text = body.get("text")
    if not isinstance(fmt, Mapping) and isinstance(text, Mapping):
        fmt = text.get("format")
    if not isinstance(fmt, Mapping):
        return None
    if fmt.get("type") == "json_object":
        return "{}"
    if fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema")
    spec = spec if isinstance(spec, Mapping) else fmt
    schema = spec.get("schema", {})
    return json.dumps(instance(schema if isinstance(schema, Mapping) else {}), separators=(",", ":"))


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    named: bool     # tool_choice named it: vLLM then finishes with "stop", not "tool_calls"


def tool_call(body: Mapping[str, Any]) -> ToolCall | None:
    """The call a chat body's tools get: the named tool of ``tool_choice``, else the first one
    (``tool_choice`` ``"none"``: no call)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    functions = [t["function"] for t in tools
                 if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
                 and isinstance(t["function"].get("name"), str)]
    if not functions:
        return None
    named = choice.get("function", {}).get("name") if isinstance(choice, Mapping) and isinstance(
        choice.get("function"), Mapping) else None
    function = next((f for f in functions if f["name"] == named), functions[0])
    params = function.get("parameters")
    args = instance(params if isinstance(params, Mapping) else {"type": "object"})
    return ToolCall(function["name"], json.dumps(args, separators=(",", ":")), named is not None)


# --- SSE -----------------------------------------------------------------------------------------

def data(event: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n"


DONE = "data: [DONE]\n\n"


# --- chat ----------------------------------------------------------------------------------------

def chat(body: Mapping[str, Any], raw: bytes) -> Answer | None:
    n, stream = sequences(body), _flag(body, "stream")
    if n is None or stream is None or not isinstance(body.get("messages"), list):
        return None
    n = min(n, MAX_CHOICES)
    tokens = tokens_per_choice(body)
    call = tool_call(body)
    text = None if call else structured_text(body)
    fixed = call.arguments if call else text
    pieces = [split(fixed, tokens) if fixed is not None else words(tokens, i) for i in range(n)]
    finish = ("stop" if call.named else "tool_calls") if call and tokens >= NATURAL_TOKENS \
        else _finish(tokens)
    head = {"id": _ident("chatcmpl", raw), "created": int(time.time()), "model": _model(body)}
    prompt = prompt_tokens(len(raw))
    if stream:
        return _chat_stream(body, raw, head, pieces, call, finish, prompt, tokens)
    choices = []
    for i in range(n):
        message: dict[str, Any] = {"role": "assistant", "content": None if call else "".join(pieces[i]),
                                   "refusal": None, "annotations": None, "audio": None,
                                   "function_call": None, "reasoning": None}
        if call:
            message["tool_calls"] = [{"id": _tool_id(raw, i), "type": "function",
                                      "function": {"name": call.name, "arguments": call.arguments}}]
        choices.append({"index": i, "message": message, "logprobs": None, "finish_reason": finish,
                        "stop_reason": None, "token_ids": None})
    return Json({**head, "object": "chat.completion", "choices": choices, "service_tier": None,
                 "system_fingerprint": None,
                 "usage": {**usage(prompt, tokens * n), "prompt_tokens_details": None},
                 "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None})


def chat_batch(body: Mapping[str, Any], raw: bytes) -> Answer | None:
    """``/v1/chat/completions/batch``: one choice per conversation of ``messages`` (a list of
    non-empty conversations), never streamed; vLLM refuses ``stream``, ``tools`` and ``n`` over 1."""
    conversations = body.get("messages")
    if (not isinstance(conversations, list) or not conversations
            or not all(isinstance(c, list) and c for c in conversations)
            or sequences(body) != 1 or _flag(body, "stream") is not False or body.get("tools")):
        return None
    return chat({**body, "messages": [], "n": len(conversations)}, raw)


def _tool_id(raw: bytes, index: int) -> str:
    return f"chatcmpl-tool-{hashlib.sha256(raw).hexdigest()[:16]}{index}"


def _chat_stream(body: Mapping[str, Any], raw: bytes, head: dict[str, Any], pieces: list[tuple[str, ...]],
                 call: ToolCall | None, finish: str, prompt: int, tokens: int) -> Stream:
    final, continuous = include_usage(body)
    chunk = {**head, "object": "chat.completion.chunk"}

    def event(i: int, delta: dict[str, Any], done: bool, generated: int) -> str:
        out: dict[str, Any] = {**chunk, "choices": [{"index": i, "delta": delta, "logprobs": None,
                                                    "finish_reason": finish if done else None}]}
        if continuous:
            out["usage"] = usage(prompt, generated)
        return data(out)

    steps: list[tuple[str, ...]] = [tuple(event(i, {"role": "assistant", "content": ""}, False, 0)
                                          for i in range(len(pieces)))]
    for k in range(max(tokens, 1)):
        step = []
        for i, mine in enumerate(pieces):
            piece = mine[k] if k < len(mine) else ""
            delta: dict[str, Any] = {"content": piece}
            if call:
                fn = {"name": call.name, "arguments": piece} if k == 0 else {"arguments": piece}
                first = {"id": _tool_id(raw, i), "type": "function", "index": 0, "function": fn}
                delta = {"tool_calls": [first if k == 0 else {"index": 0, "function": fn}]}
            step.append(event(i, delta, k == max(tokens, 1) - 1, min(k + 1, tokens)))
        steps.append(tuple(step))
    tail = [DONE]
    if final:
        tail.insert(0, data({**chunk, "choices": [], "usage": usage(prompt, tokens * len(pieces))}))
    steps[-1] = (*steps[-1], *tail)
    return Stream(tuple(steps))


# --- completions ---------------------------------------------------------------------------------

def prompts(body: Mapping[str, Any]) -> int | None:
    """How many prompts a completions body runs (a string or one token-id list: 1); None: none."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return 1
    if isinstance(prompt, list) and prompt:
        return 1 if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt) else len(prompt)
    return 1 if prompt is None and body.get("prompt_embeds") is not None else None


def completions(body: Mapping[str, Any], raw: bytes) -> Answer | None:
    n, count, stream = sequences(body), prompts(body), _flag(body, "stream")
    if n is None or count is None or stream is None:
        return None
    total = min(n * count, MAX_CHOICES)
    tokens = tokens_per_choice(body)
    finish = _finish(tokens)
    head = {"id": _ident("cmpl", raw), "object": "text_completion", "created": int(time.time()),
            "model": _model(body)}
    prompt = prompt_tokens(len(raw))
    if not stream:
        choices = [{"index": i, "text": "".join(words(tokens, i)), "logprobs": None, "finish_reason": finish,
                    "stop_reason": None, "prompt_logprobs": None} for i in range(total)]
        return Json({**head, "choices": choices, "service_tier": None, "system_fingerprint": None,
                     "usage": {**usage(prompt, tokens * total), "prompt_tokens_details": None},
                     "kv_transfer_params": None})
    final, continuous = include_usage(body)
    per_prompt = max(1, prompt // count)
    steps = []
    for k in range(max(tokens, 1)):
        step = []
        for i in range(total):
            mine = words(tokens, i)
            done = k == max(tokens, 1) - 1
            choice = {"index": i, "text": mine[k] if k < len(mine) else "", "logprobs": None,
                      "finish_reason": finish if done else None, "stop_reason": None}
            event: dict[str, Any] = {**head, "choices": [choice]}
            if continuous:
                event["usage"] = usage(per_prompt, min(k + 1, tokens))
            step.append(data(event))
        steps.append(tuple(step))
    tail = [DONE]
    if final:
        tail.insert(0, data({**head, "choices": [], "usage": usage(prompt, tokens * total)}))
    steps[-1] = (*steps[-1], *tail)
    return Stream(tuple(steps))


# --- embeddings ----------------------------------------------------------------------------------

def inputs(body: Mapping[str, Any]) -> int | None:
    """How many vectors an embeddings body asks for; None: no input vLLM would take."""
    items = body.get("input")
    if isinstance(items, str):
        return 1
    if isinstance(items, list) and items:
        return 1 if all(isinstance(p, int) and not isinstance(p, bool) for p in items) else len(items)
    return 1 if items is None and isinstance(body.get("messages"), list) else None


def vector(index: int, size: int = EMBEDDING_SIZE) -> list[float]:
    """Embedding ``index``'s deterministic vector (values exact in float32)."""
    return [((index * 7 + j * 3) % 16) / 16 for j in range(size)]


def embeddings(body: Mapping[str, Any], raw: bytes) -> Answer | None:
    count = inputs(body)
    if count is None:
        return None
    dims = vllm_int(body["dimensions"]) if body.get("dimensions") is not None else EMBEDDING_SIZE
    dims = EMBEDDING_SIZE if dims is None or not 1 <= dims <= MAX_DIMENSIONS else dims
    as_base64 = body.get("encoding_format") == "base64"
    data_ = []
    for i in range(min(count, MAX_CHOICES)):
        values = vector(i, dims)
        emb: list[float] | str = (base64.b64encode(struct.pack(f"<{dims}f", *values)).decode()
                                  if as_base64 else values)
        data_.append({"index": i, "object": "embedding", "embedding": emb})
    prompt = prompt_tokens(len(raw))
    return Json({"id": _ident("embd", raw), "object": "list", "created": int(time.time()),
                 "model": _model(body), "data": data_,
                 "usage": {**usage(prompt, 0), "prompt_tokens_details": None}})


# --- the Responses API ---------------------------------------------------------------------------

def responses(body: Mapping[str, Any], raw: bytes, rid: str = "",
              previous: str | None = None) -> Json | Stream | None:
    """``rid``: the response's id (vLLM's ``resp_`` + 16 hex; "" one from the body's hash);
    ``previous``: the ``previous_response_id`` echoed (its store checked it)."""
    stream = _flag(body, "stream")
    if stream is None or body.get("input") is None:
        return None
    tokens = tokens_per_choice(body)
    text = structured_text(body)
    pieces = split(text, tokens) if text is not None else words(tokens)
    prompt = prompt_tokens(len(raw))
    budget = output_budget(body)
    incomplete = tokens < NATURAL_TOKENS
    msg_id = _ident("msg", raw)
    part: dict[str, Any] = {"type": "output_text", "text": "".join(pieces), "annotations": [],
                            "logprobs": None}
    message = {"id": msg_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]}
    used = {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "input_tokens_per_turn": [],
                                     "cached_tokens_per_turn": []},
            "output_tokens": tokens,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                      "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
            "total_tokens": prompt + tokens}

    def response(status: str, output: list[Any], use: dict[str, Any] | None) -> dict[str, Any]:
        return {"id": rid or _ident("resp", raw), "created_at": int(time.time()),
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": body.get("instructions"), "metadata": body.get("metadata"),
                "model": _model(body), "object": "response", "output": output,
                "parallel_tool_calls": True, "temperature": _float(body.get("temperature"), 1.0),
                "tool_choice": body.get("tool_choice", "auto"), "tools": [],
                "top_p": _float(body.get("top_p"), 1.0), "background": False,
                "max_output_tokens": budget if budget is not None else MAX_MODEL_LEN - prompt,
                "max_tool_calls": None, "previous_response_id": previous, "prompt": None, "reasoning": None,
                "service_tier": "auto", "status": status, "text": body.get("text"), "top_logprobs": None,
                "truncation": "disabled", "usage": use, "user": None}

    done = "incomplete" if incomplete else "completed"
    if not stream:
        return Json(response(done, [message], used))
    final = response(done, [message], used)
    return Stream(_responses_events(response("in_progress", [], None), final, msg_id, pieces, part), final)


def _float(value: object, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _responses_events(start: dict[str, Any], end: dict[str, Any], msg_id: str, pieces: Sequence[str],
                      part: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
    seq = iter(range(1 << 30))

    def ev(kind: str, **fields: Any) -> str:
        payload = json.dumps({"type": kind, "sequence_number": next(seq), **fields})
        return f"event: {kind}\ndata: {payload}\n\n"

    where = {"output_index": 0, "item_id": msg_id, "content_index": 0}
    steps: list[tuple[str, ...]] = [(
        ev("response.created", response=start), ev("response.in_progress", response=start),
        ev("response.output_item.added", output_index=0,
           item={"id": msg_id, "type": "message", "role": "assistant", "content": [],
                 "status": "in_progress"}),
        ev("response.content_part.added", **where,
           part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
    )]
    steps += [(ev("response.output_text.delta", **where, delta=piece, logprobs=[]),) for piece in pieces]
    text_part = {**part, "logprobs": None}
    steps[-1] = (*steps[-1],
                 ev("response.output_text.done", **where, text=part["text"], logprobs=[]),
                 ev("response.content_part.done", **where, part=text_part),
                 ev("response.output_item.done", output_index=0, item=end["output"][0]),
                 ev("response.completed", response=end))
    return tuple(steps)


_SHAPES = {"/v1/chat/completions": chat, "/v1/chat/completions/batch": chat_batch,
           "/v1/completions": completions, "/v1/embeddings": embeddings, "/v1/responses": responses}
