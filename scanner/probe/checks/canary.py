"""Does the upstream fetch a media URL from an allowed body? (``probe --ssrf-canary
http://ADDRESS:PORT``, scanner.probe.canary). On every route with media rules, bodies whose media
URL names the canary in the forms the media check tries (plain, backslash before userinfo,
userinfo, after a fragment, a decimal IP host): each expected refused or let through exactly as
:func:`scanner.policy.media.reason` decides. A URL the plan refuses that the canary was asked for
is a failure whatever the proxy answered (the SSRF itself, seen where it lands); a URL the plan
admits that reached vLLM but was not fetched stays not proven (a model without that modality
fetches nothing).

For staging with a real multimodal model: vLLM fetches a request's media before it generates, so
the fetch has happened when the answer arrives. Without ``--ssrf-canary`` the check sends nothing.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import ClassVar

from scanner.policy import media
from scanner.probe.canary import Canary
from scanner.probe.cases import Case
from scanner.probe.checks.limits import STATE_CHANGING, body_decisions, review_forwarded
from scanner.probe.checks.media import (
    body_base,
    compact,
    leaf,
    listed_url,
    media_key,
    media_routes,
    places,
    skeleton,
)
from scanner.probe.coverage import Subject
from scanner.probe.findings import group, make
from scanner.probe.interface import Attempt, Finding
from scanner.probe.registry import BaseCheck, CheckContext, Results, register

# the token a case's body carries, as forms() wrote it
TOKEN = re.compile(r"/vp-canary/([0-9a-f]{16})")


def token(method: str, path: str, note: str) -> str:
    """The canary path's token of one case (its route and note)."""
    return hashlib.sha256(f"{method} {path} {note}".encode()).hexdigest()[:16]


def forms(canary: Canary, listed: str, method: str, path: str) -> list[tuple[str, str]]:
    """(note, URL) naming the canary, each with its own token; ``listed``: a host the rules list
    (or loopback), for the forms that put one in front of the canary."""
    out: list[tuple[str, str]] = []
    host = f"[{canary.host}]" if ":" in canary.host else canary.host
    ip = ipaddress.ip_address(canary.host)
    variants = [("the canary", "http://{h}:{p}/vp-canary/{t}"),
                ("the canary behind a backslash before userinfo",
                 "http://" + listed + "\\@{h}:{p}/vp-canary/{t}"),
                ("the canary behind userinfo", "http://" + listed + "@{h}:{p}/vp-canary/{t}"),
                ("the canary with a listed name after a fragment", "http://{h}:{p}/vp-canary/{t}#@" + listed)]
    if ip.version == 4:
        variants.append(("the canary as a decimal IP host", "http://" + str(int(ip)) + ":{p}/vp-canary/{t}"))
    for note, pattern in variants:
        note = f"{note} ({canary.url})"
        out.append((note, pattern.format(h=host, p=canary.port, t=token(method, path, note))))
    return out


@register
class SsrfCanary(BaseCheck):
    """Media URLs naming the canary in allowed bodies: fetched only where the plan admits them."""

    id: ClassVar[str] = "ssrf-canary"
    title: ClassVar[str] = "media URLs fetched by the upstream (--ssrf-canary)"

    def subjects(self, ctx: CheckContext) -> Iterator[Subject]:
        if ctx.options.canary is None:
            return
        for d in body_decisions(ctx):
            if not d.media.active:
                continue
            carry = body_base(ctx, d)
            why = STATE_CHANGING if carry is None else ctx.no_cell(d)
            why = why or ("" if places(d, carry[1] if carry else ()) else
                          "no media position whose top-level field the rules allow")
            yield Subject(f"ssrf-canary {d.method} {d.path}", d.method, d.path, why=why)

    def generate(self, ctx: CheckContext) -> Iterator[Case]:
        canary = ctx.options.canary
        if canary is None:
            return
        for d, out, where in media_routes(ctx, self.id):
            place, key = where[0], media_key(where[0])
            listed = (listed_url(d.media).split("/")[2:3] or ["127.0.0.1"])[0]
            for note, url in forms(canary, listed, d.method, d.path):
                raw = compact(out.base, skeleton(place, leaf(key, url)))
                why = media.reason(json.loads(raw), d.media)
                yield out.case("ssrf-canary", "deny" if why else "allow", (why,) if why else (), raw,
                               f"{note} at {place}")

    def review(self, ctx: CheckContext, case: Case, a: Attempt) -> Attempt:
        a = review_forwarded(ctx, case, a)
        canary = ctx.options.canary
        if canary is None:
            return a
        sent = TOKEN.search((case.body or b"").decode("utf-8", "replace"))
        fetched = sent is not None and sent.group(1) in canary.seen()
        if case.expected == "deny" and fetched:
            return replace(a, verdict="failed", why=f"the upstream fetched the URL ({canary.url} was asked "
                                                    "for it): a server-side request from a request body")
        if case.expected == "allow" and a.verdict == "proved" and not fetched:
            return replace(a, verdict="skipped", why="reached vLLM, which did not fetch it (a model "
                                                     "without that modality fetches nothing)")
        return a

    def judge(self, ctx: CheckContext, results: Results) -> Iterable[Finding]:
        failed = [("VP005" if c.expected == "deny" else "VP006" if a.outcome != "reached" else "VP015", a)
                  for c, a in results if a.verdict == "failed"]
        for (rule, _m, _p, _v), attempts in group(failed).items():
            notes = "; ".join(f"{a.note}: {a.why}" for a in attempts[:8])
            if rule == "VP005":
                yield make(rule, attempts, f"A media URL the plan refuses reached vLLM: {notes}.",
                           title="SSRF: a media URL the plan refuses reached vLLM", extra=self.id)
            elif rule == "VP006":
                yield make(rule, attempts, f"A media URL the plan admits was refused: {notes}.",
                           title="media the plan admits refused", extra=self.id)
            else:
                yield make(rule, attempts, f"The upstream received another body than the plan says: {notes}.",
                           extra=self.id)
