"""Media rules (issue 10, item 5): the one reading of a body's media URLs, data and embeddings
(scanner/policy/media.py) that njs and Lua implement and the prober expects, and the policy's
``media:`` section."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scanner.errors import PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.policy import media
from scanner.policy.load import loads
from scanner.policy.media import MediaRules

RULES = MediaRules(urls="allow", domains=("*.cdn.example.com", "img.example.org:8443", "media.example.com"),
                   data_max_bytes=64, max_items=3, embeds="deny")
EVIL = "http://evil.example.net/x.png"


def chat(*parts: object, **extra: object) -> bytes:
    """A chat body with one user message of these content parts (raw JSON text for str parts)."""
    raw = ",".join(p if isinstance(p, str) else json.dumps(p) for p in parts)
    head = json.dumps({"model": "m", **extra})[:-1]
    return f'{head}, "messages": [{{"role": "user", "content": [{raw}]}}]}}'.encode()


def image(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


# (what the body tries, the body, the reason under RULES: "" passes)
CORPUS: list[tuple[str, bytes, str]] = [
    ("a listed host", chat(image("http://media.example.com/a.png")), ""),
    ("a listed host, string form", chat({"type": "image_url", "image_url": "https://media.example.com/a"}), ""),
    ("scheme and host in capitals", chat(image("HTTP://MEDIA.EXAMPLE.COM/a")), ""),
    ("a subdomain of a wildcard", chat(image("https://a.b.cdn.example.com/x")), ""),
    ("the wildcard's own name", chat(image("https://cdn.example.com/x")), "media-url:host"),
    ("a listed host:port", chat(image("https://img.example.org:8443/x")), ""),
    ("a listed host:port without its port", chat(image("https://img.example.org/x")), "media-url:host"),
    ("a listed host on another port", chat(image("http://media.example.com:8080/")), "media-url:host"),
    ("an unlisted host", chat(image(EVIL)), "media-url:host"),
    ("backslash before userinfo (CVE-2026-24779)", chat(image("http://media.example.com\\@evil.example.net/")),
     "media-url:not-canonical"),
    ("userinfo", chat(image("http://media.example.com@evil.example.net/")), "media-url:not-canonical"),
    ("userinfo with a port", chat(image("http://media.example.com:80@evil.example.net/")), "media-url:not-canonical"),
    ("the listed name after a fragment", chat(image("http://evil.example.net#@media.example.com")), "media-url:host"),
    ("decimal IP host", chat(image("http://2130706433/")), "media-url:host"),
    ("hex IP host", chat(image("http://0x7f.0.0.1/")), "media-url:host"),
    ("octal IP host", chat(image("http://0177.0.0.1/")), "media-url:host"),
    ("IPv6 literal", chat(image("http://[::1]/")), "media-url:not-canonical"),
    ("trailing dot", chat(image("http://media.example.com./x")), "media-url:not-canonical"),
    ("percent-encoded host", chat(image("http://media%2eexample.com/")), "media-url:not-canonical"),
    ("empty port", chat(image("http://media.example.com:/")), "media-url:not-canonical"),
    ("a tab in the path", chat(image("http://media.example.com/a\tb")), "media-url:not-canonical"),
    ("a non-ASCII host", chat(image("http://m\u00e9dia.example.com/")), "media-url:not-canonical"),
    ("file: URL", chat(image("file:///etc/passwd")), "media-url:scheme"),
    ("ftp: URL", chat(image("ftp://media.example.com/")), "media-url:scheme"),
    ("scheme-relative URL", chat(image("//evil.example.net/")), "media-url:scheme"),
    ("a small data URL", chat(image("data:image/png;base64,iVBORw0KGgo=")), ""),
    ("DATA: in capitals", chat(image("DATA:image/png;base64,iVBORw0KGgo=")), ""),
    ("a data URL over data_max_bytes", chat(image("data:image/png;base64," + "A" * 44)), "media-data:over-64"),
    ("audio_url", chat({"type": "audio_url", "audio_url": {"url": EVIL}}), "media-url:host"),
    ("video_url", chat({"type": "video_url", "video_url": {"url": EVIL}}), "media-url:host"),
    ("Anthropic source url", chat({"type": "image", "source": {"type": "url", "url": EVIL}}), "media-url:host"),
    ("Anthropic base64 source over the limit",
     chat({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 65}}),
     "media-data:over-64"),
    ("input_audio over the limit", chat({"type": "input_audio", "input_audio": {"data": "A" * 65, "format": "wav"}}),
     "media-data:over-64"),
    ("a list of images", chat({"images": [EVIL]}), "media-url:host"),
    ("image embeddings", chat({"type": "image_embeds", "image_embeds": "AAAA"}), "media-embeds"),
    ("an escaped media key", chat('{"type": "image_url", "image\\u005furl": {"url": "' + EVIL + '"}}'), "media-url:host"),
    ("an escaped URL", chat('{"type": "image_url", "image_url": {"url": "http:\\/\\/evil.example.net\\/"}}'),
     "media-url:host"),
    ("a media key outside messages", chat(image("data:,a"), metadata={"x": {"image_url": EVIL}}), "media-url:host"),
    ("the last copy of a duplicated url", chat(
        '{"type": "image_url", "image_url": {"url": "data:,a", "url": "' + EVIL + '"}}'), "media-url:host"),
    ("three items (max_items)", chat(image("data:,a"), image("data:,b"), image("data:,c")), ""),
    ("four items", chat(image("data:,a"), image("data:,b"), image("data:,c"), image("data:,d")),
     "media-items:over-3"),
    ("a null media key", chat({"type": "text", "text": "hi", "image_url": None}), ""),
    ("a URL in text is not media", chat({"type": "text", "text": EVIL}), ""),
    # Envoy's fast path (media_free) clears a body only when no string in it can name a media key;
    # everything else is walked: these sit on its edges.
    ("escapes, none of them a key's", chat('{"type": "text", "text": "\\"q\\" \\t \\\\ \\/ \\u00e9 \\ud83d\\ude00"}'), ""),
    ("a media key's name as a value only", chat({"type": "text", "text": "image_url"}), ""),
    ("an escaped media key, upper-case hex", chat('{"type": "x", "image\\u005Furl": {"url": "' + EVIL + '"}}'),
     "media-url:host"),
    ("a media key spelled in escapes only", chat('{"\\u0069\\u006d\\u0061\\u0067\\u0065\\u0073": ["' + EVIL + '"]}'),
     "media-url:host"),
    ("a media key after an escaped backslash", chat('{"type": "text", "text": "\\\\", "images": ["' + EVIL + '"]}'),
     "media-url:host"),
    ("a media key deep in a list", chat({"type": "text", "text": "hi"}, metadata={"a": [[[{"images": [EVIL]}]]]}),
     "media-url:host"),
    ("a top-level media key", chat({"type": "text", "text": "hi"}, images=[EVIL]), "media-url:host"),
]


@pytest.mark.parametrize(("what", "body", "want"), CORPUS, ids=[c[0] for c in CORPUS])
def test_the_reading_of_a_body(what: str, body: bytes, want: str) -> None:
    assert media.reason(json.loads(body), RULES) == want, what


def test_deny_admits_data_urls_only_and_the_default_is_the_end_users() -> None:
    deny = media.END_USER_DEFAULT
    assert media.reason(json.loads(chat(image("data:,a"))), deny) == ""
    assert media.reason(json.loads(chat(image("http://media.example.com/"))), deny) == "media-url:denied"
    assert media.reason(json.loads(chat(*[image("data:,a")] * 9)), deny) == "media-items:over-8"
    assert media.reason(json.loads(chat({"image_embeds": "AAAA"})), deny) == "media-embeds"
    assert media.reason(json.loads(chat(image(EVIL))), MediaRules()) == ""        # nothing decided


def test_the_plan_puts_media_rules_where_a_model_carries_media() -> None:
    plan = build(load_ref("vllm-0.29.0-everything"), load_policy(None))
    chat_d = plan.decision("POST", "/v1/chat/completions")
    assert chat_d is not None and chat_d.media.urls == "deny" and chat_d.media.max_items == 8
    assert "messages[].content[].image_url" in chat_d.media_at
    messages = plan.decision("POST", "/v1/messages")
    assert messages is not None and messages.media_at == ("messages[].content[].source", "system[].source")
    completions = plan.decision("POST", "/v1/completions")      # no media position in its model
    assert completions is not None and not completions.media.active
    tokenize = plan.decision("POST", "/tokenize")                 # the service audience: not checked
    assert tokenize is not None and not tokenize.media.active
    assert plan.body_dict()["decisions"][0].keys() >= {"media"}


def test_an_end_user_audience_without_a_media_section_gets_the_default() -> None:
    text = ("schema_version: 1\nname: t\nnetworks: {n: [127.0.0.1/32]}\n"
            "audiences:\n  a: {kind: end-user, networks: [n], auth: none}\n"
            "  s: {kind: service, networks: [n], auth: none}\n"
            "routes:\n  - {path: /v1/models, audience: a}\n")
    policy = loads(text, source="p.yaml")
    assert replace(policy.audiences["a"].media, line=0) == media.END_USER_DEFAULT
    assert not policy.audiences["s"].media.active


@pytest.mark.parametrize(("text", "message"), [
    ("{urls: maybe}", "'maybe' is not one of deny, allow, pass"),
    ("{urls: deny, domains: [a.example]}", "domains are read only with urls: allow"),
    ("{urls: allow, domains: ['http://a.example']}", "is not a media domain"),
    ("{urls: allow, domains: [A.example]}", "is not a media domain"),
    ("{urls: allow, domains: ['127.1']}", "an IP address must be four decimal numbers"),
    ("{urls: allow, domains: ['*.10.0.0.1']}", "an IP address must be four decimal numbers"),
    ("{urls: allow, domains: [a..example]}", "is not a media domain"),
    ("{max_items: -1}", "expected a whole number >= 0"),
    ("{data_max_bytes: 0}", "expected a whole number >= 1"),
    ("{embeds: sometimes}", "'sometimes' is not one of deny, allow"),
    ("{url: deny}", "unknown key 'url'"),
])
def test_media_rule_errors_name_the_line(text: str, message: str) -> None:
    base = ("schema_version: 1\nname: t\nnetworks: {n: [127.0.0.1/32]}\n"
            "audiences:\n  a: {kind: end-user, networks: [n], auth: none, media: %s}\n"
            "routes:\n  - {path: /v1/models, audience: a}\n")
    with pytest.raises(PolicyError) as err:
        loads(base % text, source="p.yaml")
    assert "p.yaml:5" in str(err.value) and message in str(err.value), str(err.value)


def test_domain_entries() -> None:
    assert media.entry_problem("media.example.com") == ""
    assert media.entry_problem("*.cdn.example.com") == ""
    assert media.entry_problem("10.0.0.7:8080") == ""
    assert media.entry_problem("-a.example") != ""
    assert media.entry_problem("a.example.") != ""
