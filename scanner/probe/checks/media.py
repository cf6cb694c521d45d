"""Media in allowed bodies (``media:`` rules, scanner/policy/media.py): URLs other than ``data:``
refused, or admitted only for the listed hosts in every trick form (backslash, userinfo, numeric
and IPv6 hosts, trailing dot, percent-encoding), data over ``data_max_bytes``, more items than
``max_items``, embeddings; and bodies exactly at those limits let through (over-blocking), proven
through the witness like every allowed body. What each case expects is read from the same module
the generators' rules come from (:func:`scanner.policy.media.reason`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import ClassVar

from scanner.plan.model import Decision
from scanner.policy import media
from scanner.policy.media import MediaRules
from scanner.probe.cases import Case
from scanner.probe.checks.limits import STATE_CHANGING, Out, Spread, body_decisions, carrier, review_forwarded
from scanner.probe.coverage import Subject, na
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Finding
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

DATA_URL = "data:image/png;base64,iVBORw0KGgo="
SHORT_DATA = "data:,"        # the shortest data: URL (items cases: many in one body)
# where an SSRF goes first: the cloud metadata service (a URL no policy lists)
METADATA = "169.254.169.254"
DEFAULT_PLACE = "messages[].content[].image_url"   # a body not known to the inventory: a chat part
_URL_CAPABLE = (*media.URL_KEYS, *media.LIST_KEYS, media.SOURCE_KEY)


def leaf(key: str, url: str) -> object:
    """How a media key holds one URL (or data) in a body."""
    if key in media.URL_KEYS:
        return {"url": url}
    if key in media.LIST_KEYS:
        return [url]
    if key == media.SOURCE_KEY:
        return {"type": "url", "url": url}
    if key == "input_audio":
        return {"data": url, "format": "wav"}
    return url


def skeleton(place: str, value: object) -> dict[str, object]:
    """The smallest body holding ``value`` at an inventory position such as
    ``messages[].content[].image_url`` (``[]`` a list, ``.*`` any key)."""
    tokens = re.findall(r"\[\]|\.\*|[A-Za-z_][A-Za-z0-9_]*", place)
    for tok in reversed(tokens):
        value = [value] if tok == "[]" else {"k": value} if tok == ".*" else {tok: value}
    if not isinstance(value, dict):
        raise ValueError(f"{place!r} is not a position in a JSON object")
    return value


def media_key(place: str) -> str:
    return re.split(r"[.\[\]*]+", place.rstrip("[]*."))[-1]


def places(d: Decision, taken: Iterable[str]) -> list[str]:
    """The route's media positions a body can use (its top-level field allowed, not a carrier or
    capped field), URL-capable first, then shorter; the default chat part for an unknown body."""
    taken = set(taken)
    ok = [p for p in (d.media_at or (DEFAULT_PLACE,))
          if media_key(p) in _URL_CAPABLE and d.fields.mode(p.split("[")[0].split(".")[0]) == "allow"
          and p.split("[")[0].split(".")[0] not in taken]
    def order(p: str) -> tuple[int, int, str]:
        key = media_key(p)
        return media.URL_KEYS.index(key) if key in media.URL_KEYS else 9, len(p), p

    return sorted(ok, key=order)


def listed_url(rules: MediaRules) -> str:
    """A URL on a host the rules list ("" none)."""
    for entry in rules.domains:
        host = ("probe." + entry[2:]) if entry.startswith("*.") else entry
        return f"https://{host}/probe.png"
    return ""


MAX_NEIGHBOURS = 48   # neighbour URLs per route at most (8 per entry: a long list stays bounded)


def neighbours(entry: str) -> list[tuple[str, str]]:
    """(note, host[:port]) of the hosts around one ``domains`` entry that a match looser than the
    entry's would admit: a suffix without the dot, the entry inside a longer name, its parent and
    a sibling, a dot read as any character, a subdomain of an exact entry, the apex of a ``*.`` entry, the
    entry with another port (or without its port). What each is expected to do is
    ``media.url_reason``'s: another entry may list it."""
    name, _, port = entry.partition(":")
    wild = name.startswith("*.")
    host = name[2:] if wild else name
    first = host.split(".")[0]
    parent = host.partition(".")[2]
    at = f":{port}" if port else ""
    out = [("a look-alike with a prefix", f"evil-{host}{at}" if not wild else f"evil{host}{at}"),
           ("the entry inside a longer name", f"{'probe.' if wild else ''}{host}.evil.net{at}"),
           ("a dot read as any character", f"{'probe.' if wild else ''}{host.replace('.', 'x', 1)}{at}")]
    if parent and "." in parent:   # never a bare top-level domain
        out += [("its parent", parent + at), ("a sibling", f"other-{first}.{parent}{at}")]
    out.append(("its apex (a wildcard lists subdomains only)", host + at) if wild
               else ("a subdomain of an exact entry", f"sub.{host}{at}"))
    if port:
        out.append(("without its port", host))
    else:
        out.append(("with a port", f"{'probe.' if wild else ''}{host}:8443"))
    return out


