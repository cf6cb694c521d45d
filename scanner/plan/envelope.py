"""The admitted envelope: how much work vLLM does for one request body, decided once per route.

vLLM runs far more than one sequence for some bodies (vLLM 0.28 - 0.33, read from its request
models and serving code):

* ``n`` sequences per prompt, and ``best_of`` where a model still has it (best_of >= n sequences
  run, n returned); beam search (``use_beam_search``) runs ``n`` beams, so ``max(n, best_of)``
  bounds it too;
* several prompts in one body: a completions ``prompt`` that is a list of strings or of token-id
  lists is one prompt per item (a string, or a list of ints, is one prompt), each with its own
  ``max_tokens``; the same for ``input`` on embedding, pooling and classification routes;
  ``messages`` that is a list of conversations (``/v1/chat/completions/batch``, embeddings' batch
  chat form) is one request per conversation (a list of message objects is one);
* list inputs counted item by item (``texts``, ``images``, ``inputs`` of Cohere's embed);
* pair scoring (rerank, score): the two sides pair 1:N or N:N, one pooled sequence per pair.

:class:`EnvelopeSpec` is the route's statement of those fields (from its request model in the
inventory, :func:`spec_for`); :func:`envelope` the Python reference of what a body asks for;
the plan compiles the spec into the rule program's envelope step (scanner/plan/program.py), which
njs (``OPS.envelope`` in templates/nginx-perimeter.js) and Lua (templates/envoy_perimeter.lua.j2)
run: the same numbers.

The input estimate is the body's size in bytes: a byte-level BPE token covers at least one byte
of text, and JSON spends at least that byte on it (an escape more), a token id in a list costs at
least two bytes (a digit and a separator), so no body holds more input tokens than bytes. Chat
templates add a few tokens per message; a message object costs more than 20 bytes of JSON
(``{"role":"user","content":""}``), which covers them for the templates of common models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from scanner import jsondoc
from scanner.jsondoc import CONFIG, Flag, Str, empty
from scanner.plan.vllm_json import at

# How a field's items are counted (vLLM's semantics):
#   prompts: a string, a number or an object is one prompt; a list is one prompt per item that is
#            a string or a list (a token-id list, a conversation), and one in all for the rest
#            (ints are one token-id prompt, message objects one conversation);
#   each:    a list is one item per element, anything else one item.
ItemRule = Literal["prompts", "each"]
ITEM_FIELDS: Mapping[str, ItemRule] = {
    "prompt": "prompts", "input": "prompts", "messages": "prompts",
    "texts": "each", "images": "each", "inputs": "each",
}
# Pair scoring: (side 1, side 2), each side a string or object (one) or a list of them.
PAIR_FIELDS: tuple[tuple[str, str], ...] = (
    ("query", "documents"), ("queries", "documents"), ("queries", "items"),
    ("data_1", "data_2"), ("text_1", "text_2"),
)
# Sequences per prompt: the largest of these (at least 1).
SEQUENCE_FIELDS: tuple[str, ...] = ("n", "best_of")


@dataclass(frozen=True)
class EnvelopeSpec:
    """The fields multiplying a route's work (a plan decision's ``envelope``)."""

    __pydantic_config__: ClassVar = CONFIG
    items: Annotated[tuple[tuple[Str, ItemRule], ...], Field(
        description="[field, prompts | each]: items summed")] = ()   # the prompts (conversations, inputs)
    pairs: Annotated[tuple[tuple[Str, Str], ...], Field(
        description="[side 1, side 2] of pair scoring")] = ()         # their pairs add to the items
    # sequences per item, the largest, >= 1: every position of a SEQUENCE_FIELDS name through object
    # members (``n``, ``sampling_params.n``: a dotted path)
    per_item: tuple[Str, ...] = ()
    ask_usage: Annotated[Flag, Field(exclude_if=empty, description=(
        "the model takes stream_options: a settled stream asks for its usage "
        "(scanner/plan/settle.py)"))] = False

    __get_pydantic_core_schema__ = jsondoc.required("items", "pairs", "per_item")   # a plan writes each

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out

    @property
    def text(self) -> str:
        """The spec as both proxies read it: ``items=prompt:prompts,messages:prompts
        pairs=query:documents per=n,best_of`` (an empty list: ``-``)."""
        def part(values: Iterable[str]) -> str:
            return ",".join(values) or "-"
        return (f"items={part(f'{f}:{r}' for f, r in self.items)} "
                f"pairs={part(f'{a}:{b}' for a, b in self.pairs)} per={part(self.per_item)}")


def member_paths(positions: Iterable[str]) -> tuple[str, ...]:
    """The nested positions of a request model (the inventory's ``nested[].path``) reached through
    object members only (``sampling_params.n``; not ``prompt[]``, ``logit_bias.*``), sorted."""
    return tuple(sorted(p for p in positions if "." in p and not any(c in p for c in "[]*")))


def named_at(name_set: Iterable[str], positions: Iterable[str]) -> tuple[str, ...]:
    """The nested member positions (:func:`member_paths`) whose last name is in ``name_set``."""
    names = set(name_set)
    return tuple(p for p in member_paths(positions) if p.rsplit(".", 1)[1] in names)


def spec_for(fields: Mapping[str, tuple[str, ...]] | None, nested: Iterable[str] = ()) -> EnvelopeSpec:
    """The spec of a route whose request model has the top-level ``fields`` (name -> JSON types;
    None: its body is not known, so every multiplier is read) and the ``nested`` positions (the
    inventory's dotted paths). An item field counts where the model takes a list there (``prompt``
    on /v1/responses is a template object: one request); a sequence count at every position of
    its name through object members (``sampling_params.n`` of /inference/v1/generate). A stream
    asks for its usage only where the model is known to take ``stream_options``."""
    ask_usage = fields is not None and "stream_options" in fields
    if fields is None:
        every = (*ITEM_FIELDS, *(f for p in PAIR_FIELDS for f in p), *SEQUENCE_FIELDS)
        fields = {f: ("array",) for f in every}
    have = set(fields)
    return EnvelopeSpec(items=tuple((f, rule) for f, rule in ITEM_FIELDS.items()
                                    if "array" in fields.get(f, ())),
                        pairs=tuple(p for p in PAIR_FIELDS if p[0] in have and p[1] in have),
                        per_item=(*(f for f in SEQUENCE_FIELDS if f in have),
                                  *named_at(SEQUENCE_FIELDS, nested)),
                        ask_usage=ask_usage)


@dataclass(frozen=True)
class Envelope:
    """What one admitted body may make vLLM do."""

    sequences: int       # sequences run (items x sequences per item)
    output: int          # output budget per sequence (tokens; 0: the route has none)
    input: int           # input tokens, never fewer than vLLM reads: the body's bytes
    model: str = ""      # the ``model`` field ("" when absent or not a string)

    @property
    def tokens(self) -> int:
        """sequences x output budget per sequence + input estimate: what a budget charges and
        ``limits.max_request_tokens`` caps."""
        return self.sequences * self.output + self.input


def count(value: object, rule: ItemRule) -> int:
    """How many items ``value`` holds under ``rule`` (absent / null: 0)."""
    if value is None:
        return 0
    if not isinstance(value, list):
        return 1
    if rule == "each":
        return len(value)
    return max(1, sum(1 for v in value if isinstance(v, str | list)))


def pairs(a: int, b: int) -> int:
    """Pooled sequences of pair scoring with ``a`` and ``b`` items (vLLM: 1:N or N:N; any other
    shape is refused by vLLM, and counted as every pair here). A side absent: no pairs (vLLM
    needs both; another pair form of the route may use the side present)."""
    if a == 0 or b == 0:
        return 0
    return a * b if a != b and a > 1 and b > 1 else max(a, b)


def sequences(spec: EnvelopeSpec, body: Mapping[str, object], whole: Callable[[object], int]) -> int:
    """Sequences a JSON object body runs on a route with ``spec``: (its items, at least 1) x (the
    largest of ``per_item``'s values read by ``whole``, at least 1)."""
    items = sum(count(body.get(f), rule) for f, rule in spec.items)
    items += sum(pairs(count(body.get(a), "each"), count(body.get(b), "each")) for a, b in spec.pairs)
    per = max([1, *(whole(at(body, f)) for f in spec.per_item if at(body, f) is not None)])
    return max(1, items) * per
