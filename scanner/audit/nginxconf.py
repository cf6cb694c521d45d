"""Compare two NGINX configs semantically (crossplane): directives added, removed or changed
per context (``http > server 127.0.0.1:8080 > location = /v1/models``).

Comments, whitespace, quoting and include layout are ignored (includes are inlined), and
named locations are compared by content, not by their generated names (``@~`` + a hash). Order
is ignored where NGINX ignores it; it is compared where it matters: the rewrite-phase
directives of one context (``set``, ``rewrite``, ``return``, ``break``, ``if``) and the
sequence of regex locations of one server (first match wins).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scanner.errors import ConfigError, UsageError

ChangeKind = Literal["added", "removed", "changed", "order"]
ORDERED = frozenset({"set", "rewrite", "return", "break", "if"})
SEP = " > "


@dataclass(frozen=True)
class Context:
    """The plain directives of one block, and the order-sensitive sequences in it."""

    directives: Counter[str] = field(default_factory=Counter)
    ordered: tuple[str, ...] = ()
    regex_locations: tuple[str, ...] = ()


@dataclass(frozen=True)
class DirectiveChange:
    context: str
    change: ChangeKind
    directive: str          # the directive (name + args) or the block label
    old: str = ""
    new: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"context": self.context, "change": self.change, "directive": self.directive,
                "old": self.old, "new": self.new}


def parse(main: str | Path) -> dict[str, Context]:
    """Every context of the config at ``main`` (includes inlined) by its label path."""
    try:
        import crossplane
    except ImportError:
        raise UsageError("comparing NGINX configs needs crossplane: pip install crossplane") from None
    path = Path(main)
    if not path.is_file():
        raise UsageError(f"{path}: no such NGINX config file")
    payload = crossplane.parse(str(path), combine=True, comments=False, single=False,
                               check_ctx=False, check_args=False)
    if payload.get("errors"):
        err = payload["errors"][0]
        raise ConfigError(f"{err.get('file', path)}:{err.get('line', '?')}: not a valid NGINX config: "
                          f"{err.get('error', '')}")
    parsed = payload["config"][0]["parsed"]
    out: dict[str, Context] = {}
    _walk(_substitute(parsed, canonical_names(parsed)), "main", out)
    return out


_NAMED = re.compile(r"@[A-Za-z0-9_]+")


def _named_blocks(block: Sequence[Mapping[str, Any]], out: dict[str, Any]) -> dict[str, Any]:
    for d in block:
        args = d.get("args", [])
        if d["directive"] == "location" and len(args) == 1 and str(args[0]).startswith("@"):
            out[str(args[0])] = d.get("block", [])
        if "block" in d:
            _named_blocks(d["block"], out)
    return out


def _substitute(obj: Any, names: Mapping[str, str]) -> Any:
    if isinstance(obj, str):
        return _NAMED.sub(lambda m: names.get(m.group(0), m.group(0)), obj)
    if isinstance(obj, list):
        return [_substitute(x, names) for x in obj]
    if isinstance(obj, dict):
        return {k: _substitute(v, names) if k in ("args", "block") else v for k, v in obj.items()
                if k not in ("line", "file", "includes")}
    return obj


def canonical_names(parsed: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Named locations (``@perimeter_up_36_0``) renamed by their content, so a location added
    before them does not make every generated name (and each reference to it) a change."""
    blocks = _named_blocks(parsed, {})
    names: dict[str, str] = {}
    for _ in range(4):  # references between named locations settle within their nesting depth
        names = {name: "@~" + hashlib.sha256(json.dumps(_substitute(b, names), sort_keys=True)
                                             .encode()).hexdigest()[:10]
                 for name, b in blocks.items()}
    return names


def _line(d: Mapping[str, Any]) -> str:
    return " ".join([str(d["directive"]), *(str(a) for a in d.get("args", []))])


