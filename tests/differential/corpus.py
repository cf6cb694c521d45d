"""The differential corpus: hand-picked bodies plus bodies generated with hypothesis (numbers in
every form, duplicate and escaped keys, denied and unknown fields, counts, nesting, media shapes,
absent budgets, content types), each a raw JSON text built member by member so that every
spelling (an escaped key, ``1e3``, ``-0``, a string with Unicode whitespace) reaches the proxy as
written. Deterministic: the same corpus on every run (``derandomize``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.differential.harness import Case

CHAT, COMP, RESP = "/v1/chat/completions", "/v1/completions", "/v1/responses"
BATCH, TOKENIZE = "/v1/chat/completions/batch", "/tokenize"
GEN = "/inference/v1/generate"   # token in, token out: n and max_tokens inside sampling_params
# route -> (role, base members)
ROUTES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    CHAT: ("user", (('"model"', '"m"'), ('"messages"', '[{"role":"user","content":"hi"}]'))),
    COMP: ("user", (('"model"', '"m"'), ('"prompt"', '"hi"'))),
    RESP: ("user", (('"model"', '"m"'), ('"input"', '"hi"'))),
    BATCH: ("service", (('"model"', '"m"'), ('"messages"', '[[{"role":"user","content":"hi"}]]'))),
    TOKENIZE: ("service", (('"model"', '"m"'), ('"prompt"', '"hi"'))),
    GEN: ("service", (('"model"', '"m"'), ('"token_ids"', '[1,2]'))),
}
CAPPED = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of", "logprobs",
          "top_logprobs", "prompt_logprobs")
# what vLLM's model is asked for: the capped names, and the nested positions capped on GEN
READ = (*CAPPED, "sampling_params.n", "sampling_params.max_tokens")
DENIED = ("priority", "request_id", "kv_transfer_params", "cache_salt", "chat_template", "vllm_xargs",
          "chat_template_kwargs", "prompt_embeds")
UNKNOWN = ("foo", "Max_tokens", "max_tokens ", "max tokens", "a,b", "a:b", "", "\u043a\u043b\u044e\u0447",
           "max_tokens\u0000", "MAX_TOKENS")
NEAR = (0, 1, 3, 4, 5, 8, 9, 19, 20, 21, 4095, 4096, 4097, 8191, 8192, 8193, 99999)
WS = ("", "", "", " ", "\t", "\n", "\r", "\x0b", "\x0c", "\u00a0", "\u0085", "\u3000", "\u2003", "\ufeff",
      "\x1c", "\u200b")
NON_ASCII = {"fullwidth": 0xFF10, "arabic": 0x0660, "devanagari": 0x0966}
FLOATS = ("4096.0", "4097.0", "4096.5", "100.5", "1e3", "1E4", "4.096e3", "4.097e3", "-0", "-0.0", "0.0",
          "1e400", "-1e400", "1" + "0" * 25, "4096.00000000000000001", "4096.9999999999999999", "5e-324",
          "20.000", "21.0", "4.0", "5.0", "9007199254740993", "-4097", "1.5e1")
LITERALS = ("true", "false", "null", "[]", "[4096]", "{}", '""', '"abc"', '{"a":1}', '[1,2]')
CONTENT_TYPES = (None, "application/json; charset=utf-8", "text/plain", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x", "application/x-www-form-urlencoded+json", "APPLICATION/JSON",
                 "application/vnd.api+json", " multipart/form-data", "multipart/form-data+json",
                 "application/json+x-www-form-urlencoded", "application/x-www-form-urlencoded; charset=utf-8",
                 "application/x-www-form-urlencoded x+json")
MEDIA = (
    '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://a.example/x.png"}}]}]',
    '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]',
    '[{"role":"user","content":[{"type":"image_url","image_url":"DATA:image/png;base64,AA"}]}]',
    '[{"role":"user","content":[{"type":"image_url","image_url":{"url":null}}]}]',
    '[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]',
    '[{"role":"user","content":[{"type":"image_embeds","image_embeds":"AAAA"}]}]',
    '[{"role":"user","content":[{"type":"image_url","image_\\u0075rl":{"url":"https://b.example/y"}}]}]',
    '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x","url":"http://c.example/"}}]}]',
    '[{"role":"user","content":[' + ",".join(['{"type":"image_url","image_url":"data:,A"}'] * 9) + ']}]',
    '[{"role":"user","content":[' + ",".join(['{"type":"image_url","image_url":"data:,A"}'] * 8) + ']}]',
)


def key(name: str, escape: Sequence[bool] = ()) -> str:
    """The JSON text of key ``name``, each character ``\\u``-escaped where ``escape`` says."""
    out = []
    for i, ch in enumerate(name):
        if i < len(escape) and escape[i]:
            out.append(f"\\u{ord(ch):04x}" if i % 2 else f"\\u{ord(ch):04X}")
        else:
            out.append(json.dumps(ch, ensure_ascii=False)[1:-1])
    return '"' + "".join(out) + '"'


@st.composite
def numeric_string(draw: st.DrawFn) -> str:
    """A JSON string holding a number in one of pydantic's accepted or refused spellings."""
    n = draw(st.sampled_from(NEAR) | st.integers(0, 10 ** 6))
    digits = str(n)
    form = draw(st.sampled_from(("plain", "zeros", "under", "double-under", "edge-under", "hex", "exp",
                                 "non-ascii", "frac", "plain", "under")))
    if form == "zeros":
        digits = "0" * draw(st.integers(1, 3)) + digits
    elif form == "under" and len(digits) > 1:
        at = draw(st.integers(1, len(digits) - 1))
        digits = digits[:at] + "_" + digits[at:]
    elif form == "double-under" and len(digits) > 1:
        digits = digits[:1] + "__" + digits[1:]
    elif form == "edge-under":
        digits = draw(st.sampled_from(("_" + digits, digits + "_")))
    elif form == "hex":
        digits = f"0x{n:x}"
    elif form == "exp":
        digits = draw(st.sampled_from((f"{n}e0", f"{n / 1000:g}e3", f"{n}E+0")))
    elif form == "non-ascii":
        base = NON_ASCII[draw(st.sampled_from(sorted(NON_ASCII)))]
        digits = "".join(chr(base + int(c)) for c in digits)
    frac = draw(st.sampled_from(("", "", "", ".0", ".000", ".5", ".", ".0_0", ".00001")))
    sign = draw(st.sampled_from(("", "", "", "+", "-", "+-")))
    text = draw(st.sampled_from(WS)) + sign + digits + frac + draw(st.sampled_from(WS))
    return json.dumps(text, ensure_ascii=draw(st.booleans()))


