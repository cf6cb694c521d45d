"""How vLLM reads a request body: the one reading the body rules follow (the reference judge in
:mod:`scanner.plan.body`, ``scanner.plan.body.token_cost``), and the one njs (``vllmInt`` in
``templates/nginx-perimeter.js``) and Lua (``int_value`` / ``int_text`` in ``templates/envoy_json.lua.j2``)
copy.

* **Which bodies are JSON** (FastAPI's request parsing, vLLM 0.29's FastAPI): no
  ``Content-Type``, or one whose main type is ``application`` and subtype ``json`` or ``*+json``
  (``application/x-www-form-urlencoded+json`` too); any other body reaches the model as bytes
  and is refused by its validation.
* **The document** is Python's ``json.loads`` of the bytes (Starlette's ``request.json()``): a
  duplicated key keeps its last value (at the position of its first), ``\\u`` escapes are decoded,
  ``NaN`` / ``Infinity`` are numbers, UTF-16/32 bodies are detected by their first bytes.
* **An integer field** (``max_tokens``, ``n``, ...) is read by pydantic's lax mode (measured on
  vLLM 0.29.0, ``ChatCompletionRequest.model_validate``): ``true`` / ``false`` are 1 / 0; a float
  only when whole and within 64 bits; a string after Unicode whitespace is trimmed (Rust's
  ``char::is_whitespace``: ``\\u0085``, ``\\u00a0``, ``\\u3000`` too, not ``\\ufeff``) when it is
  an optional sign, ASCII digits with single underscores between them (leading zeros allowed),
  and an optional ``.`` with zeros only (``" +99_999 "``, ``"0099999"``, ``"99999.000"``).
  Refused: hex, octal and binary prefixes, exponents (``"1e5"``), ``"1__0"``, ``"_1"``, ``"1."``,
  ``"10.0_0"``, non-ASCII digits, ``"inf"``; lists, objects and null (no value).
"""

from __future__ import annotations

import email.message
import json
import math
import re

# Rust's char::is_whitespace (what pydantic-core trims around a numeric string)
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009" \
             "\u200a\u2028\u2029\u202f\u205f\u3000"
INT_TEXT = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?", re.ASCII)
INT64 = 2 ** 63


def js_whitespace_class() -> str:
    """:data:`WHITESPACE` as a JavaScript regex character class (njs's ``INT_WS``), runs of
    consecutive code points written as ranges: generated into the njs module, not copied."""
    points = sorted(ord(c) for c in WHITESPACE)
    runs: list[list[int]] = []
    for p in points:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])

    def esc(p: int) -> str:
        return chr(p) if p == 0x20 else f"\\x{p:02x}" if p < 0x100 else f"\\u{p:04x}"
    return "[" + "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in runs) + "]"


def utf8_whitespace() -> tuple[bytes, ...]:
    """:data:`WHITESPACE` as UTF-8 byte strings (Lua's ``WS`` table), generated into the Lua."""
    return tuple(sorted(c.encode("utf-8") for c in WHITESPACE))


def reads_json(content_type: str | None) -> bool:
    """Does vLLM's FastAPI parse a body with this ``Content-Type`` as JSON (None: no header)?"""
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def loads(raw: bytes) -> object:
    """The document vLLM reads from a JSON body; ValueError when it reads none."""
    return json.loads(raw)


def vllm_int(value: object) -> int | None:
    """An integer field's value as pydantic reads it (see the module docstring); None: refused."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value != math.floor(value) or not -INT64 <= value < INT64:
            return None
        return int(value)
    if isinstance(value, str):
        text = value.strip(WHITESPACE)
        if not INT_TEXT.fullmatch(text):
            return None
        return int(text.partition(".")[0].replace("_", ""))
    return None


def within(value: object, cap: int) -> bool:
    """Does a capped field with ``value`` pass: null (the field's default) or an integer pydantic
    reads as at most ``cap``? Anything vLLM would not read as an integer is refused too."""
    if value is None:
        return True
    n = vllm_int(value)
    return n is not None and n <= cap


def at(doc: object, path: str) -> object:
    """The value at a dotted ``path`` (``sampling_params.n``: member ``n`` of the object in member
    ``sampling_params``) of a document as vLLM reads it, through object members only; None when a
    member on the way is absent or not an object (or the value is null: vLLM's default either way)."""
    value = doc
    for name in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(name)
    return value