def _label(d: Mapping[str, Any]) -> str:
    if d["directive"] == "server":
        listen = sorted(" ".join(x.get("args", [])) for x in d.get("block", []) if x["directive"] == "listen")
        names = sorted(" ".join(x.get("args", [])) for x in d.get("block", [])
                       if x["directive"] == "server_name")
        return "server " + ",".join(listen + names)
    return _line(d)


def _walk(block: Sequence[Mapping[str, Any]], here: str, out: dict[str, Context]) -> None:
    directives: Counter[str] = Counter()
    ordered: list[str] = []
    regex: list[str] = []
    seen: Counter[str] = Counter()
    for d in block:
        name = str(d["directive"])
        if "block" in d:
            label = _label(d)
            seen[label] += 1
            if seen[label] > 1:
                label = f"{label} #{seen[label]}"
            if name == "location" and d.get("args") and d["args"][0] in ("~", "~*"):
                regex.append(label)
            if name in ORDERED:
                ordered.append(label)
            _walk(d["block"], here + SEP + label, out)
        else:
            line = _line(d)
            directives[line] += 1
            if name in ORDERED:
                ordered.append(line)
    out[here] = Context(directives, tuple(ordered), tuple(regex))


def compare(old: Mapping[str, Context], new: Mapping[str, Context]) -> tuple[DirectiveChange, ...]:
    """What changed from ``old`` (the baseline) to ``new`` (the deployed config)."""
    changes: list[DirectiveChange] = []
    for ctx in sorted(old.keys() - new.keys()):
        changes.append(_block_change(ctx, "removed"))
    for ctx in sorted(new.keys() - old.keys()):
        changes.append(_block_change(ctx, "added"))
    for ctx in sorted(old.keys() & new.keys()):
        changes += _context_changes(ctx, old[ctx], new[ctx])
    return tuple(c for c in changes if not _inside_reported(c, changes))


def _block_change(ctx: str, kind: ChangeKind) -> DirectiveChange:
    parent, _, label = ctx.rpartition(SEP)
    return DirectiveChange(parent, kind, label)


def _inside_reported(c: DirectiveChange, changes: Iterable[DirectiveChange]) -> bool:
    """A block inside an added/removed block is not reported again."""
    return any(o is not c and o.change == c.change and o.change in ("added", "removed")
               and c.context.startswith(o.context + SEP + o.directive) for o in changes)


def _context_changes(ctx: str, old: Context, new: Context) -> list[DirectiveChange]:
    gone = old.directives - new.directives
    came = new.directives - old.directives
    out: list[DirectiveChange] = []
    by_name_old = _by_name(gone)
    by_name_new = _by_name(came)
    for name in sorted(by_name_old.keys() | by_name_new.keys()):
        olds, news = by_name_old.get(name, []), by_name_new.get(name, [])
        if len(olds) == 1 and len(news) == 1:
            out.append(DirectiveChange(ctx, "changed", name, olds[0], news[0]))
            continue
        out += [DirectiveChange(ctx, "removed", line) for line in olds]
        out += [DirectiveChange(ctx, "added", line) for line in news]
    if not gone and not came and old.ordered != new.ordered:
        out.append(DirectiveChange(ctx, "order", "rewrite-phase directives",
                                   "; ".join(old.ordered), "; ".join(new.ordered)))
    same_set = sorted(old.regex_locations) == sorted(new.regex_locations)
    if same_set and old.regex_locations != new.regex_locations:
        out.append(DirectiveChange(ctx, "order", "regex locations (first match wins)",
                                   "; ".join(old.regex_locations), "; ".join(new.regex_locations)))
    return out


def _by_name(lines: Counter[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in sorted(lines.elements()):
        out.setdefault(line.split(" ", 1)[0], []).append(line)
    return out


def diff_files(baseline_main: str | Path, deployed_main: str | Path) -> tuple[DirectiveChange, ...]:
    return compare(parse(baseline_main), parse(deployed_main))
