"""Regexes the NGINX generator writes into ``map`` keys (PCRE, case-sensitive).

They are written with ``\\x22`` for a double quote and ``\\x5c`` for a backslash so
that NGINX's own quoting (which rewrites ``\\"``, ``\\\\``, ``\\t``, ``\\n``, ``\\r``)
never touches them. Every regex here is *conservative*: it may flag a body that is
harmless (the njs slow path then decides exactly), never the reverse.
"""

from __future__ import annotations

QUOTE = r"\x22"
BACKSLASH = r"\x5c"
# JSON whitespace is [ \t\n\r]; \s is a superset, which only makes a match more likely.
WS = r"\s*"


def _hex_class(digit: str) -> str:
    return f"[{digit.lower()}{digit.upper()}]" if digit.isalpha() else digit


def json_key(name: str) -> str:
    """A regex for every JSON string token that decodes to ``name`` (ASCII names).

    In JSON a character of a key is written either as itself or as ``\\u00XX`` (hex
    in either case); nothing else decodes to an ASCII letter, digit or ``_``.
    """
    parts = []
    for ch in name:
        if not (ch.isascii() and (ch.isalnum() or ch == "_")):
            raise ValueError(f"json_key: unsupported character {ch!r} in {name!r}")
        code = f"{ord(ch):04x}"
        escaped = BACKSLASH + "u" + "".join(_hex_class(d) for d in code)
        parts.append(f"(?:{ch}|{escaped})")
    return QUOTE + "".join(parts) + QUOTE


def uint_at_most(cap: int) -> str:
    """A regex for the JSON integer literals 0..cap (no sign, no leading zero)."""
    if cap < 0:
        raise ValueError("cap must be >= 0")
    digits = str(cap)
    n = len(digits)
    alts = ["0"]
    if n >= 2:
        alts.append("[1-9]" if n == 2 else f"[1-9][0-9]{{0,{n - 2}}}")
    for i in range(n):
        d = int(digits[i])
        low = 1 if i == 0 else 0
        if d > low:
            hi = d - 1
            cls = str(low) if hi == low else f"[{low}-{hi}]"
            rest = n - i - 1
            tail = "" if rest == 0 else ("[0-9]" if rest == 1 else f"[0-9]{{{rest}}}")
            alts.append(digits[:i] + cls + tail)
    if cap > 0:
        alts.append(digits)
    return "(?:" + "|".join(dict.fromkeys(alts)) + ")"


# Python's json.loads(bytes) (what Starlette's request.json() calls) decodes UTF-16 and
# UTF-32 when the body starts with their BOM or has a NUL in its first two bytes; such a
# body hides its keys from a byte-level match, so it always goes to the exact check.
# Kept apart from unsafe_body(): an anchored branch in that alternation would stop PCRE
# from skipping to the next '"' and make it try every position of the body.
UNSAFE_ENCODING = r"\A(?:[\s\S]?\x00|\xfe\xff|\xff\xfe)"

# Where a body stops being strict UTF-8 (Python's decoder: no overlong form, no surrogate, nothing
# past U+10FFFF): a byte no character starts or continues with, a lead byte without its
# continuation bytes, a continuation byte no lead byte within three before it claims. A body
# with none of these is valid (each character's lead checks what follows it; a continuation
# byte outside every character's span is claimed by no lead). A search with single-byte steps
# and fixed lookarounds only: linear, no group repeated per character (whose backtracking would
# fill PCRE's JIT stack on a long multi-byte body), nothing gixy's parser cannot read.
UTF8_INVALID = (
    r"[\xc0\xc1\xf5-\xff]"
    r"|[\xc2-\xdf](?![\x80-\xbf])|\xe0(?![\xa0-\xbf][\x80-\xbf])"
    r"|[\xe1-\xec\xee\xef](?![\x80-\xbf]{2})|\xed(?![\x80-\x9f][\x80-\xbf])"
    r"|\xf0(?![\x90-\xbf][\x80-\xbf]{2})|[\xf1-\xf3](?![\x80-\xbf]{3})|\xf4(?![\x80-\x8f][\x80-\xbf]{2})"
    r"|(?<![\xc2-\xf4])(?<![\xe0-\xf4][\x80-\xbf])(?<![\xf0-\xf4][\x80-\xbf]{2})[\x80-\xbf]")


# Where a body may hold a number njs's JSON.parse reads and Python's json refuses (measured on njs
# 0.7.9 and 0.9.9: a leading zero 010 -01 00.5, no integer part .5 -.5, no fraction digits 1. 1.e5,
# and on 0.9 a plus sign +1 +Infinity, and -Infinity): such a token in a member's or an element's
# place (after ``:``, ``,`` or ``[`` and whitespace; a body that is one number is not an object, and
# njs looks at it there). Conservative: strings are not skipped (a string holding ", 1." matches
# too) and ``\s`` is a superset of JSON's whitespace; njs then looks for such a token outside
# strings (lenientNumber). No anchored branch: every match starts at one of three bytes, which PCRE
# skips to.
NUMBER_LENIENT = r"[:,\x5b]\s*(?:\+|-I|-?(?:0[0-9]|\.|[0-9]+\.(?![0-9])))"


def brackets_at_most(depth: int) -> str:
    """A regex for the bodies that open at most ``depth`` brackets (``[`` or ``{``, in strings
    too): such a body cannot nest deeper than ``depth``."""
    return rf"\A[^\x5b\x7b]*(?:[\x5b\x7b][^\x5b\x7b]*){{0,{depth}}}\z"


def unsafe_body(caps: dict[str, int], forbidden: tuple[str, ...]) -> str:
    """A regex that matches a body the fast path cannot clear.

    A capped key is cleared only when it is followed by a plain integer within its
    cap, or ``null``, and then ``,`` or ``}``; a forbidden key is never cleared.
    Every top-level key of a valid JSON object appears as a string token followed by
    ``:``, so a body this regex does not match has no capped value over its cap and no
    forbidden key; anything else (strings, floats, booleans, escapes that spell a key,
    nested copies) goes to the exact check; see also UNSAFE_ENCODING.
    """
    alts = []
    for name, cap in sorted(caps.items()):
        safe = f"(?:{uint_at_most(cap)}|null){WS}[,}}]"
        alts.append(f"{json_key(name)}{WS}:(?!{WS}{safe})")
    for name in sorted(set(forbidden)):
        alts.append(f"{json_key(name)}{WS}:")
    return "|".join(alts)
