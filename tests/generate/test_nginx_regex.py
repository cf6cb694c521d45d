"""The NGINX generator's exact regexes (scanner/generate/nginx_regex.py) held against what they
claim, with Python's re (the same PCRE constructs over bytes)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scanner.generate.nginx_regex import NUMBER_LENIENT, UTF8_INVALID, brackets_at_most
from scanner.rules import BODY_DEPTH

INVALID = re.compile(UTF8_INVALID.encode())
SHALLOW = re.compile(brackets_at_most(BODY_DEPTH).replace(r"\z", r"\Z").encode())
LENIENT = re.compile(NUMBER_LENIENT.encode())


class _Plain:
    """$perimeter_plain's map: the first regex that matches gives the value (invalid: 0,
    shallow: 1), default 0."""

    @staticmethod
    def fullmatch(body: bytes) -> bool:
        return not INVALID.search(body) and bool(SHALLOW.match(body))


PLAIN = _Plain()


def plain(body: bytes) -> bool:
    """What $perimeter_plain claims: strict UTF-8 (Python's decoder) and at most BODY_DEPTH
    opening brackets."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return body.count(b"[") + body.count(b"{") <= BODY_DEPTH


# bytes around every boundary of the UTF-8 grammar, and the brackets
EDGES = [0x00, 0x0A, 0x22, 0x5B, 0x5C, 0x7B, 0x7D, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0,
         0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(EDGES), max_size=40).map(bytes))
def test_plain_body_is_exact_on_byte_edges(body: bytes) -> None:
    assert bool(PLAIN.fullmatch(body)) == plain(body)


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
       st.integers(min_value=0, max_value=BODY_DEPTH + 3))
def test_plain_body_is_exact_on_text_with_brackets(text: str, brackets: int) -> None:
    body = ("[" * brackets + text).encode()
    assert bool(PLAIN.fullmatch(body)) == plain(body)


def test_plain_body_named_cases() -> None:
    assert PLAIN.fullmatch(b'{"model": "m", "messages": [{"role": "user", "content": "\xc3\xa9"}]}')
    assert PLAIN.fullmatch(b"[" * BODY_DEPTH)
    for refused in (b"[" * (BODY_DEPTH + 1), b"{}" * (BODY_DEPTH + 1), b'{"a": "\xff"}', b"\xed\xa0\x80",  # surrogate
                    b"\xc0\x80", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80"):
        assert not PLAIN.fullmatch(refused), refused


# Number spellings njs's JSON.parse reads and Python's json refuses (measured on njs 0.7.9 and
# 0.9.9; +1 on 0.9 only), and JSON's own spellings of numbers (none of which may be taken for them).
LENIENT_SPELLINGS = st.from_regex(r"\A-?(?:0[0-9]{1,3}(?:\.[0-9]{1,3})?|\.[0-9]{1,3}|[0-9]{1,3}\.(?:[eE][+-]?[0-9])?)"
                                  r"\Z|\A\+[0-9]{1,3}\Z")
STRICT_NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False)).map(json.dumps)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
MARK = "\u0000lenient\u0000"


def _with_number(doc: object, spelled: str, where: int) -> bytes:
    """``doc`` as JSON with the ``where``-th value of a list or object (wrapped: at least one) given
    as ``spelled``."""
    wrapped = {"m": [doc, MARK]} if where % 2 else [MARK, doc]
    return json.dumps(wrapped, separators=(",", ":") if where % 3 else (", ", ": "),
                      ensure_ascii=where % 5 == 0).replace(json.dumps(MARK), spelled).encode()


@settings(max_examples=1500, deadline=None)
@given(JSON_VALUES, LENIENT_SPELLINGS, st.integers(min_value=0, max_value=29))
def test_lenient_number_in_a_value_place_is_found(doc: object, spelled: str, where: int) -> None:
    body = _with_number(doc, spelled, where)
    with pytest.raises(ValueError):
        json.loads(body)         # Python's json, and so vLLM, refuses the body
    assert LENIENT.search(body), body


@settings(max_examples=1500, deadline=None)
@given(JSON_VALUES, STRICT_NUMBERS, st.integers(min_value=0, max_value=29))
def test_json_numbers_outside_strings_are_not_taken_for_lenient_ones(doc: object, number: str, where: int) -> None:
    body = _with_number(doc, number, where)
    json.loads(body)
    # a match can only come from a string's text (njs then finds nothing outside strings)
    outside = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', body)
    assert not LENIENT.search(outside), body


def test_lenient_number_named_cases() -> None:
    for found in (b'{"a":010}', b'{"a": -01}', b"[.5]", b'{"a":1.e5}', b'{"a":1.}', b'{"a":+1}',
                  b'{"a":[1,\n 00.5]}', b'{"a":-Infinity}', b'{"a": [+Infinity]}'):   # njs 0.9 reads both
        assert LENIENT.search(found), found
    for clean in (b'{"a":10}', b'{"a":0.5}', b'{"a":1e5}', b'{"a":-0}', b'{"a":0}', b'{"a":[1, 2.5, 0]}',
                  b'{"a":-0.0e-0}', b'{"a":"1.5"}', b"010",   # one number: njs looks at it (not an object)
                  b'{"a":-1, "b":[-10.5]}'):
        assert not LENIENT.search(clean), clean
