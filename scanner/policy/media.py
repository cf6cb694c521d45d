"""Media in request bodies: which URLs, data and embeddings an audience may send for vLLM to
fetch or decode (``media:`` in a policy audience), and the one reading of a body both proxies
implement (``templates/nginx-perimeter.js`` OPS.media, ``templates/envoy_json.lua.j2``
media_check) and the prober expects.

vLLM fetches every ``http(s)`` URL in an ``image_url``, ``audio_url`` or ``video_url`` part (and
the URL forms of the Responses, Anthropic and Cohere bodies) from the server: an end user's URL
is a server-side request (SSRF) unless the perimeter decides it. A body is walked whole, by key,
at any depth (a media key in an odd place is decided too, never skipped):

* ``image_url`` / ``audio_url`` / ``video_url`` / ``file_url``: a string, or an object's ``url``;
* ``images`` / ``videos`` / ``audio``: each string of a list;
* ``source``: an object's ``url``, else its base64 ``data`` (Anthropic);
* ``input_audio``: an object's base64 ``data``; ``file_data``: a base64 string;
* ``image_embeds`` / ``audio_embeds`` / ``video_embeds``: tensors vLLM deserializes.

Every such key with a value other than null is one item (``max_items``). A URL is ``data:``
when its first five characters are, case folded (vLLM's own test); ``data_max_bytes`` bounds the
length of a data URL or base64 string (characters: both are ASCII). Other URLs: with
``urls: deny`` refused; with ``urls: allow`` only ``http``/``https``, and with ``domains`` only in
a plain form every URL parser reads alike (host of letters, digits, '-' and '.' with no empty
label, an optional port, then ``/``, ``?``, ``#`` or the end; no backslash, space, control or
non-ASCII character anywhere), its host (and port) listed: userinfo, backslashes, percent-encoded,
decimal, octal or hex IP hosts, IPv6 literals and trailing dots never match a listed name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass as plain_dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, model_validator
from pydantic.dataclasses import dataclass

from scanner.policy.base import CONFIG, Base, Int, Line, Text, YamlMap, fail, reading, replace

UrlMode = Literal["deny", "allow", "pass"]
URL_MODES: tuple[str, ...] = ("deny", "allow", "pass")
EMBED_MODES: tuple[str, ...] = ("deny", "allow")
URL_KEYS: tuple[str, ...] = ("image_url", "audio_url", "video_url", "file_url")
LIST_KEYS: tuple[str, ...] = ("images", "videos", "audio")
DATA_KEYS: tuple[str, ...] = ("input_audio", "file_data")
EMBED_KEYS: tuple[str, ...] = ("image_embeds", "audio_embeds", "video_embeds")
SOURCE_KEY = "source"
MEDIA_KEYS: tuple[str, ...] = (*URL_KEYS, *LIST_KEYS, *DATA_KEYS, *EMBED_KEYS, SOURCE_KEY)
# each media key's kind, the one case of :func:`_item` it takes (generated into the Lua walk)
KEY_KINDS: Mapping[str, str] = {**dict.fromkeys(URL_KEYS, "url"), **dict.fromkeys(LIST_KEYS, "list"),
                                **{k: k for k in DATA_KEYS}, **dict.fromkeys(EMBED_KEYS, "embeds"),
                                SOURCE_KEY: SOURCE_KEY}
# the default for an end-user audience without a ``media:`` section
END_USER_MAX_ITEMS = 8

_CANONICAL = re.compile(
    r"(?i:https?)://(?P<host>[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::(?P<port>[0-9]{1,5}))?"
    r"(?:[/?#][\x21-\x5b\x5d-\x7e]*)?")
_ENTRY = re.compile(r"(\*\.)?[a-z0-9-]+(\.[a-z0-9-]+)*(:[0-9]{1,5})?")
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = re.compile(rf"{_OCTET}(\.{_OCTET}){{3}}")


@dataclass(frozen=True, config=CONFIG)
class MediaRules(Base):
    """An audience's media rules. The default (no ``media:`` section on a service, operator or
    monitoring audience) decides nothing; in a ``media:`` section a key left out takes the
    end-user default (urls: deny, max_items: 8, embeds: deny, no data limit)."""

    _inputs: ClassVar[Mapping[str, Any]] = {
        "urls": {"default": "deny", "description": "URLs other than data: (deny: refused; allow: http(s), "
                 "to domains if listed)"},
        "max_items": {"default": END_USER_MAX_ITEMS, "description": "media items per request"},
        "embeds": {"default": "deny", "description": "image/audio/video embeddings"}}

    urls: UrlMode = "pass"
    domains: tuple[Text, ...] = Field(default=(), description="with urls: allow, the hosts (host, "
                                      "host:port, *.suffix; lower case) media may come from")
    data_max_bytes: Int | None = Field(default=None, ge=1, description="longest data: URL or base64 item")
    max_items: Int | None = Field(default=None, ge=0)
    embeds: Literal["deny", "allow"] = "allow"
    line: Line = 0

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        return {"urls": "deny", "max_items": END_USER_MAX_ITEMS, "embeds": "deny", **out}

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> MediaRules:
        if not reading(info):
            return self
        for i, entry in enumerate(self.domains):
            why = entry_problem(entry)
            if why:
                raise fail(f"{entry!r} is not a media domain: {why}", "domains", i)
        if self.domains and self.urls != "allow":
            raise fail(f"domains are read only with urls: allow (here urls: {self.urls})", "domains")
        return replace(self, domains=tuple(sorted(set(self.domains))))

    @property
    def active(self) -> bool:
        return (self.urls != "pass" or self.data_max_bytes is not None or self.max_items is not None
                or self.embeds == "deny")


END_USER_DEFAULT = MediaRules(urls="deny", max_items=END_USER_MAX_ITEMS, embeds="deny")


def entry_problem(entry: str) -> str:
    """Why ``entry`` cannot be a ``domains`` entry ("" when it can): a lower-case DNS name or
    dotted-quad IPv4 address, optionally ``*.`` before and ``:port`` after."""
    if not _ENTRY.fullmatch(entry):
        return "expected a lower-case host name, '*.' before it for its subdomains, ':port' after"
    host = entry.partition(":")[0].removeprefix("*.")
    last = host.rsplit(".", 1)[-1]
    if last.isdigit() and not (_IPV4.fullmatch(host) and not entry.startswith("*.")):
        return "an IP address must be four decimal numbers 0-255 (no '*.')"
    if any(not label or label.startswith("-") or label.endswith("-") for label in host.split(".")):
        return "a label of the host name is empty or starts or ends with '-'"
    return ""


@plain_dataclass(frozen=True)
class Item:
    """One media item of a body: a URL, base64 ``data``, an embedding, or a media key holding
    something else (counted, nothing to judge)."""

    kind: Literal["url", "data", "embeds", "other"]
    value: str = ""
    key: str = ""


def items(body: object) -> Iterator[Item]:
    """Every media item in a decoded JSON body, depth first in document order."""
    if isinstance(body, list):
        for v in body:
            yield from items(v)
        return
    if not isinstance(body, dict):
        return
    for key, value in body.items():
        if value is not None and key in MEDIA_KEYS:
            yield from _item(key, value)
        yield from items(value)


def _item(key: str, value: object) -> Iterator[Item]:
    if key in URL_KEYS:
        url = value.get("url") if isinstance(value, dict) else value
        yield Item("url", url, key) if isinstance(url, str) else Item("other", key=key)
    elif key in LIST_KEYS:
        if isinstance(value, list):
            yield from (Item("url", v, key) for v in value if isinstance(v, str))
    elif key == SOURCE_KEY:
        if isinstance(value, dict) and isinstance(value.get("url"), str):
            yield Item("url", value["url"], key)
        elif isinstance(value, dict) and isinstance(value.get("data"), str):
            yield Item("data", value["data"], key)
    elif key == "input_audio":
        data = value.get("data") if isinstance(value, dict) else None
        yield Item("data", data, key) if isinstance(data, str) else Item("other", key=key)
    elif key == "file_data":
        yield Item("data", value, key) if isinstance(value, str) else Item("other", key=key)
    else:
        yield Item("embeds", key=key)


def url_reason(url: str, rules: MediaRules) -> str:
    """The refusal reason for one media URL ("" when it passes)."""
    if url[:5].lower() == "data:":
        return data_reason(url, rules)
    if rules.urls == "pass":
        return ""
    if rules.urls == "deny":
        return "media-url:denied"
    if url[:7].lower() != "http://" and url[:8].lower() != "https://":
        return "media-url:scheme"
    if not rules.domains:
        return ""
    m = _CANONICAL.fullmatch(url)
    if m is None:
        return "media-url:not-canonical"
    return "" if host_listed(m["host"].lower(), m["port"] or "", rules.domains) else "media-url:host"


def host_listed(host: str, port: str, domains: tuple[str, ...]) -> bool:
    """Is ``host`` (lower case, with ``port`` or "") one of ``domains``?"""
    for entry in domains:
        name, _, want = entry.partition(":")
        if want != port:
            continue
        if name == host or (name.startswith("*.") and host.endswith(name[1:])):
            return True
    return False


def data_reason(data: str, rules: MediaRules) -> str:
    limit = rules.data_max_bytes
    return f"media-data:over-{limit}" if limit is not None and len(data) > limit else ""


def reason(body: object, rules: MediaRules) -> str:
    """Why ``body`` (decoded JSON) is refused under ``rules``; "" when it passes. The first item
    in document order decides, then the count."""
    if not rules.active:
        return ""
    count = 0
    for item in items(body):
        count += 1
        if item.kind == "url":
            why = url_reason(item.value, rules)
        elif item.kind == "data":
            why = data_reason(item.value, rules)
        elif item.kind == "embeds":
            why = "media-embeds" if rules.embeds == "deny" else ""
        else:
            why = ""
        if why:
            return why
    if rules.max_items is not None and count > rules.max_items:
        return f"media-items:over-{rules.max_items}"
    return ""


def positions(paths: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The positions of a request model (inventory paths such as ``messages[].content[].image_url``)
    where a media item can be: its last name is a media key (``images[]`` is ``images``)."""
    out = set()
    for path in paths:
        while path.endswith("[]"):
            path = path[:-2]
        if path.rsplit(".", 1)[-1].rsplit("]", 1)[-1] in MEDIA_KEYS:
            out.add(path)
    return tuple(sorted(out))