def value() -> st.SearchStrategy[str]:
    """The JSON text of a capped field's value."""
    ints = (st.sampled_from(NEAR) | st.integers(-5, 10 ** 7)).map(str)
    return st.one_of(ints, ints, st.sampled_from(FLOATS), numeric_string(), numeric_string(),
                     st.sampled_from(LITERALS))


@st.composite
def spelled(draw: st.DrawFn, name: str) -> str:
    if draw(st.integers(0, 4)) == 0:
        return key(name, draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name))))
    return key(name)


def _list(n: int, item: str) -> str:
    return "[" + ",".join([item] * n) + "]"


@st.composite
def extra(draw: st.DrawFn, path: str) -> list[tuple[str, str]]:
    """One to three members added to a route's base body."""
    kind = draw(st.sampled_from(("cap", "cap", "cap", "cap", "dup", "denied", "unknown", "count", "nested",
                                 "media", "null-budget", "prompts", "sequences", "stream")))
    if kind == "sequences":    # the envelope: prompts x the larger of n and best_of against max_sequences
        k = draw(st.sampled_from((1, 2, 4, 5, 8, 17)))
        return [(key("prompt"), _list(k, '"p"')), (draw(spelled("n")), draw(st.sampled_from(("1", "2", "4", '"3"')))),
                (draw(spelled("best_of")), draw(st.sampled_from(("1", "4", "null", "5.0"))))]
    if kind == "stream":       # what a settled route writes into a stream (stream_options.include_usage)
        return [(key("stream"), draw(st.sampled_from(("true", "false", '"yes"', "1", "null")))),
                (key("stream_options"), draw(st.sampled_from(("null", "{}", '{"include_usage":false}',
                                                               '{"include_usage":true}', '"x"'))))]
    if kind == "prompts":
        k = draw(st.integers(0, 20))
        item = draw(st.sampled_from(('"p"', "[1,2]", "1", '{"a":1}')))
        return [(key("prompt"), _list(k, item))]
    if kind == "cap":
        return [(draw(spelled(draw(st.sampled_from(CAPPED)))), draw(value()))]
    if kind == "dup":
        name = draw(st.sampled_from(CAPPED))
        return [(draw(spelled(name)), draw(value())), (draw(spelled(name)), draw(value()))]
    if kind == "denied":
        return [(draw(spelled(draw(st.sampled_from(DENIED)))), draw(st.sampled_from(('"x"', "1", "null", "{}"))))]
    if kind == "unknown":
        return [(key(draw(st.sampled_from(UNKNOWN))), "1")]
    if kind == "count":
        which = draw(st.sampled_from(("stop", "stop", "stop_token_ids", "logit_bias", "tools", "bad_words")))
        if which == "logit_bias":
            k = draw(st.sampled_from((0, 299, 300, 301)))
            return [(key(which), "{" + ",".join(f'"{i}":1' for i in range(k)) + "}")]
        k = draw(st.integers(0, 70) if which in ("stop_token_ids", "bad_words") else st.integers(0, 18))
        item = {"stop": '"s"', "stop_token_ids": "1", "bad_words": '"w"',
                "tools": '{"type":"function","function":{"name":"f"}}'}[which]
        shape = draw(st.sampled_from(("list", "list", "string", "object", "null")))
        text = {"list": _list(k, item), "string": '"s"', "object": '{"a":"b"}', "null": "null"}[shape]
        return [(draw(spelled(which)), text)]
    if kind == "nested":
        name = draw(st.sampled_from(CAPPED))
        return [(key("metadata"), f'{{"{name}": {draw(value())}}}')]
    if kind == "media":
        return [(key("messages"), draw(st.sampled_from(MEDIA)))]
    return [(draw(spelled(draw(st.sampled_from(("max_tokens", "max_completion_tokens", "max_output_tokens"))))),
             "null")]


