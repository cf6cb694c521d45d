"""A route's output budget: the fields a generating route reads how many tokens it may produce
from, the cap the plan puts on them, and what happens to a body without them (written into the
body, refused, or passed); ``write_budget`` writes one into a body. Moved out of
``scanner.plan.model`` so the plan document's view (``scanner.plan.document``) can name it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated, Any, ClassVar

from pydantic import Field

from scanner import jsondoc
from scanner.jsondoc import CONFIG, Int, Str
from scanner.plan.output_default import OutputDefault
from scanner.plan.vllm_json import at
from scanner.policy.model import WhenAbsent


@dataclass(frozen=True)
class Budget:
    """A route's output budget: the fields it is read from, capped; what happens without them."""

    __pydantic_config__: ClassVar = CONFIG
    fields: tuple[Str, ...]
    field: Str                 # written when every one of ``fields`` is absent or null (inject)
    cap: Int                   # the smallest cap the plan puts on ``fields``
    when_absent: WhenAbsent
    # what vLLM generates without a budget, from the inventory's serve arguments (in a document:
    # only when they say)
    default: Annotated[OutputDefault, Field(
        exclude_if=lambda d: not d.known, description="what vLLM generates without a budget, as the "
        "inventory's serve arguments say (max_model_len, max_new_tokens)")] = dataclass_field(
        default_factory=OutputDefault)

    def absent(self, body: Mapping[str, object]) -> bool:
        """Does vLLM fall back to its own default for this body (no field, or only nulls; a field
        is a dotted path through object members)?"""
        return all(at(body, f) is None for f in self.fields)

    def writable(self, body: Mapping[str, object]) -> bool:
        """Can :attr:`field` be written into this body: top level, or a dotted path whose parent
        member is an object (``sampling_params``; vLLM refuses a body where it is not)."""
        parent, _, _ = self.field.rpartition(".")
        return not parent or isinstance(at(body, parent), dict)

    @property
    def window(self) -> int:
        """The context length the written budget is fitted into (``max_model_len``), 0: none
        (vLLM's own default is within the cap, or the length is not known: the cap is written)."""
        lim = self.default
        if self.when_absent != "inject" or lim.max_model_len is None or self.quiet:
            return 0
        return lim.max_model_len

    @property
    def quiet(self) -> bool:
        """Is vLLM's own default already within the cap (``max_model_len`` or the
        ``max_new_tokens`` override at most the cap), so nothing need be written?"""
        bound = self.default.bound
        return bound is not None and bound <= self.cap

    @property
    def write_cap(self) -> int:
        """The most the perimeter writes into a body without a budget: the cap under ``inject``,
        0 when it writes nothing (``reject``, ``pass``, or :attr:`quiet`)."""
        return self.cap if self.when_absent == "inject" and not self.quiet else 0

    @property
    def rest(self) -> int:
        """The output per sequence vLLM runs at most for a body without a budget when nothing is
        written: its default's bound from the serve arguments, else (not known) the cap."""
        bound = self.default.bound
        return bound if bound is not None else self.cap

    def written(self, size: int) -> int | None:
        """The budget written into a body of ``size`` bytes that has none (``inject``); None:
        nothing is written. vLLM refuses prompt + budget > ``max_model_len``, and a body holds no
        more prompt tokens than bytes (scanner/plan/envelope.py), so ``min(cap, max_model_len -
        size)`` is never refused for a prompt that fits; when that is below 1 (a body of
        ``max_model_len`` bytes or more), nothing is written and vLLM's default applies. Nothing
        either when that default is within the cap (:attr:`quiet`); the cap when the context
        length is not known. njs (``budgetFit``) and Lua (``OPS.budget``) compute the same from
        :attr:`write_cap` and :attr:`window`."""
        if not self.write_cap:
            return None
        if not self.window:
            return self.write_cap
        fit = min(self.write_cap, self.window - size)
        return fit if fit >= 1 else None

    def output(self, size: int) -> int:
        """The output per sequence of a body of ``size`` bytes without a budget, as vLLM will
        run it at most: what is written, else :attr:`rest`."""
        fit = self.written(size)
        return fit if fit is not None else self.rest

    def forwarded(self, body: Mapping[str, object], size: int = 0) -> dict[str, object] | None:
        """The body the upstream must receive for ``body`` (a JSON object received as ``size``
        bytes); None: refused."""
        if not self.absent(body) or self.when_absent == "pass":
            return dict(body)
        if self.when_absent == "reject":
            return None
        fit = self.written(size)
        if fit is None:        # vLLM's default applies: the body as sent (a null reads as absent)
            return dict(body)
        if not self.writable(body):   # no object to write it into: vLLM refuses the body as sent
            return dict(body)
        return write_budget(body, self.field.split("."), self.fields, fit)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


def write_budget(obj: Mapping[str, object], names: list[str], fields: Sequence[str],
                 fit: int) -> dict[str, object]:
    """``obj`` with the budget ``fit`` written at the dotted path ``names`` (its parent an object),
    less the budget ``fields`` at that level (nulls: every one absent or null)."""
    head, rest = names[0], names[1:]
    if not rest:
        drop = {f for f in fields if "." not in f}
        return {**{k: v for k, v in obj.items() if k not in drop}, head: fit}
    inner = tuple(f.partition(".")[2] for f in fields if f.startswith(head + "."))
    sub = obj[head]
    assert isinstance(sub, dict)
    return {**obj, head: write_budget(sub, rest, inner, fit)}
