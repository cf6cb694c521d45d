"""Near-miss forms of a real API key: what a key check weakened by hand would admit in its place.

A perimeter stores a key only as its sha256 and looks the bearer's digest up. A check weakened
so that it also takes the digest itself (pass-the-hash: the digest sits in config files), hashes
or compares only a prefix of the bearer (the key with another tail), ignores its last character,
or compares without case, admits some string that is not the key. Each form below is one such
string, derived from the real key; a correct perimeter refuses every one as an unknown key.

A form's value is a secret like the key it comes from: only its name goes into a case's label
("sha256-hex of role:user"), an attempt or a report, never the value (:class:`Form` keeps it out
of ``repr``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from scanner.policy.keys import key_sha256

# A bearer longer than this reads as no key to the generated NGINX (its map takes at most 1024
# characters: missing-key); a form that long may be refused for either reason.
BEARER_MAX = 1024

# The forms, in the order they are sent; each name says what the value is, never the value.
NAMES: tuple[str, ...] = (
    "sha256-hex",                # pass-the-hash: the stored digest as the bearer
    "upper-case sha256-hex",     # ... as a case-insensitive lookup (an NGINX map) would take it
    "last character dropped",    # the last character ignored, or a prefix compare
    "one character appended",    # only the first len(key) characters hashed or compared
    "last character changed",    # a compare of fewer than len(key) characters
    "first character changed",   # a suffix compare
    "case swapped",              # a case-insensitive compare
    "first half",                # a prefix compare of half the key
    "doubled",                   # a contains / starts-with / ends-with compare
    "principal name",            # the principal's name (in configs and logs) taken for its key
)


@dataclass(frozen=True)
class Form:
    name: str                              # one of NAMES: what the value is
    value: str = field(repr=False)         # never printed


def _other(c: str) -> str:
    """A character other than ``c`` even to a case-insensitive compare, of the key's alphabet."""
    return "x" if c.lower() != "x" else "y"


def _visible(value: str) -> bool:
    """One token of visible ASCII: what an Authorization header carries as it is."""
    return bool(value) and all("!" <= c <= "~" for c in value)


def forms(key: str, principal: str = "", real: Collection[str] = ()) -> tuple[Form, ...]:
    """The near-miss forms of ``key`` (``principal``: its principal's name, "" if unknown), in
    :data:`NAMES` order. Left out: an empty or invisible form, one equal to ``key`` or to an
    earlier form, and one that is a real key (its sha256 hex in ``real``: the plan's principals)."""
    digest = key_sha256(key)
    values = (digest, digest.upper(), key[:-1], key + _other(key[-1:]), key[:-1] + _other(key[-1:]),
              _other(key[:1]) + key[1:], key.swapcase(), key[:len(key) // 2], key + key, principal)
    taken = {d.lower() for d in real}
    seen = {key}
    out: list[Form] = []
    for name, value in zip(NAMES, values, strict=True):
        if not key or not _visible(value) or value in seen or key_sha256(value) in taken:
            continue
        seen.add(value)
        out.append(Form(name, value))
    return tuple(out)
