"""The rule program's instruction set: the models of its steps and of the document (its JSON
Schema is ``schemas/rule-program.schema.json``). What each instruction does, and the order the
plan emits them in, is :mod:`scanner.plan.program`'s table; this module is only the vocabulary,
so that every stage (documents, the generators) can name it.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Pin = int | float | str | bool | None

SCHEMA = "vllm-perimeter/rule-program"
VERSION = 1

# The most nesting a JSON body may have (the root object is level 1, ``{"a":[1]}`` is 2), one
# fact for every interpreter: deeper bodies are refused ``bad-json:depth-over-31`` before they are
# read. 31 is what njs's JSON.parse reads, measured on njs 0.7.9 (Debian NGINX 1.22) and 0.9.9
# (pip NGINX 1.31): 31 levels parse, 32 throw; Lua's reader (templates/envoy_json.lua.j2) and
# Python's json read deeper, vLLM (pydantic) too, so refusing past it never admits more.
BODY_DEPTH = 31

# The largest answer a proxy reads to settle its token charge (scanner/plan/settle.py) or to seal the
# response ids it carries (scanner/plan/owner.py), one fact for njs (perimeter-rules.json) and Lua
# (envoy_perimeter.lua.j2): a JSON answer up to ANSWER_MAX bytes, a stream's line up to
# ANSWER_LINE_MAX. Past either, both fail closed: the charge stands, an answer that could carry an
# unsealed id is not sent (a stream: the rest of it). 4 MiB: njs's js_body_filter holds the answer in
# the request's VM, which has no garbage collector (freed when the request ends), and reading it
# takes about five copies of it at once (the chunks, their concatenation, its text, the parsed
# document, the sealed text); Envoy's Lua holds it in Lua strings read chunk by chunk (Envoy's own
# buffer would stop at its 1 MiB connection limit: measured, a sealed answer of 1,049,000 bytes was a
# 500 of Envoy's before the seal read chunks too). A stream's line is one event: vLLM's are a few KB.
ANSWER_MAX = 4194304
ANSWER_LINE_MAX = 1048576


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cap(_Step):
    op: Literal["cap"] = "cap"
    path: str
    max: int


class Keys(_Step):
    op: Literal["keys"] = "keys"
    unknown: Literal["reject", "strip", "pass"]
    modes: dict[str, Literal["allow", "reject", "strip"]] = Field(default_factory=dict)


class Count(_Step):
    op: Literal["count"] = "count"
    field: str
    max: int


class Values(_Step):
    op: Literal["values"] = "values"
    field: str
    values: list[Pin]


class Media(_Step):
    op: Literal["media"] = "media"
    urls: Literal["deny", "allow", "pass"]
    domains: list[str] = Field(default_factory=list)
    data: int | None = None
    items: int | None = None
    embeds: Literal["deny", "allow"] = "allow"


class BudgetStep(_Step):
    op: Literal["budget"] = "budget"
    fields: list[str]
    field: str
    absent: Literal["reject", "inject"]
    cap: int                # the most written (0: nothing is written)
    window: int = 0         # the context length the written budget is fitted into (0: none)


class Salt(_Step):
    op: Literal["salt"] = "salt"


class EnvelopeStep(_Step):
    op: Literal["envelope"] = "envelope"
    items: list[tuple[str, Literal["prompts", "each"]]] = Field(default_factory=list)
    pairs: list[tuple[str, str]] = Field(default_factory=list)
    per: list[str] = Field(default_factory=list)
    out: list[str] = Field(default_factory=list)     # the output budget's fields (none: output 0)
    rest: int = 0             # the output per sequence when none is sent and none written
    max_sequences: int | None = None
    max_tokens: int | None = None


class Owned(_Step):
    op: Literal["owned"] = "owned"
    fields: list[str]


class PinStep(_Step):
    op: Literal["pin"] = "pin"
    field: str
    value: Pin


class AskUsage(_Step):
    op: Literal["ask_usage"] = "ask_usage"


Step = Annotated[Cap | Keys | Count | Values | Media | BudgetStep | Salt | EnvelopeStep | Owned | PinStep
                 | AskUsage, Field(discriminator="op")]


class Program(_Step):
    """One route group's body rules."""

    steps: list[Step]


class RuleProgram(BaseModel):
    """Every program of a plan, by id (the generators' check ids)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["vllm-perimeter-rule-program"] = "vllm-perimeter-rule-program"
    schema_version: Literal[1] = 1
    programs: dict[str, Program]
    # a body nested deeper is refused before any program runs (BODY_DEPTH)
    depth: int = Field(default=BODY_DEPTH, ge=1, le=BODY_DEPTH)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
