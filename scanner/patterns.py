"""Path patterns: exact paths, templates and globs, one segment algebra for all.

A pattern is split on ``/`` into segments:

* a literal segment (``chat``) matches itself; it may hold ``*``/``?`` wildcards
  within the segment (``reset_*_cache``);
* ``{name}`` matches exactly one non-empty segment (a path parameter);
* ``*`` matches exactly one non-empty segment;
* ``**`` matches zero or more segments.

Inventory paths are templates (``/v1/responses/{response_id}``). A policy rule
*covers* a route when every path the route can serve is matched by the rule; two
rules *overlap* when some path is matched by both.
"""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache

PARAM = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}$")
# Characters a path parameter may hold when the proxy matches it: narrow on purpose
# (no '%', no '/', no dot-only segments), anchored, bounded length.
PARAM_REGEX = r"[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255}"


def segments(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.strip("/").split("/")) if pattern.strip("/") else ()


def is_param(seg: str) -> bool:
    return bool(PARAM.match(seg))


def _one(seg: str) -> bool:
    return seg == "*" or is_param(seg)


def _has_glob(seg: str) -> bool:
    return any(c in seg for c in "*?[") and not _one(seg) and seg != "**"


def is_exact(pattern: str) -> bool:
    return not any(s == "**" or _one(s) or _has_glob(s) for s in segments(pattern))


def is_template(pattern: str) -> bool:
    segs = segments(pattern)
    return any(is_param(s) for s in segs) and not any(s == "**" or s == "*" or _has_glob(s) for s in segs)


def validate(pattern: str) -> str | None:
    """Return why ``pattern`` is not a valid path pattern, or None."""
    if not pattern.startswith("/"):
        return "must start with '/'"
    if "//" in pattern:
        return "must not contain '//'"
    for seg in segments(pattern):
        if seg in (".", ".."):
            return "must not contain dot segments"
        if "{" in seg or "}" in seg:
            if not is_param(seg):
                return f"segment {seg!r} is not a valid {{parameter}}"
        elif "**" in seg and seg != "**":
            return f"'**' must be a whole segment (got {seg!r})"
        if "%" in seg:
            return "must not contain percent-encoding; write the decoded path"
    return None


def covers(rule: str, route: str) -> bool:
    """Does rule pattern ``rule`` match every path that route template ``route`` serves?"""
    return _covers(segments(rule), segments(route))


@lru_cache(maxsize=4096)
def _covers(rule: tuple[str, ...], route: tuple[str, ...]) -> bool:
    if not rule:
        return not route
    head, rest = rule[0], rule[1:]
    if head == "**":
        return any(_covers(rest, route[i:]) for i in range(len(route) + 1))
    if not route:
        return False
    seg = route[0]
    if _one(head):
        ok = True  # any single segment, literal or parameter
    elif is_param(seg):
        ok = False  # a literal rule segment cannot cover a parameter
    else:
        ok = fnmatch.fnmatchcase(seg, head) if _has_glob(head) else seg == head
    return ok and _covers(rest, route[1:])


def overlaps(a: str, b: str) -> bool:
    """Is there a path that both patterns match? Conservative for in-segment globs."""
    return _overlaps(segments(a), segments(b))


@lru_cache(maxsize=4096)
def _overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    if not a or not b:
        return all(s == "**" for s in a + b)
    if a[0] == "**":
        return _overlaps(a[1:], b) or _overlaps(a, b[1:])
    if b[0] == "**":
        return _overlaps(a, b[1:]) or _overlaps(a[1:], b)
    return _seg_overlap(a[0], b[0]) and _overlaps(a[1:], b[1:])


def _seg_overlap(x: str, y: str) -> bool:
    if _one(x) or _one(y):
        return True
    gx, gy = _has_glob(x), _has_glob(y)
    if gx and gy:
        px, py = re.split(r"[*?\[]", x)[0], re.split(r"[*?\[]", y)[0]
        return px.startswith(py) or py.startswith(px)
    if gx:
        return fnmatch.fnmatchcase(y, x)
    if gy:
        return fnmatch.fnmatchcase(x, y)
    return x == y


def to_regex(template: str, param_regex: str = PARAM_REGEX) -> str:
    """An anchored regex for a route template (parameters become narrow classes)."""
    parts = []
    for seg in segments(template):
        if is_param(seg) or seg == "*":
            parts.append(f"(?:{param_regex})")
        elif seg == "**":
            raise ValueError("'**' has no narrow regex; plans hold concrete route templates")
        else:
            parts.append(re.escape(seg).replace("\\-", "-"))
    return "^/" + "/".join(parts) + "$"