@st.composite
def generated(draw: st.DrawFn) -> tuple[str, bytes, str | None]:
    path = draw(st.sampled_from((CHAT, CHAT, CHAT, COMP, COMP, RESP, BATCH, TOKENIZE)))
    _role, base = ROUTES[path]
    members = list(base)
    for _ in range(draw(st.integers(1, 3))):
        for m in draw(extra(path)):
            members.insert(draw(st.integers(0, len(members))), m)
    sep = draw(st.sampled_from((",", ", ", ",\n  ")))
    colon = draw(st.sampled_from((":", ": ", " : ")))
    raw = "{" + sep.join(k + colon + v for k, v in members) + "}"
    ct = draw(st.sampled_from(CONTENT_TYPES)) if draw(st.integers(0, 14)) == 0 else "application/json"
    return path, raw.encode("utf-8"), ct


T = TypeVar("T")


def draw_many(strategy: st.SearchStrategy[T], n: int) -> list[T]:
    """``n`` examples of ``strategy``, the same on every run."""
    out: list[T] = []

    @settings(max_examples=n, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), deadline=None)
    @given(strategy)
    def collect(example: T) -> None:
        out.append(example)

    collect()
    return out


def _gen(members: str) -> bytes:
    return ('{"model":"m","token_ids":[1,2]' + (", " + members if members else "") + "}").encode("utf-8")


def _chat(members: str) -> bytes:
    return ('{"model":"m","messages":[{"role":"user","content":"hi"}],' + members + "}").encode("utf-8")


