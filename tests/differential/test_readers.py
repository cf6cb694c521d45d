"""The body reader every rule follows (scanner/plan/vllm_json.py, scanner/plan/body.py): numbers as
vLLM 0.29's pydantic models read them (measured: tests/differential/test_corpus.py holds them to
the models themselves), JSON content types as its FastAPI reads them; and the probe proves the
proxies read them so (a proxy that takes a JSON content type for a form fails it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.body import DEPTH_REASON, is_form, judge, nesting
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.plan.vllm_json import reads_json, vllm_int
from scanner.probe.interface import ProbeOptions
from scanner.reasons import STATUS, parse
from scanner.rules import BODY_DEPTH, RuleProgram
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
LIMITS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("limits",))


@pytest.mark.parametrize(("value", "read"), [
    (" +99_999 ", 99999), ("0099999", 99999), ("99999.000", 99999), ("9_9_9_9_9", 99999), ("\t100", 100),
    ("99999\n", 99999), ("\u00a0100", 100), ("\u3000100\u0085", 100), ("-5", -5), ("0_0", 0), ("+4096.0", 4096),
    (True, 1), (False, 0), (99999.0, 99999), (2 ** 70, 2 ** 70),
    ("0x65", None), ("1e5", None), ("9.9999e4", None), ("99999.5", None), ("\uff19\uff19", None),
    ("\u0669\u0669", None), ("1__0", None), ("_10", None), ("10_", None), ("10.", None), ("10.0_0", None),
    ("\ufeff100", None), ("\x1c100", None), ("1 0", None), ("", None), ("inf", None), (4096.5, None),
    (float("inf"), None), (1e19, None), (None, None), ([1], None), ({"a": 1}, None),
])
def test_integers_are_read_as_pydantic_reads_them(value: object, read: int | None) -> None:
    assert vllm_int(value) == read


@pytest.mark.parametrize(("ctype", "json_", "form"), [
    (None, True, False), ("application/json", True, False), ("APPLICATION/JSON; charset=x", True, False),
    ("application/vnd.api+json", True, False), ("text/plain", False, False),
    ("application/x-www-form-urlencoded", False, True), (" application/x-www-form-urlencoded ; a=b", False, True),
    ("multipart/form-data; boundary=x", False, True),
    # vLLM's FastAPI reads these as JSON: never a form to the perimeter
    ("application/x-www-form-urlencoded x+json", True, False), ("application/x-www-form-urlencoded+json", True, False),
    ("multipart/form-data x+json", False, False),
])
def test_json_and_form_content_types(ctype: str | None, json_: bool, form: bool) -> None:
    assert (reads_json(ctype), is_form(ctype)) == (json_, form)
    assert not (form and reads_json(ctype))


def test_the_judge_reads_as_vllm() -> None:
    plan = build(load_ref(CATALOG), load_policy(None))
    chat = plan.decision("POST", "/v1/chat/completions")
    assert chat is not None
    head = b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
    assert judge(chat, head + b'"max_tokens":" +4_097 "}').reason == "json-cap:max_tokens"
    assert judge(chat, head + b'"max_tokens":"0x10"}').reason == "json-cap:max_tokens"     # vLLM refuses it
    assert judge(chat, head + b'"max_tokens":"\\u00a016"}').body == {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "\u00a016"}
    assert judge(chat, head + b'"max_tokens":99999,"max_tokens":16}').body is not None   # the last copy
    assert judge(chat, head + b'"max_tokens":16,"max_tokens":99999}').reason == "json-cap:max_tokens"
    assert judge(chat, head + b'"max_tokens":NaN}').reason == "bad-json"
    assert judge(chat, b"\xef\xbb\xbf" + head + b'"n":1}').reason == "bad-json"
    form = head + b'"max_tokens":99999}'
    assert judge(chat, form, content_type="application/x-www-form-urlencoded").body is None   # not inspected
    assert judge(chat, form, content_type="application/x-www-form-urlencoded x+json").reason == "json-cap:max_tokens"
    absent = judge(chat, head + b'"max_completion_tokens":null}')
    assert absent.body is not None and absent.body["max_completion_tokens"] == 4096


@pytest.mark.parametrize(("raw", "most"), [
    (b"", 0), (b"{}", 1), (b'{"a":[1]}', 2), (b"[[],[]]", 2), (b'{"a":"[[[{{"}', 1), (b'{"a":"\\\\"[[}', 3),
    (b'{"a":"\\"[[}', 1), (b'"[[[', 0), (b"]]][[", 0), (b"[" * 40, 40), (b'["\\', 1),
])
def test_nesting_is_counted_on_the_bytes(raw: bytes, most: int) -> None:
    """Brackets open at once outside strings (a backslash escapes the next byte; a string left
    open runs to the end), valid JSON or not: the one count njs and Lua make too."""
    assert nesting(raw) == most


def test_a_body_deeper_than_the_plan_is_refused_before_it_is_read() -> None:
    plan = build(load_ref(CATALOG), load_policy(None))
    chat = plan.decision("POST", "/v1/chat/completions")
    assert chat is not None
    assert BODY_DEPTH == 31 and DEPTH_REASON == "bad-json:depth-over-31"
    assert parse(DEPTH_REASON) == ("bad-json", "depth-over-31") and STATUS["bad-json"] == 400

    def body(levels: int, value: bytes = b"1") -> bytes:     # levels: the root object is 1
        return b'{"model":"m","messages":[],"metadata":' + b"[" * (levels - 1) + value + b"]" * (levels - 1) + b"}"

    assert not judge(chat, body(31)).refused
    assert judge(chat, body(32)).reason == DEPTH_REASON
    assert judge(chat, body(32, b"NaN")).reason == DEPTH_REASON           # malformed too: the depth first
    assert judge(chat, body(40, b'"\xff"')).reason == DEPTH_REASON            # not UTF-8 too
    assert judge(chat, body(40)[:-42]).reason == DEPTH_REASON              # cut short
    assert judge(chat, b"[" * 32 + b"]" * 32).reason == DEPTH_REASON      # not an object either
    assert judge(chat, b"[" * 31 + b"]" * 31).reason == "bad-json:not-an-object"
    assert judge(chat, body(31, b"NaN")).reason == "bad-json"
    assert judge(chat, b'{"model":"m","messages":[],"metadata":"' + b"[" * 40 + b'"}').body is not None
    with pytest.raises(ValidationError):
        RuleProgram(programs={}, depth=BODY_DEPTH + 1)


# The form tests these proxies made before the reading was decided once: the first word of the
# media type, so "application/x-www-form-urlencoded x+json" (JSON to vLLM) was not inspected.
OLD_FORM = {
    "nginx": ('"~*^\\s*application/x-www-form-urlencoded\\s*(?:;|$)" 1;',
              '"~*^\\s*application/x-www-form-urlencoded" 1;'),
    "envoy": ('match(lower(content_type) .. ";", "^%s*([^;]-)%s*;")',
              'match(lower(content_type), "^%s*([^;%s]+)")'),
}


@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_a_form_test_that_misreads_json_fails_the_probe(tmp_path: Path, name: str) -> None:
    proxy = proxy_named(name)
    inventory, port = load_ref(CATALOG), free_port()
    s = loop.setup(inventory, load_policy(None), tmp_path, port)
    written = proxy.write(s.plan, tmp_path / "proxy")
    main = written / ("envoy.yaml" if proxy.kind == "envoy" else "perimeter-http.conf")
    new, old = OLD_FORM[name]
    text = main.read_text()
    assert new in text
    main.write_text(text.replace(new, old))
    with StandinThread(inventory, "127.0.0.1", port) as standin:
        res = loop.proxy_run(s, proxy, tmp_path / "proxy", LIMITS, standin.url).result
    failed = [a for a in res.attempts if a.verdict == "failed" and "x+json" in a.note]
    assert failed and res.exit_code() != 0
    assert {f.rule for f in res.findings} - {"VP011"}, [(f.rule, f.title) for f in res.findings]


def test_a_cap_the_proxies_cannot_read_exactly_is_a_policy_error() -> None:
    from scanner.errors import PolicyError
    from scanner.policy.load import loads
    from scanner.policy.model import MAX_JSON_CAP
    text = ("schema_version: 1\nname: t\nnetworks: {n: [127.0.0.1/32]}\naudiences:\n"
            "  a: {kind: end-user, networks: [n], auth: none, limits: {json_caps: {max_tokens: %d}}}\n"
            "routes:\n  - {path: /v1/chat/completions, audience: a}\n")
    assert loads(text % MAX_JSON_CAP, source="p.yaml").audiences["a"].limits.json_caps["max_tokens"] == 2 ** 53 - 1
    with pytest.raises(PolicyError) as err:
        loads(text % (MAX_JSON_CAP + 1), source="p.yaml")
    assert "p.yaml:5" in str(err.value) and "at most 9007199254740991" in str(err.value)
