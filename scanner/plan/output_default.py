"""What vLLM generates for a body without an output budget, read from its serve arguments.

vLLM 0.29 (``get_max_tokens`` in vllm/entrypoints/serve/utils/api_utils.py, called by the chat,
completion and responses serving and by the render path) gives a body without ``max_tokens`` /
``max_completion_tokens`` / ``max_output_tokens`` the least of: ``max_model_len`` - the prompt's
tokens, the ``max_new_tokens`` of ``--override-generation-config`` (or of the model's
``generation_config.json``, which the inventory does not see: it can only lower it), the
platform's limit. A body that names a budget ``w`` is refused (400) by its length checks
(``TokenizeParams``, vllm/renderers/params.py) when prompt + ``w`` > ``max_model_len``.

The inventory records the serve arguments (``VllmFacts.serve_args``); :func:`read` finds the two
that bound the default: ``--max-model-len`` (vLLM's human-readable integers: ``4096``, ``4k``,
``4K``; ``-1`` / ``auto``: not known here) and ``--override-generation-config``'s
``max_new_tokens``. The plan decides once what the perimeter writes into a body without a
budget from them (:class:`scanner.plan.model.Budget`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import Field

from scanner import jsondoc
from scanner.jsondoc import CONFIG, Int, absent

_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class OutputDefault:
    """The serve arguments that bound vLLM's output for a body without a budget (None: not set)."""

    __pydantic_config__: ClassVar = CONFIG
    # in a document, a value not set is left out
    max_model_len: Annotated[Int | None, Field(exclude_if=absent)] = None    # --max-model-len
    # --override-generation-config '{"max_new_tokens": N}'
    max_new_tokens: Annotated[Int | None, Field(exclude_if=absent)] = None

    @property
    def bound(self) -> int | None:
        """The most vLLM generates per sequence for a body without a budget, whatever its prompt
        (None: the serve arguments do not say; the model's own config decides)."""
        known = [v for v in (self.max_model_len, self.max_new_tokens) if v is not None]
        return min(known) if known else None

    @property
    def known(self) -> bool:
        return self.bound is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


def human_int(text: str) -> int | None:
    """vLLM's ``human_readable_int`` (vllm/utils/argparse_utils.py): ``4096``, ``4k`` (1000s),
    ``4K`` (1024s, no decimals), ``25.6k``; None for anything else, ``-1`` and ``auto``."""
    value = text.strip()
    m = _HUMAN.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        return int(number) * _BINARY[suffix] if number.isdigit() else None
    return int(value) if value.isdigit() and int(value) > 0 else None


def _option(args: Sequence[str], name: str) -> str | None:
    """The last value given to ``--name`` (``--name V``, ``--name=V``; ``-`` or ``_`` between
    words, as vLLM's FlexibleArgumentParser reads them)."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    found: str | None = None
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in spellings:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


def read(args: Sequence[str]) -> OutputDefault:
    """The output default of a vLLM served with ``args`` (the inventory's serve arguments)."""
    window = _option(args, "max-model-len")
    override = _option(args, "override-generation-config")
    new_tokens: int | None = None
    if override:
        try:
            doc = json.loads(override)
        except ValueError:
            doc = None
        value = doc.get("max_new_tokens") if isinstance(doc, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            new_tokens = value
    return OutputDefault(max_model_len=human_int(window) if window else None, max_new_tokens=new_tokens)