# Chat members whose numbers JSON.stringify would not write back as sent (1e400 as null, 10**25 as
# 1e+25, 2**63-1 rounded, 1.0 as 1, -0.0 as 0, 1E+2 as 100, 0.10 as 0.1, 1e-7 from 0.0000001), nested
# in objects and lists, under integer-like names (visited first by JSON.parse's reviver), twice
# under one name, beside members the rewriting policy strips (chat_template, an unknown name) or
# pins (priority: the pin's 0, not the client's 0.0), after strings that look like numbers or end in
# an escaped backslash; most without a budget (written in: rewritten on both policies).
NUMBER_TEXTS = (
    '"seed": 9223372036854775807',
    '"seed": -9223372036854775808, "temperature": 1.0, "top_p": 0.10',
    '"seed": 10000000000000000000000000, "max_tokens": 16.0',
    '"temperature": -0.0, "top_p": 1E+2, "frequency_penalty": -0, "presence_penalty": 1e400',
    '"metadata": {"big": 10000000000000000000000000, "zero": -0, "one": 1.0, "inf": 1e400, "e": 1E+2,'
    ' "tenth": 0.10, "pi": 3.14159265358979323846264338327950288, "tiny": 0.0000001, "sub": 2.5e-324}',
    '"metadata": {"x": [[1.0, [1e400, -0.0, 18446744073709551615]], {"y": 0.10, "z": [1e-7, 1.5e+300]}]}',
    '"logit_bias": {"b": 1.0, "50256": -100.00, "1": 2.50, "0": -0.0}',
    '"temperature": 1e400, "temperature": 0.50, "metadata": {"a": 1.0, "a": 2.0}',
    '"n": 1.0, "best_of": 1.00, "stop_token_ids": [1e2, 2.0, 3], "chat_template": "x", "foo": 1.0',
    '"priority": 0.0, "service_tier": "auto", "seed": 1.0, "fooBar": [1e400]',
    '"user": "1.0 1e400 -0 \\"2.50\\" \\\\", "seed": 1e2, "metadata": {"1e5": 1.0, "s": "\\\\"}',
    '"max_tokens": 8.0, "temperature": 0.70, "top_p": 0.95',
    '"metadata": {"many": 0.1234567890123456789, "int": 123456789012345678901234567890, "neg": -1.0e-0}',
)


# Numbers njs's JSON.parse reads (measured, 0.7.9 and 0.9.9) where Python's json refuses the body:
# a leading zero, no integer part, no fraction digits, a plus sign (0.9); on a capped key (the fast
# path's regex flags it), a free one, nested; then strings that spell the same patterns in a value's
# place (forwarded: nothing outside a string), and after an escaped quote or backslash.
LENIENT_NUMBERS = (
    '"max_tokens": 010', '"max_tokens": 0100', '"n": 00', '"temperature": .5', '"temperature": -.5',
    '"top_p": 1.', '"seed": 1.e5', '"seed": -01', '"seed": +1', '"seed": 9.e9',
    '"metadata": {"a": [1, 00.5]}', '"logit_bias": {"1": 5.}', '"stop_token_ids": [1,02]',
    '"user": "a, 1. b: 09 [.5 ,+1 ,-01 :0.", "seed": 1',
    '"user": "x\\\\", "seed": .5', '"user": "\\", .5", "seed": 2', '"user": "\\\\\\", 010"',
)


