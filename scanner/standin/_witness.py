"""The upstream witness: ASGI middleware that records what reached the upstream for each
probe request, so the prober can see through the proxy.

It speaks the witness protocol of :mod:`scanner.witness_asgi` (the parameters, the record, the
hold, the error answer), the one module the witness inside vLLM and the prober use too; besides
it, the standard library only: the real vLLM app is wrapped with it inside vLLM's own Python
(``scanner/inventory/_worker.py`` loads both files by path), the catalog stand-in in ours.

* A request whose query has ``vp_probe=<id>`` is recorded under that id
  (:func:`scanner.witness_asgi.record_of`): method, the raw path as the proxy sent it, the
  query without the probe's own parameters, every header (credentials only as a fingerprint:
  ``sha256:`` + 12 hex of the token), and the body's size, sha256 and (JSON objects up to 64
  KiB) its text; of a larger JSON object its outline: every top-level name, and the members
  whose JSON text is at most 1 KiB (what a proxy strips or writes in stays visible beside a
  padded body). Requests without an id are recorded too, under ``""``: something reached the
  upstream that the prober did not send, or sent without its id.
* ``vp_hold=<ms>`` (at most 30 s) holds the request before the app sees it: the prober's
  concurrency check keeps requests in flight with it. With ``vp_hold_group=<g>`` the hold ends
  ``ms`` after the group's first request arrived, for every request of the group: one a proxy
  queued until an earlier one was answered (Envoy's pending requests) is not held again.
  The record's ``held_ms`` is the hold it got: the requests with one above 0 were in flight at
  once (the concurrency check counts them against the limit).
* ``vp_answer=<status>`` (400 - 599): the witness records the request, then answers it itself
  with that status and :func:`error_body` (a vLLM-style error whose text holds
  :data:`LEAK_MARKER`, like the heap addresses of CVE-2026-22778): the prober's error-body check
  proves a 5xx text never reaches the client and a 4xx one passes byte for byte. Only ever
  served by the loopback stand-in or the witness-wrapped vLLM of a verify run.
* ``GET /__standin__/witness?prefix=P`` (``STANDIN_READ_PATH``) returns the records whose id starts with ``P``
  (``{"records": [...]}``), ``?id=I`` the one of that id; this path never reaches the app,
  and no proxy should route it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import urllib.parse
from typing import Any

from scanner.witness_asgi import (
    HOLD_PARAM,
    PROBE_PARAM,
    STANDIN_READ_PATH,
    answered,
    held_for,
    probe_params,
    read_body,
    record_of,
)

MAX_KEPT = 200_000   # the records the stand-in keeps (a verify run's; the oldest go first)


class LoopbackWitness:
    """Wrap an ASGI app: record every HTTP request that reaches it (see the module docstring)."""

    def __init__(self, app: Any, max_records: int = MAX_KEPT, fetch_media: bool = False) -> None:
        self.app = app
        self.fetch_media = fetch_media   # fetch each http(s) media URL of a JSON body, as vLLM does
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_records)
        self.by_id: dict[str, dict[str, Any]] = {}   # the newest record per probe id
        self.hold_start: dict[str, float] = {}       # hold group -> its first request's arrival

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == STANDIN_READ_PATH:
            await self._serve(scope, send)
            return
        params = probe_params(urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                                     keep_blank_values=True))
        probe = params[PROBE_PARAM]
        chunks: list[bytes] = []
        more = await read_body(receive, chunks)
        body = b"".join(chunks)
        record = record_of(scope, body)
        if len(self.records) == self.records.maxlen:
            self.by_id.pop(self.records[0]["id"], None)
        self.records.append(record)
        if probe:
            # a request reaching the upstream again under the same probe id (each try has its
            # own): the proxy resent it
            earlier = self.by_id.get(probe)
            record["arrivals"] = earlier.get("arrivals", 1) + 1 if earlier is not None else 1
            self.by_id[probe] = record
        if params[HOLD_PARAM].isdigit():
            held = held_for(self.hold_start, params, asyncio.get_running_loop().time())
            record["held_ms"] = round(held * 1000, 3)   # > 0: in flight while its group's hold was on
            await asyncio.sleep(held)
        if await answered(send, params):
            return
        if self.fetch_media and record["body"] is not None:
            await _fetch_media(record["body"])
        replay = [{"type": "http.request", "body": body, "more_body": more}]

        async def replayed() -> Any:
            # the body once, then the server's own messages: the rest of a body over MAX_BODY, or
            # (waiting, as a streamed answer's disconnect listener does) the client's disconnect
            if replay:
                return replay.pop()
            return await receive()

        await self.app(scope, replayed, send)

    async def _serve(self, scope: dict[str, Any], send: Any) -> None:
        query = dict(urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "id" in query:
            found = [r for r in (self.by_id.get(query["id"]),) if r is not None]
        else:
            prefix = query.get("prefix", "")
            found = [r for r in list(self.records) if r["id"].startswith(prefix)]
        payload = json.dumps({"records": found}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


async def _fetch_media(text: str) -> None:
    """GET each http(s) media URL of a JSON body (at most 16, 2 s each; errors ignored), before
    the request is served, as vLLM fetches a request's media before it generates: what an SSRF
    canary (probe --ssrf-canary) sees through a stand-in started with --fetch-media. Loopback
    hosts only (an IP literal, decimal included): the stand-in never reaches another host."""
    import httpx

    from scanner.policy import media

    try:
        body = json.loads(text)
    except ValueError:
        return
    urls = [i.value for i in media.items(body) if i.kind == "url"]
    async with httpx.AsyncClient(timeout=2.0, follow_redirects=False, trust_env=False) as client:
        for url in urls[:16]:
            target = _loopback_url(url)
            if target is None:
                continue
            with contextlib.suppress(httpx.HTTPError):
                await client.get(target)


def _loopback_url(url: str) -> str | None:
    """``url`` as a lenient fetcher reads it (a decimal host is an IPv4 address), if its host is
    a loopback address; else None."""
    import ipaddress

    import httpx

    try:
        parsed = httpx.URL(url)
        host = parsed.host
        ip = ipaddress.ip_address(int(host)) if host.isdigit() else ipaddress.ip_address(host)
    except (httpx.InvalidURL, ValueError):
        return None
    if parsed.scheme not in ("http", "https") or not ip.is_loopback:
        return None
    return str(parsed.copy_with(host=str(ip)))
