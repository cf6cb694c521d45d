"""scanner/plan/settle.py: what is read as usage, what is refunded, when a stream asks for usage."""

from __future__ import annotations

import pytest

from scanner.plan import settle
from scanner.plan.settle import Usage


@pytest.mark.parametrize("answer, usage", [
    ({"usage": {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17}}, Usage(7, 10)),
    ({"usage": {"prompt_tokens": 7, "total_tokens": 7}}, Usage(7, 0)),                    # embeddings
    ({"usage": {"input_tokens": 5, "output_tokens": 3}}, Usage(5, 3)),                     # responses
    ({"type": "response.completed", "response": {"usage": {"input_tokens": 5, "output_tokens": 3}}},
     Usage(5, 3)),
    ({"usage": None}, None), ({"usage": {"prompt_tokens": "7"}}, None),
    ({"usage": {"prompt_tokens": -1, "completion_tokens": 1}}, None),
    ({"usage": {"prompt_tokens": True, "completion_tokens": 1}}, None), ([], None), ({}, None),
])
def test_usage_is_read_only_from_whole_counts(answer: object, usage: Usage | None) -> None:
    assert settle.usage_of(answer) == usage


def test_a_stream_settles_by_its_last_usage_event() -> None:
    events = [{"choices": [{"delta": {}}]}, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 10}},
              "[DONE]"]
    assert settle.stream_usage(events) == Usage(3, 10)
    assert settle.stream_usage(events[:1]) is None       # cut short: nothing to settle


USED = {"prompt_tokens": 3, "completion_tokens": 10}


@pytest.mark.parametrize("events, at, usage", [
    # the usage-only event is final: settled there, before [DONE] (a client closing at [DONE] is settled)
    ([{"choices": [{"delta": {}}]}, {"choices": [], "usage": USED}, "[DONE]"], 1, Usage(3, 10)),
    # continuous usage stats: every event's usage grows; only the usage-only event is final
    ([{"choices": [{"delta": {}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
      {"choices": [{"delta": {}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
      {"choices": [], "usage": USED}, "[DONE]"], 2, Usage(3, 10)),
    ([{"choices": [{"delta": {}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}, "[DONE]"],
     -1, Usage(3, 1)),                                   # no final event: settled at the body's end
    ([{"type": "response.created", "response": {"usage": None}},
      {"type": "response.completed", "response": {"usage": {"input_tokens": 5, "output_tokens": 3}}}],
     1, Usage(5, 3)),
    ([{"type": "response.completed", "response": {"usage": None}}], -1, None),
    ([{"choices": [{"delta": {}}]}], -1, None),          # cut short: nothing to settle
])
def test_a_stream_is_settled_at_its_final_usage_event(events: list[object], at: int, usage: Usage | None) -> None:
    assert settle.settled_at(events) == (at, usage)
    assert settle.stream_usage(events) == usage


@pytest.mark.parametrize("charged, usage, body, back", [
    (4096 + 100, Usage(25, 10), {"max_tokens": 4096}, 4096 + 100 - 35),
    (4 * 4096 + 100, Usage(25, 40), {"n": 4}, 4 * 4096 + 100 - 65),
    (4 * 4096 + 100, Usage(25, 40), {"n": 2, "best_of": 4}, 0),        # 2 sequences vLLM does not report
    (4 * 4096 + 100, Usage(25, 40), {"n": 4, "best_of": 4}, 4 * 4096 + 100 - 65),
    (100, None, {}, 0),                                                  # no usage: the charge stands
    (10, Usage(25, 40), {}, 0),                                          # more than charged: nothing back
])
def test_refund_returns_the_unused_reservation(charged: int, usage: Usage | None, body: dict[str, object],
                                                back: int) -> None:
    assert settle.refund(charged, usage, body) == back


@pytest.mark.parametrize("body, sent", [
    ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
    ({"stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": True, "x": 1}},
     {"stream": True, "stream_options": {"x": 1, "include_usage": True}}),
    ({"stream": True, "stream_options": {"include_usage": True}}, None),      # asked already
    ({"stream": True, "stream_options": {"include_usage": "Yes"}}, None),     # vLLM reads it as true
    ({"stream": True, "stream_options": {"include_usage": 1.0}}, None),
    ({"stream": True, "stream_options": {"include_usage": "no"}},
     {"stream": True, "stream_options": {"include_usage": True}}),
    ({"stream": True, "stream_options": {"include_usage": " true"}},           # vLLM refuses it: asked for
     {"stream": True, "stream_options": {"include_usage": True}}),
    ({"stream": "true"}, None), ({"stream": False}, None), ({}, None),
    ({"stream": True, "stream_options": "x"}, None),                          # vLLM refuses it itself
])
def test_a_stream_asks_for_usage_only_where_nothing_changes_for_vllm(body: dict[str, object],
                                                                      sent: dict[str, object] | None) -> None:
    assert settle.asking_usage(body) == sent


def test_only_the_usage_only_event_is_hidden() -> None:
    assert settle.hidden({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    assert not settle.hidden({"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}})
    assert not settle.hidden({"choices": []})


@pytest.mark.parametrize("value, true", [
    (True, True), (1, True), (1.0, True), ("1", True), ("on", True), ("T", True), ("TRUE", True),
    ("Yes", True), ("y", True), (False, False), (0, False), (2, False), (0.5, False), ("1.0", False),
    (" true", False), ("true ", False), ("2", False), (None, False), ([], False), ({}, False),
])
def test_a_bool_is_read_as_pydantic_reads_it(value: object, true: bool) -> None:
    assert settle.vllm_true(value) is true