# (path, raw body, content type, note)
HAND: tuple[tuple[str, bytes, str | None, str], ...] = (
    *((CHAT, _chat(f'"max_tokens": {json.dumps(v)}'), "application/json", f"measured {v!r}")
      for v in (" +99_999 ", "0099999", "99999.000", "9_9_9_9_9", "\t100", "99999\n", "0x65", "1e5",
                "9.9999e4", "99999.5", "\uff19\uff19", "\u0669\u0669", "1__0", "_10", "10_", "4_0_9_7",
                "04096.0", "+4096", "-4096", " 4096 ", "\u00a04097", "\u30004097", "\ufeff4097", "\x1c4097")),
    (CHAT, _chat('"max\\u005ftokens": 99999'), "application/json", "escaped key over the cap"),
    (CHAT, _chat('"max\\u005Ftokens": "4097"'), "application/json", "escaped key, string over the cap"),
    (CHAT, _chat('"max_tokens": 1, "max_tokens": 99999'), "application/json", "duplicate: last over"),
    (CHAT, _chat('"max_tokens": 99999, "max_tokens": 1'), "application/json", "duplicate: first over"),
    (CHAT, _chat('"max_tokens": 5, "max_tokens": null'), "application/json", "duplicate: last null"),
    (CHAT, _chat('"max_completion_tokens": null, "max_tokens": null'), "application/json", "budget nulls"),
    (CHAT, _chat('"max_completion_tokens": 0'), "application/json", "budget zero"),
    (CHAT, _chat('"n": "4", "n": "5"'), "application/json", "n duplicate strings"),
    (CHAT, _chat('"n": 4.0'), "application/json", "n float whole"),
    (CHAT, _chat('"n": 5.0'), "application/json", "n float over"),
    (CHAT, _chat('"max_tokens": NaN'), "application/json", "NaN literal"),
    (CHAT, _chat('"max_tokens": Infinity'), "application/json", "Infinity literal"),
    (CHAT, _chat('"temperature": NaN'), "application/json", "NaN on an uncapped field"),
    (CHAT, _chat('"max_tokens": 4096') + b" ", "application/json", "trailing space"),
    (CHAT, b"\xef\xbb\xbf" + _chat('"max_tokens": 99999'), "application/json", "UTF-8 BOM"),
    (CHAT, _chat('"max_tokens": 99999').decode().encode("utf-16"), "application/json", "UTF-16 over"),
    (CHAT, _chat('"max_tokens": 99999').decode().encode("utf-16-le"), "application/json", "UTF-16-LE over"),
    (CHAT, b'[{"max_tokens": 99999}]', "application/json", "an array"),
    (CHAT, b'"x"', "application/json", "a string"),
    (CHAT, b"{", "application/json", "truncated"),
    (CHAT, b'{"model":"m","messages":[{"role":"user","content":"\xff"}]}', "application/json", "invalid UTF-8"),
    (CHAT, _chat('"max_tokens": 99999'), "application/x-www-form-urlencoded+json", "+json form-like type"),
    (CHAT, _chat('"max_tokens": 99999'), "multipart/form-data+json", "multipart+json"),
    (CHAT, _chat('"max_tokens": 99999'), "application/x-www-form-urlencoded", "form type, JSON body"),
    (CHAT, _chat('"max_tokens": 99999'), None, "no content type"),
    (CHAT, _chat('"max_tokens": 99999'), "application/x-www-form-urlencoded x+json", "form type, then +json"),
    (CHAT, _chat('"max_tokens": 99999'), "application/x-www-form-urlencoded +json; a=b", "form, +json, param"),
    (CHAT, _chat('"max_tokens": 99999'), "multipart/form-data x+json", "multipart, then +json"),
    (CHAT, _chat('"max_tokens": 99999'), "application/x-www-form-urlencoded ; charset=utf-8", "form, space"),
    (CHAT, _chat('"max_tokens": 99999'), "text/plain", "text/plain"),
    (CHAT, _chat('"logit_bias": {{{}}}'.format(",".join(f'"{i}":1' for i in range(300))) + ', "logit_bias": {}'),
     "application/json", "duplicate count, last small"),
    (CHAT, _chat('"stop": [{}]'.format(",".join(['"s"'] * 17))), "application/json", "stop 17"),
    (CHAT, _chat('"st\\u006fp": [{}]'.format(",".join(['"s"'] * 17))), "application/json", "escaped stop 17"),
    (CHAT, _chat('"stop": [{}], "stop": ["s"]'.format(",".join(['"s"'] * 17))), "application/json", "dup stop"),
    (CHAT, _chat('"metadata": {"max_tokens": 99999}'), "application/json", "nested cap"),
    (CHAT, _chat('"cache\\u005fsalt": "x"'), "application/json", "escaped denied"),
    (CHAT, _chat('"priority": 1, "priority": null'), "application/json", "denied then null"),
    (CHAT, _chat('"1": 1, "max_tokens": 99999'), "application/json", "integer-like key first"),
    (CHAT, b'{"model":"m","messages":' + b"[" * 200 + b"]" * 200 + b"}", "application/json", "deep nesting"),
    *((CHAT, b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":' + b"[" * k + b"]" * k + b"}",
       "application/json", f"nesting {k}") for k in (30, 64, 100, 126, 127, 128, 129, 130, 1000)),
    # the plan's depth (scanner/rules.py BODY_DEPTH, 31 levels, the root object one): at it, past it,
    # in objects, arrays and both, brackets in strings (not nesting), and deep bodies that are also
    # malformed, not objects, not UTF-8 or unterminated (the depth's reason first, in every reader)
    *((CHAT, _chat('"metadata": ' + "[" * k + "]" * k), "application/json", f"depth {k + 1}") for k in (29, 30, 31)),
    *((CHAT, _chat('"metadata": ' + '{"a":' * k + "1" + "}" * k), "application/json", f"object depth {k + 1}")
      for k in (30, 31)),
    *((CHAT, _chat('"metadata": ' + '[{"a":' * (k // 2) + "[]" + "}]" * (k // 2)), "application/json",
       f"mixed depth {k // 2 * 2 + 2}") for k in (28, 30)),
    (CHAT, _chat('"metadata": "' + "[" * 40 + '"'), "application/json", "brackets in a string"),
    (CHAT, _chat('"metadata": "\\"' + "[" * 40 + '"'), "application/json", "brackets after an escaped quote"),
    (CHAT, _chat('"metadata": "\\\\", "x": ' + "[" * 31 + "]" * 31), "application/json",
     "escaped backslash, then deep"),
    (CHAT, b"[" * 31 + b"]" * 31, "application/json", "array depth 31"),
    (CHAT, b"[" * 32 + b"]" * 32, "application/json", "array depth 32"),
    (CHAT, b"[[1]]", "application/json", "an array"),
    (CHAT, b' "x" ', "application/json", "a string"),
    (CHAT, b"12", "application/json", "a number"),
    (CHAT, b'["\x01"]', "application/json", "an array, control byte"),
    (CHAT, b'["\\x"]', "application/json", "an array, bad escape"),
    (CHAT, b"[1] x", "application/json", "an array, then text"),
    (CHAT, _chat('"metadata": ' + "[" * 40), "application/json", "deep, unterminated"),
    (CHAT, _chat('"metadata": ' + "[" * 40 + "]" * 40 + ",,"), "application/json", "deep, then malformed"),
    (CHAT, _chat('"metadata": ' + "[" * 40 + '"X"' + "]" * 40).replace(b"X", b"\xff"),
     "application/json", "deep, not UTF-8"),
    (CHAT, _chat('"metadata": "X", "x": ' + "[" * 40 + "]" * 40).replace(b'"X"', b'"\xff"'),
     "application/json", "not UTF-8, then deep"),
    (CHAT, b'{"model":"m", "metadata": "' + b"[" * 40, "application/json", "unterminated string of brackets"),
    *((CHAT, _chat(f'"messages": {m}'), "application/json", f"media {i}") for i, m in enumerate(MEDIA)),
    (CHAT, _chat('"messages": [{"role":"user","content":[{"type":"image_url","image_url":"data:,%s"}]}]'
                 % ("A" * 524288)), "application/json", "media data over"),
    (COMP, b'{"model":"m","prompt":"hi","max_tokens":"4_096.000"}', "application/json", "completions string"),
    (COMP, b'{"model":"m","prompt":"hi","logprobs":"5"}', "application/json", "completions logprobs string"),
    (COMP, b'{"model":"m","prompt":"hi"}', "application/json", "completions absent budget"),
    *((COMP, ('{"model":"m","prompt":[' + ",".join(['"p"'] * k) + '],"n":' + n + ',"max_tokens":16}').encode(),
       "application/json", f"envelope: {k} prompts, n={n}")
      for k, n in ((16, "1"), (17, "1"), (4, "4"), (5, "4"), (5, '" 4 "'), (5, '"4.000"'), (4, '"+4"'),
                   (5, "4.0"), (5, "true"), (17, "null"))),
    (CHAT, _chat('"n": " 4 ", "max_completion_tokens": "4_0_9_6"'), "application/json", "envelope strings"),
    (RESP, b'{"model":"m","input":"hi","max_output_tokens":" 4097"}', "application/json", "responses over"),
    (BATCH, b'{"model":"m","messages":[[{"role":"user","content":"hi"}]],"max_tokens":"8193"}',
     "application/json", "batch string over"),
    (TOKENIZE, b'{"model":"m","prompt":"hi","max_tokens":8193}', "application/json", "fast path over"),
    (TOKENIZE, b'{"model":"m","prompt":"hi","max_tokens":8192}', "application/json", "fast path at cap"),
    (TOKENIZE, b'{"model":"m","prompt":"hi","max_tokens":"8193"}', "application/json", "fast path string"),
    (TOKENIZE, b'{"model":"m","prompt":"hi","max_tokens":8192,"max_tokens":8193}', "application/json",
     "fast path duplicate"),
    (TOKENIZE, b'{"model":"m","prompt":"hi","cache_salt":"x"}', "application/json", "fast path denied"),
    # /inference/v1/generate: the caps and the output budget at their nested positions
    *((GEN, _gen(f'"sampling_params": {{{m}}}'), "application/json", f"generate {{{m}}}")
      for m in ('"n": 8000, "max_tokens": 8192', '"n": 9', '"n": 8', '"max_tokens": 8193', '"max_tokens": 8192',
                '', '"max_tokens": null', '"n": null', '"n": null, "max_tokens": null', '"n": "9"',
                '"n": " 8 "', '"max_tokens": "8_193"', '"max_tokens": "8192.000"', '"n": 8.0', '"n": 9.0',
                '"n": true', '"n": "0x10"', '"n": 1, "n": 9', '"n": 9, "n": 1', '"max_tokens": 5, "max_tokens": null',
                '"max_tokens": 8193, "max_tokens": 7', '"n\u0020": 9', '"\u006e": 9', '"max\u005ftokens": 8193',
                '"n": [9]', '"n": {"n": 9}', '"structured_outputs": {"n": 9}', '"temperature": 0.5',
                '"n": 8, "max_tokens": 16, "stop": ["x"]')),
    (GEN, _gen(""), "application/json", "generate without sampling_params"),
    (GEN, _gen('"sampling_params": null'), "application/json", "generate sampling_params null"),
    (GEN, _gen('"sampling_params": "x"'), "application/json", "generate sampling_params a string"),
    (GEN, _gen('"sampling_params": [{"n": 9}]'), "application/json", "generate sampling_params a list"),
    (GEN, _gen('"sampling_params": {"n": 9}, "sampling_params": {"n": 1}'), "application/json",
     "generate duplicate parent, last within"),
    (GEN, _gen('"sampling_params": {"n": 1}, "sampling_params": {"n": 9}'), "application/json",
     "generate duplicate parent, last over"),
    (GEN, _gen('"sampling_params": {"max_tokens": 8}, "sampling_params": {}'), "application/json",
     "generate duplicate parent, last without budget"),
    (GEN, _gen('"n": 9, "max_tokens": 8193, "sampling_params": {"n": 2}'), "application/json",
     "generate top-level copies over"),
    (GEN, _gen('"sampling_params": {"n": 8, "max_tokens": 8192}'), "application/json", "generate at both caps"),
    (GEN, _gen('"sampling\u005fparams": {"n": 9}'), "application/json", "generate escaped parent, over"),
    # a malformed name inside an object the top-level read skips (Python's json: bad-json); Envoy's
    # count, nested cap and nested budget re-read that object (they raised a Lua error: 500)
    (CHAT, _chat('"logit_bias": {"\\x": 1}'), "application/json", "count object, invalid escape in a name"),
    (CHAT, _chat('"logit_bias": {"1": 1, "\\u12": 2}'), "application/json", "count object, short \\u in a name"),
    (CHAT, _chat('"logit_bias": {"a\tb": 1}'), "application/json", "count object, control byte in a name"),
    (CHAT, _chat('"logit_bias": {"\\": 1}'), "application/json", "count object, lone backslash name"),
    (GEN, _gen('"sampling_params": {"\\x": 1, "n": 9}'), "application/json", "nested cap, invalid escape in a name"),
    (GEN, _gen('"sampling_params": {"\\q": 1}'), "application/json", "nested budget parent, invalid escape"),
    # invalid UTF-8 (Python's codec, and so vLLM, refuses the body; njs decoded it leniently, Lua
    # did not look), beside valid sequences at each length's edges
    *((CHAT, b'{"model":"m","messages":[{"role":"user","content":"a' + seq + b'b"}]}', "application/json",
       f"UTF-8 {seq.hex()} in a string") for seq in (
        b"\xc0\x80", b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80",
        b"\xf5\x80\x80\x80", b"\xe2\x82", b"\x80", b"\xef\xbf\xbd", b"\xc2\x80", b"\xe0\xa0\x80",
        b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xef\xbf\xbd\xff")),
    (CHAT, _chat('"logit_bias": {"1": 1}').replace(b'"1"', b'"\xff"'), "application/json", "invalid UTF-8 in a name"),
    # numbers a double does not hold as sent, in a body the perimeter rewrites (its budget written
    # in, on the rewriting policy also the salt, the pins and the strips): forwarded as sent, by the
    # reference and Lua (each value's text) and by njs (its number texts kept over JSON.stringify)
    *((CHAT, _chat(m), "application/json", f"numbers as sent: {m[:60]}") for m in NUMBER_TEXTS),
    # the budget written into a nested object beside the client's numbers there
    *((GEN, _gen(f'"sampling_params": {{{m}}}'), "application/json", f"numbers as sent: generate {{{m}}}")
      for m in ('"temperature": 1.0, "seed": 9223372036854775807, "n": 1.0',
                '"max_tokens": null, "top_p": 0.50, "min_p": 1e-7, "seed": -0')),
    # numbers njs's JSON.parse reads and Python's json refuses (bad-json to the reference and vLLM)
    *((CHAT, _chat(m), "application/json", f"lenient number: {m}") for m in LENIENT_NUMBERS),
    (GEN, _gen('"sampling_params": {"n": 01, "temperature": 1.}'), "application/json", "lenient numbers nested"),
    *((CHAT, raw, "application/json", f"lenient number at the top: {raw!r}") for raw in (b"010", b" .5", b"+1")),
    # -Infinity: njs 0.9's JSON.parse reads it (as null), Python's json reads it and the reference
    # refuses it (bad-json); njs forwarded it (found by a fuzzing campaign)
    *((CHAT, _chat(m), "application/json", f"-Infinity: {m}") for m in (
        '"temperature": -Infinity', '"metadata": {"a": [1, -Infinity]}', '"user": ":-Infinity", "seed": 1')),
    (TOKENIZE, b'{"model":"m","prompt":"hi","x":-Infinity}', "application/json", "-Infinity, no budget"),
    (CHAT, b"-Infinity", "application/json", "-Infinity at the top"),
    # lone surrogate escapes (refused, bad-json): njs reads each as U+FFFD and Lua as one byte, so
    # distinct names were one to them, and logit_bias's 301 names passed a count of 300; pairs and
    # escaped backslashes before "u" are forwarded
    *((CHAT, _chat(m), "application/json", f"surrogate: {m[:60]}") for m in (
        '"logit_bias": {' + ",".join(f'"\\u{0xd800 + i:04x}":1' for i in range(301)) + "}",
        '"logit_bias": {' + ",".join(f'"{i}":1' for i in range(299)) + ', "\\ud800": 1, "\\udc00": 1}',
        '"user": "\\ud800x"', '"user": "x\\udbff"', '"user": "\\udc00\\ud800"', '"user": "\\ud800\\n"',
        '"metadata": {"\\udfff": 1}', '"stop": ["\\ud800\\ud800"]',
        '"user": "\\ud83d\\ude00 \\udbff\\udfff", "seed": 1.0', '"user": "\\\\ud800"',
        '"user": "\\\\\\ud800"',
        # a pair of escapes is one character, the same name as its UTF-8 (300 names to Python;
        # Lua read the pair as two bytes of its own: 301)
        '"logit_bias": {' + ",".join(f'"{i}":1' for i in range(299)) + ', "\U0001f600": 1, "\\ud83d\\ude00": 2}')),
    (TOKENIZE, b'{"model":"m","prompt":"a\\ud800"}', "application/json", "surrogate, no budget"),
    (CHAT, b'"\\ud800"', "application/json", "surrogate, a string at the top"),
    # strings the Lua reader skipped unread were not validated (Python's json refuses the body)
    *((CHAT, _chat(m), "application/json", f"string contents: {m!r}") for m in (
        '"user": "a\x01b"', '"metadata": {"k": "a\tb"}', '"metadata": {"a\\qb": 1}',
        '"metadata": {"k": "\\u12"}', '"stop": ["\x00"]', '"user": "x\x7fy"')),
    (GEN, _gen('"sampling_params": {"n": 1}, "token_ids": [1], "x": "\x1f"'), "application/json",
     "string contents: control byte, nested budget route"),
)


def cases(generated_count: int = 860) -> list[Case]:
    """The whole corpus: the hand-picked bodies, then ``generated_count`` generated ones."""
    out = [Case(f"h{i}", path, raw, ct, ROUTES[path][0], note) for i, (path, raw, ct, note) in enumerate(HAND)]
    for i, (path, raw, ct) in enumerate(draw_many(generated(), generated_count)):
        out.append(Case(f"g{i}", path, raw, ct, ROUTES[path][0]))
    return out