def neighbour_cases(rules: MediaRules) -> list[tuple[str, str]]:
    """(note, URL) of every listed entry's neighbours (:func:`neighbours`), at most MAX_NEIGHBOURS."""
    out = [(f"neighbour of {entry}: {note}", f"https://{host}/probe.png")
           for entry in rules.domains for note, host in neighbours(entry)]
    return list(dict.fromkeys(out))[:MAX_NEIGHBOURS]


def url_cases(rules: MediaRules) -> list[tuple[str, str]]:
    """(note, URL) for the URL rules: what each is expected to do is ``media.url_reason``'s."""
    if rules.urls == "pass":
        return []
    out = [("the cloud metadata service", f"http://{METADATA}/latest/meta-data/"),
           ("file: URL", "file:///etc/passwd")]
    listed = listed_url(rules)
    if not listed:
        return [*out, ("backslash before userinfo", f"http://127.0.0.1\\@{METADATA}/")]
    host = listed.split("/")[2]
    return [*out,
            ("a listed host", listed),
            ("backslash before userinfo (CVE-2026-24779)", f"https://{host}\\@{METADATA}/"),
            ("userinfo", f"https://{host}@{METADATA}/"),
            ("the listed name after a fragment", f"http://{METADATA}#@{host}"),
            ("decimal IP host", "http://2852039166/"),
            ("octal IP host", "http://0251.0376.0251.0376/"),
            ("IPv6 literal", "http://[::ffff:a9fe:a9fe]/"),
            ("trailing dot", f"https://{host.split(':')[0]}./probe.png"),
            ("percent-encoded host", "https://" + host.replace(".", "%2e", 1) + "/probe.png"),
            *neighbour_cases(rules)]


def _many(place: str, n: int) -> tuple[dict[str, object], str] | None:
    """A body with ``n`` (short) data: URLs at ``place``: in the list nearest the media key (one
    part each), or the key's own list; None: no list there."""
    key = media_key(place)
    if key in media.LIST_KEYS and place.endswith(key):
        return skeleton(place, [SHORT_DATA] * n), place
    cut = place.rfind("[]")
    if cut < 0:
        return None
    rest = place[cut + 2:].lstrip(".")
    part = skeleton(rest, leaf(key, SHORT_DATA)) if rest else leaf(key, SHORT_DATA)
    return skeleton(place[:cut], [part] * n), place


def compact(base: dict[str, object], body: dict[str, object]) -> bytes:
    return json.dumps({**base, **body}, separators=(",", ":")).encode()


def body_base(ctx: CheckContext, d: Decision) -> tuple[str, dict[str, object]] | None:
    """(query, fields) every media body of ``d`` is built on; None: it cannot be sent."""
    carry = carrier(ctx, d)
    if carry is None:
        return None
    query, base = carry
    budget = d.budget
    if budget is not None and budget.when_absent == "reject":   # every body carries its budget
        base = {**base, budget.field: budget.cap}
    return query, base


def item_bodies(d: Decision, where: list[str], base: dict[str, object]) -> list[tuple[bytes, str]]:
    """(body, note): ``max_items + 1`` items, then exactly ``max_items`` (none without a list)."""
    n = d.media.max_items
    if n is None:
        return []
    many = next((m for p in where if (m := _many(p, n + 1)) is not None), None)
    if many is None:
        return []
    out = [(compact(base, many[0]), f"max_items: {n + 1} items at {many[1]}")]
    at = _many(many[1], n) if n else None
    if at is not None:
        out.append((compact(base, at[0]), f"max_items: exactly {n} items at {many[1]}"))
    return out


def data_bodies(d: Decision, place: str, base: dict[str, object]) -> list[tuple[bytes, str]]:
    """(body, note): a data: URL of exactly ``data_max_bytes``, then one byte more."""
    limit = d.media.data_max_bytes
    if limit is None:
        return []
    pad = "data:," + "A" * max(0, limit - len("data:,"))
    key = media_key(place)
    return [(compact(base, skeleton(place, leaf(key, pad))), f"a data: URL of exactly {limit} bytes"),
            (compact(base, skeleton(place, leaf(key, pad + "A"))), f"a data: URL of {limit + 1} bytes")]


