"""The upstream witness: ASGI middleware that records what reached the upstream for each
probe request, so the prober can see through the proxy.

Standard library only: the real vLLM app is wrapped with it inside vLLM's own Python
(``scanner/inventory/_worker.py`` loads this file by path), the catalog stand-in in ours.

* A request whose query has ``vp_probe=<id>`` is recorded under that id: method, the
  raw path as the proxy sent it, the query without the probe's own parameters, every
  header (credentials only as a fingerprint: ``sha256:`` + 12 hex of the token), and the
  body's size, sha256 and (JSON objects up to 64 KiB) its text; of a larger JSON object its
  outline: every top-level name, and the members whose JSON text is at most 1 KiB (what a
  proxy strips or writes in stays visible beside a padded body). Requests without an id
  are recorded too, under ``""``: something reached the upstream that the prober did not
  send, or sent without its id.
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
* ``GET /__standin__/witness?prefix=P`` returns the records whose id starts with ``P``
  (``{"records": [...]}``), ``?id=I`` the one of that id; this path never reaches the app,
  and no proxy should route it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import urllib.parse
from typing import Any

WITNESS_PATH = "/__standin__/witness"
PROBE_PARAM = "vp_probe"
HOLD_PARAM = "vp_hold"
HOLD_GROUP_PARAM = "vp_hold_group"
ANSWER_PARAM = "vp_answer"
LEAK_MARKER = "0x7f00deadbeef"
MAX_HOLD_GROUPS = 10_000
MAX_RECORDS = 200_000
MAX_HOLD_MS = 30_000
MAX_BODY_TEXT = 65_536
MAX_BODY = 64 * 1024 * 1024
# Header values recorded only as a fingerprint.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})


def fingerprint(value: str) -> str:
    """``sha256:`` + 12 hex of the credential in a header value (``Bearer X`` -> of ``X``)."""
    scheme, _, rest = value.strip().partition(" ")
    token = rest.strip() if scheme.lower() in ("bearer", "basic") and rest else value.strip()
    return "sha256:" + hashlib.sha256(token.encode("latin-1", "replace")).hexdigest()[:12]


class Witness:
    """Wrap an ASGI app: record every HTTP request that reaches it (see the module docstring)."""

    def __init__(self, app: Any, max_records: int = MAX_RECORDS, fetch_media: bool = False) -> None:
        self.app = app
        self.fetch_media = fetch_media   # fetch each http(s) media URL of a JSON body, as vLLM does
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_records)
        self.by_id: dict[str, dict[str, Any]] = {}   # the newest record per probe id
        self.hold_start: dict[str, float] = {}       # hold group -> its first request's arrival

    def _held_for(self, seconds: float, group: str) -> float:
        """How long to hold a request: ``seconds``, or what is left of its group's hold."""
        if not group:
            return seconds
        now = asyncio.get_running_loop().time()
        if group not in self.hold_start and len(self.hold_start) >= MAX_HOLD_GROUPS:
            self.hold_start.clear()
        start = self.hold_start.setdefault(group, now)
        return max(0.0, start + seconds - now)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == WITNESS_PATH:
            await self._serve(scope, send)
            return
        query = urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                       keep_blank_values=True)
        probe = next((v for k, v in query if k == PROBE_PARAM), "")
        hold = next((v for k, v in query if k == HOLD_PARAM), "")
        group = next((v for k, v in query if k == HOLD_GROUP_PARAM), "")
        answer = next((v for k, v in query if k == ANSWER_PARAM), "")
        body, more = await _read_body(receive)
        record: dict[str, Any] = {
            "id": probe,
            "method": scope.get("method", ""),
            "path": (scope.get("raw_path") or scope.get("path", "").encode()).decode("latin-1"),
            "query": urllib.parse.urlencode([(k, v) for k, v in query
                                             if k not in (PROBE_PARAM, HOLD_PARAM, HOLD_GROUP_PARAM,
                                                          ANSWER_PARAM)]),
            "headers": [[k.decode("latin-1").lower(), _value(k, v)] for k, v in scope.get("headers", [])],
            "body_bytes": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "body": _json_text(body),
        }
        if record["body"] is None:
            outline = _outline(body)
            if outline is not None:
                record["outline"] = outline
        if len(self.records) == self.records.maxlen:
            self.by_id.pop(self.records[0]["id"], None)
        self.records.append(record)
        if probe:
            # a request reaching the upstream again under the same probe id (each try has its
            # own): the proxy resent it
            earlier = self.by_id.get(probe)
            record["arrivals"] = earlier.get("arrivals", 1) + 1 if earlier is not None else 1
            self.by_id[probe] = record
        if hold.isdigit():
            held = self._held_for(min(int(hold), MAX_HOLD_MS) / 1000, group)
            record["held_ms"] = round(held * 1000, 3)   # > 0: in flight while its group's hold was on
            await asyncio.sleep(held)
        if answer.isdigit() and 400 <= int(answer) <= 599:
            payload = error_body(int(answer), probe)
            await send({"type": "http.response.start", "status": int(answer),
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
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


def error_body(status: int, probe: str) -> bytes:
    """The witness's answer to ``vp_answer=status`` for probe id ``probe``: a vLLM-style error
    object whose message holds :data:`LEAK_MARKER` (deterministic: the prober knows it)."""
    message = (f"vp-error {probe}: EngineCore failed, <vllm.v1.engine.EngineCoreRequest object at "
               f"{LEAK_MARKER}>")
    return json.dumps({"error": {"message": message, "type": "InternalServerError" if status >= 500
                                 else "BadRequestError", "code": status}}).encode()


def _value(name: bytes, value: bytes) -> str:
    text = value.decode("latin-1")
    return fingerprint(text) if name.decode("latin-1").lower() in SECRET_HEADERS else text


async def _read_body(receive: Any) -> tuple[bytes, bool]:
    """The whole request body (up to MAX_BODY); True if more was left unread."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False
        if size > MAX_BODY:
            return b"".join(chunks), True


MAX_OUTLINE_MEMBER = 1024


def _outline(body: bytes) -> dict[str, Any] | None:
    """A large JSON object's top-level names and short members; None for anything else."""
    if len(body) <= MAX_BODY_TEXT or not body.lstrip().startswith(b"{"):
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    short = {}
    for k, v in obj.items():
        if len(json.dumps(v)) <= MAX_OUTLINE_MEMBER:
            short[k] = v
    return {"keys": sorted(obj), "short": short}


def _json_text(body: bytes) -> str | None:
    if not body or len(body) > MAX_BODY_TEXT or not body.lstrip().startswith(b"{"):
        return None
    try:
        json.loads(body)
    except ValueError:
        return None
    return body.decode("utf-8", "replace")


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
