"""Settlement: the unused part of a token reservation returned once vLLM's answer says what it did.

A route with a token budget (:attr:`Decision.token_zone`) is charged its admitted envelope at
admission (:func:`scanner.plan.body.token_cost`), atomically, before vLLM sees the request: no overshoot
under concurrency. When the answer reports ``usage``, the charge is settled: the reservation less
the tokens vLLM reports goes back to the budget (:func:`refund`). Both proxies do it (NGINX: njs
body filter; Envoy: Lua on the response) by this module's rules, which are the reference.

Where the usage is read (vLLM 0.28 - 0.33):

* a JSON answer's ``usage``: ``prompt_tokens`` / ``completion_tokens`` (chat, completions,
  embeddings, pooling, score), or ``input_tokens`` / ``output_tokens`` (the Responses API);
* a stream (``text/event-stream``): the last ``data:`` event carrying a ``usage`` object (chat and
  completions send it only when the request asks ``stream_options.include_usage``; the Responses
  API in its ``response.completed`` event, under ``response.usage``).

The proxy asks for it (:func:`asking_usage`): a body on a route whose request model has
``stream_options`` (:attr:`EnvelopeSpec.usage` ``"ask"``) with ``"stream": true`` (the JSON value:
a string vLLM would read as true is left alone, never settled) and without ``include_usage:
true`` leaves with ``stream_options: {"include_usage": true}`` (the client's other options kept,
``continuous_usage_stats`` dropped, which without ``include_usage`` does nothing), and the final
usage event vLLM then sends, ``"choices": []`` with a ``usage`` (:func:`hidden`), is not shown to
the client: it did not ask for it.

A stream is settled as soon as its **final** usage event (:func:`final`: the usage-only event,
or the Responses API's ``response.completed`` / ``response.incomplete`` / ``response.failed``)
has passed the proxy, before ``data: [DONE]`` and the end of the body, and only then, once: the
openai SDK (and every library on it) closes the connection at ``[DONE]`` without reading the end
of the body, so a settlement waiting for the end would be lost whenever the close wins the race.
A stream without a final event (usage only per event, ``continuous_usage_stats``) is settled by the
last usage it carried when the body ends.

What is not settled keeps its charge: an answer without usage (an error, a stream cut short before
its final usage event: a client that leaves early is charged what vLLM reported or, without a
report, the whole reservation; an upstream that does not report it), and a body that runs
sequences vLLM does not report (``best_of`` above ``n``: vLLM's usage counts the returned
sequences only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scanner.plan.vllm_json import vllm_int


@dataclass(frozen=True)
class Usage:
    """What vLLM reports it did for one request."""

    input: int
    output: int

    @property
    def tokens(self) -> int:
        return self.input + self.output


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_of(answer: object) -> Usage | None:
    """The usage a JSON answer (or one stream event's data) reports; None when it reports none.
    A Responses API event carries it under ``response``."""
    if not isinstance(answer, Mapping):
        return None
    usage = answer.get("usage")
    if not isinstance(usage, Mapping) and isinstance(answer.get("response"), Mapping):
        usage = answer["response"].get("usage")
    if not isinstance(usage, Mapping):
        return None
    prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    output = _count(usage.get("completion_tokens", usage.get("output_tokens", 0)))
    if prompt is None or output is None:
        return None
    return Usage(prompt, output)


def stream_usage(events: Iterable[object]) -> Usage | None:
    """The usage of a stream: the last event's data (decoded JSON) that reports one."""
    found = None
    for event in events:
        found = usage_of(event) or found
    return found


# the Responses API's last event of a stream: it carries the response's usage, final
FINAL_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})


def final(event: object) -> bool:
    """Is this stream event (decoded JSON data) one after which the usage cannot change: the
    usage-only event (:func:`hidden`) or a Responses API ending event carrying ``response.usage``?
    The proxy settles the stream when it passes (:func:`settled_at`)."""
    if hidden(event):
        return True
    return (isinstance(event, Mapping) and event.get("type") in FINAL_TYPES
            and isinstance(event.get("response"), Mapping) and usage_of(event) is not None)


def settled_at(events: Iterable[object]) -> tuple[int, Usage | None]:
    """Where a stream is settled: (the index of its first final event carrying a usage, that
    usage); (-1, the last usage any event reported) when no event is final, settled only when
    the body ends. A client that leaves before the index keeps the whole charge."""
    found = None
    for i, event in enumerate(events):
        found = usage_of(event) or found
        if found is not None and final(event):
            return i, found
    return -1, found


def unreported(body: Mapping[str, object] | None) -> bool:
    """Does this body run sequences vLLM's usage does not count (``best_of`` over ``n``)?"""
    if not body or body.get("best_of") is None:
        return False
    best, n = vllm_int(body.get("best_of")), vllm_int(body.get("n") if body.get("n") is not None else 1)
    return best is None or n is None or best > n


def refund(charged: int, usage: Usage | None, body: Mapping[str, object] | None) -> int:
    """Tokens returned to the budget for a request charged ``charged`` whose answer reported
    ``usage`` (None: nothing reported, the charge stands)."""
    if usage is None or unreported(body):
        return 0
    return max(0, charged - usage.tokens)


# the strings pydantic's lax mode reads as true (case-insensitive; measured on vLLM 0.29's pydantic)
TRUE_TEXT = frozenset({"1", "on", "t", "true", "y", "yes"})


def vllm_true(value: object) -> bool:
    """Does vLLM read this value of a ``bool`` field as true (pydantic's lax mode): ``true``, a
    number equal to 1, or one of :data:`TRUE_TEXT` in any case (no whitespace around it)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value == 1
    return isinstance(value, str) and value.lower() in TRUE_TEXT


def asks_usage(body: Mapping[str, object]) -> bool:
    """Does the client itself ask for the usage event of its stream (``include_usage`` as vLLM
    reads it: ``"yes"`` asks too)?"""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and vllm_true(options.get("include_usage"))


def asking_usage(body: Mapping[str, object]) -> dict[str, object] | None:
    """``body`` as it leaves a settled route whose model takes ``stream_options``: asking for the
    usage event (see the module docstring); None when nothing is written (not a stream, the client
    asks already, or its ``stream_options`` is not an object: vLLM refuses that itself)."""
    options = body.get("stream_options")
    if body.get("stream") is not True or asks_usage(body) or not isinstance(options, Mapping | None):
        return None
    kept = {k: v for k, v in (options or {}).items() if k not in ("include_usage", "continuous_usage_stats")}
    return {**body, "stream_options": {**kept, "include_usage": True}}


def hidden(event: object) -> bool:
    """Is this stream event (decoded JSON data) the usage-only event vLLM sends last when asked
    for usage: ``"choices": []`` and a ``usage``? Not shown to a client that did not ask."""
    return (isinstance(event, Mapping) and event.get("choices") == []
            and isinstance(event.get("usage"), Mapping))