def _fits(ctx: CheckContext, d: Decision, bodies: list[tuple[bytes, str]]) -> bool:
    limit = min(d.limits.body_bytes or ctx.options.max_body_bytes, ctx.options.max_body_bytes)
    return all(len(b) <= limit for b, _ in bodies)


def media_routes(ctx: CheckContext, check: str) -> Iterator[tuple[Decision, Out, list[str]]]:
    """(decision, its cases' maker, its media positions) of every route with media rules that a
    credential and vantage of this run can send a body to."""
    for d in body_decisions(ctx):
        cells = ctx.allowed_cells(d)
        carry = body_base(ctx, d)
        if not d.media.active or not cells or carry is None:
            continue
        query, base = carry
        where = places(d, base)
        if where:
            yield d, Out(check, d, Spread(cells), query, base), where


@register
class MediaCheck(BaseCheck):
    """Media URLs, data and embeddings in the bodies of every route the plan gives media rules."""

    id: ClassVar[str] = "media"
    title: ClassVar[str] = "media URLs, data and embeddings in bodies"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        for d in body_decisions(ctx):
            if not d.media.active:
                continue
            key = f"{d.method} {d.path}"
            carry = body_base(ctx, d)
            where = places(d, carry[1] if carry else ())
            why = STATE_CHANGING if carry is None else (
                "" if ctx.allowed_cell(d) else "no credential and vantage the plan admits here")
            why = why or ("" if where else "no media position whose top-level field the rules allow")
            yield Subject(f"media {key}", d.method, d.path, why=why)
            base = carry[1] if carry else {}
            for aspect, limit, bodies in (
                    ("media-items", d.media.max_items, item_bodies(d, where, base) if where else []),
                    ("media-data", d.media.data_max_bytes, data_bodies(d, where[0], base) if where else [])):
                if limit is None:
                    continue
                if bodies and not _fits(ctx, d, bodies):
                    why_na = (f"a body at the {aspect.split('-')[1]} limit {limit} is over body_bytes or "
                              "--max-body-bytes: the body limit refuses it first")
                    yield na(f"{aspect} {key}", why_na, d.method, d.path)
                else:
                    yield Subject(f"{aspect} {key}", d.method, d.path, why=why or (
                        "" if bodies else "no position in a list to put several items at"))

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        for d, out, where in media_routes(ctx, self.id):
            yield from self._cases(ctx, d, out, where)

    def _cases(self, ctx: CheckContext, d: Decision, out: Out, where: list[str]) -> Iterator[Case]:
        rules, place, key = d.media, where[0], media_key(where[0])

        def case(aspect: str, raw: bytes, note: str) -> Case:
            why = media.reason(json.loads(raw), rules)
            return out.case(aspect, "deny" if why else "allow", (why,) if why else (), raw, note)

        def at(p: str, value: object) -> bytes:
            return compact(out.base, skeleton(p, value))

        yield case("media", at(place, leaf(key, DATA_URL)), f"a data: URL at {place}")
        for note, url in url_cases(rules):
            yield case("media", at(place, leaf(key, url)), f"{note} at {place}")
        if rules.urls != "pass":   # every other kind of place, on every route
            kinds = {media_key(p): p for p in reversed(where)}
            for k, p in sorted(kinds.items()):
                if p != place:
                    yield case("media", at(p, leaf(k, f"http://{METADATA}/")), f"a URL at {p}")
        if rules.embeds == "deny":
            embeds = re.sub(r"[A-Za-z_]+$", "image_embeds", place)
            yield case("media", at(embeds, "AAAA"), f"embeddings at {embeds}")
        for aspect, bodies in (("media-items", item_bodies(d, where, out.base)),
                               ("media-data", data_bodies(d, place, out.base))):
            if bodies and _fits(ctx, d, bodies):
                for raw, note in bodies:
                    yield case(aspect, raw, note)

    def review(self, ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
        return review_forwarded(ctx, case, a)

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        flagged = []
        for c, a in results:
            if a.verdict == "failed":
                rule = ("VP005" if c.expected == "deny" else "VP006" if a.outcome != "reached" else "VP015")
                flagged.append((rule, a))
        for (rule, _m, _p, _v), attempts in group(flagged).items():
            notes = "; ".join(a.note for a in attempts[:8])
            if rule == "VP005":
                yield make(rule, attempts, f"Media the plan refuses reached the upstream: {notes}.",
                           title="media URL, data or embeddings the plan refuses reached vLLM", extra="media")
            elif rule == "VP006":
                yield make(rule, attempts, f"Media the plan admits was refused: {notes}.",
                           title="media the plan admits refused", extra="media")
            else:
                whys = "; ".join(sorted({a.why for a in attempts if a.why}))
                yield make(rule, attempts, f"The upstream received another body than the plan says: {whys}.",
                           extra="media")
