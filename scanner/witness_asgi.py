"""The witness protocol, and the witness inside vLLM that speaks it.

**The protocol** (one module: the stand-in's witness, ``scanner/standin/_witness.py``, and the
prober import it from here): the probe's query parameters (``vp_probe``, ``vp_hold``,
``vp_hold_group``, ``vp_answer``, ``vp_tag``), the read paths and headers, the record of a request
(:func:`record_of`), the hold (:func:`held_for`), the error answer (:func:`error_body`) and the
HMAC of tags, reads and seals (:func:`mac`). The stand-in's witness records every request and
answers reads at :data:`STANDIN_READ_PATH` without a MAC (a verify run's own loopback upstream);
the witness below records only tagged requests and answers only MAC'd reads, sealed.

**The witness inside vLLM**: ASGI middleware that records what vLLM received for the prober's own
requests, and for nothing else. Standard library only, one file, no import of this project:
``vllm-perimeter witness export DIR`` writes it as ``DIR/vllm_perimeter_witness.py`` and vLLM
loads it with its own ``--middleware`` flag::

    PYTHONPATH=DIR VLLM_PERIMETER_WITNESS_SECRET_FILE=/run/secrets/vp-witness \\
        vllm serve MODEL --middleware vllm_perimeter_witness.Witness

vLLM adds ``--middleware`` classes last, so the witness is the outermost layer: it sees each
request as the proxy sent it, before vLLM's own key check and routing.

**Which requests are the probe's.** A request is recorded only if its query carries a tag made
with the shared secret (the file named by :data:`ENV_SECRET_FILE`, at least 32 characters)::

    vp_tag=<unix seconds>.<nonce: 32 hex>.<HMAC-SHA256(secret, "vp-witness-1", "tag", ts, nonce,
            vp_probe, vp_hold, vp_hold_group, vp_answer) as hex>

valid within :data:`WINDOW_S` seconds of the witness's clock, and once: a tag seen again
(a proxy resending the request, or anyone replaying it) is refused: passed to vLLM untouched,
never held nor answered by the witness, no record of its own; it only counts as one more
arrival of the probe id it was made for (the prober's retry check). The query is the channel
because the generated proxies forward it unchanged (the stand-in's witness uses the same
parameters). Everything else, an untagged request, a forged, stale or spent tag, passes to vLLM
untouched and unrecorded. Without a secret (no file, unreadable, too short) the witness does
nothing at all.

**What a record holds** (a tagged request): the method, the raw path as the proxy sent it, the
query without the probe's own parameters, every header (credentials only as ``sha256:`` + 12 hex
of the token), the body's size and sha256, the text of a JSON object body up to 64 KiB (of a
larger one an outline: top-level names and members of at most 1 KiB), the output budget fields
of a JSON object body as vLLM will parse them (the last of duplicated names, as Python's json),
how long the witness held it (``vp_hold``), how many times it arrived, and how many tagged
requests of the same ``X-Perimeter-Principal`` were in flight at its arrival (itself included).
Records live at most :data:`RECORD_TTL_S` seconds and :data:`MAX_STORED_BYTES` in all.

**The way back.** ``GET`` :data:`READ_PATH` with ``prefix=P`` (or ``id=I``), ``ts``, ``nonce``
and ``mac`` = HMAC(secret, "vp-witness-1", "read", ts, nonce, "prefix"|"id", P) returns
``{"records": [...]}`` with the header :data:`SEAL_HEADER` = HMAC(secret, "vp-witness-1",
"records", nonce, sha256(body)): the prober accepts only records sealed for its own read. The
read path is served by vLLM's process itself, reached directly (never through the default-deny
proxy, which has no route for it); a read without a valid, fresh, unspent MAC passes to vLLM
like any request (its 404). Nothing is ever added to an answer vLLM gives.

**Failure.** Any error inside the witness is logged once per kind and the request goes on to
vLLM as it came; vLLM keeps serving.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
import urllib.parse
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

ENV_SECRET_FILE = "VLLM_PERIMETER_WITNESS_SECRET_FILE"
READ_PATH = "/__perimeter__/witness"
STANDIN_READ_PATH = "/__standin__/witness"   # the stand-in's witness: every record, no MAC (loopback)
SEAL_HEADER = "x-perimeter-witness-seal"
PRINCIPAL_HEADER = "x-perimeter-principal"
PROBE_PARAM = "vp_probe"
HOLD_PARAM = "vp_hold"
HOLD_GROUP_PARAM = "vp_hold_group"
ANSWER_PARAM = "vp_answer"
TAG_PARAM = "vp_tag"
SIGNED: tuple[str, ...] = (PROBE_PARAM, HOLD_PARAM, HOLD_GROUP_PARAM, ANSWER_PARAM)
OWN_PARAMS = frozenset((*SIGNED, TAG_PARAM))
VERSION = "vp-witness-1"
MIN_SECRET = 32
WINDOW_S = 120
MAX_NONCES = 200_000          # spent nonces kept (each for 2 x WINDOW_S); full: new tags refused
MAX_RECORDS = 100_000
MAX_STORED_BYTES = 64 * 1024 * 1024
RECORD_TTL_S = 3600
MAX_HOLD_MS = 30_000
MAX_HOLD_GROUPS = 10_000
MAX_BODY = 64 * 1024 * 1024
MAX_BODY_TEXT = 65_536
MAX_OUTLINE_MEMBER = 1024
LEAK_MARKER = "0x7f00deadbeef"
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})
BUDGET_FIELDS: tuple[str, ...] = ("max_tokens", "max_completion_tokens", "max_output_tokens",
                                  "max_new_tokens", "n", "best_of")

log = logging.getLogger("vllm_perimeter_witness")


# --- the protocol (the stand-in's witness and the prober import these) ------------------------------

def mac(secret: bytes, *parts: str) -> str:
    """HMAC-SHA256 over the parts (each one length-prefixed: no two lists give one text), hex."""
    text = "".join(f"{len(p)}:{p}" for p in (VERSION, *parts))
    return hmac.new(secret, text.encode("utf-8"), hashlib.sha256).hexdigest()


def tag(secret: bytes, params: Mapping[str, str], now: float | None = None, nonce: str = "") -> str:
    """The ``vp_tag`` value for a request whose probe parameters are ``params``."""
    ts = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(16)
    return f"{ts}.{nonce}.{mac(secret, 'tag', ts, nonce, *(params.get(k, '') for k in SIGNED))}"


def read_params(secret: bytes, value: str, exact: bool = False, now: float | None = None,
                nonce: str = "") -> dict[str, str]:
    """The query of a read of the records whose id starts with ``value`` (``exact``: is it)."""
    ts = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(16)
    key = "id" if exact else "prefix"
    return {key: value, "ts": ts, "nonce": nonce, "mac": mac(secret, "read", ts, nonce, key, value)}


def seal(secret: bytes, nonce: str, payload: bytes) -> str:
    """The :data:`SEAL_HEADER` of the records ``payload`` answering the read of ``nonce``."""
    return mac(secret, "records", nonce, hashlib.sha256(payload).hexdigest())


def load_secret(path: str | None) -> bytes | None:
    """The secret in the file at ``path`` (stripped; at least 32 characters), or None."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            text = f.read(4096).strip()
    except OSError as exc:
        log.warning("vllm-perimeter witness off: cannot read %s: %s", path, exc.strerror or exc)
        return None
    if len(text) < MIN_SECRET:
        log.warning("vllm-perimeter witness off: %s holds fewer than %d characters", path, MIN_SECRET)
        return None
    return text


def fingerprint(value: str) -> str:
    """``sha256:`` + 12 hex of the credential in a header value (``Bearer X`` -> of ``X``)."""
    scheme, _, rest = value.strip().partition(" ")
    token = rest.strip() if scheme.lower() in ("bearer", "basic") and rest else value.strip()
    return "sha256:" + hashlib.sha256(token.encode("latin-1", "replace")).hexdigest()[:12]


def error_body(status: int, probe: str) -> bytes:
    """The witness's answer to ``vp_answer=status``: a vLLM-style error whose message holds
    :data:`LEAK_MARKER` (the prober's error-body check proves a 5xx text never reaches a client)."""
    message = (f"vp-error {probe}: EngineCore failed, <vllm.v1.engine.EngineCoreRequest object at "
               f"{LEAK_MARKER}>")
    return json.dumps({"error": {"message": message, "type": "InternalServerError" if status >= 500
                                 else "BadRequestError", "code": status}}).encode()


def probe_params(query: list[tuple[str, str]]) -> dict[str, str]:
    """The probe's own parameters of a parsed query (the first of each; "" absent)."""
    first: dict[str, str] = {}
    for k, v in query:
        first.setdefault(k, v)
    return {k: first.get(k, "") for k in SIGNED}


def record_of(scope: Mapping[str, Any], body: bytes) -> dict[str, Any]:
    """What a witness records of a request (its ``vp_probe`` id, "" none): the method, the raw path
    as the proxy sent it, the query without the probe's own parameters, every header (credentials
    only as :func:`fingerprint`), the body's size and sha256, the text of a JSON object body up to
    :data:`MAX_BODY_TEXT` (of a larger one an ``outline``: top-level names and members of at most
    :data:`MAX_OUTLINE_MEMBER`), and its output ``budget`` fields as vLLM will parse them."""
    query = urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    record: dict[str, Any] = {
        "id": probe_params(query)[PROBE_PARAM],
        "method": scope.get("method", ""),
        "path": (scope.get("raw_path") or scope.get("path", "").encode()).decode("latin-1"),
        "query": urllib.parse.urlencode([(k, v) for k, v in query if k not in OWN_PARAMS]),
        "headers": [[k.decode("latin-1").lower(), header_value(k, v)] for k, v in scope.get("headers", [])],
        "body_bytes": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body": None,
    }
    obj = json_object(body)
    if obj is not None:
        if len(body) <= MAX_BODY_TEXT:
            record["body"] = body.decode("utf-8", "replace")
        else:
            record["outline"] = {"keys": sorted(obj), "short": {
                k: v for k, v in obj.items() if len(json.dumps(v)) <= MAX_OUTLINE_MEMBER}}
        record["budget"] = {k: obj[k] for k in BUDGET_FIELDS if k in obj}
    return record


def held_for(hold_start: dict[str, float], params: Mapping[str, str], now: float) -> float:
    """How long to hold a request: ``vp_hold`` ms (at most :data:`MAX_HOLD_MS`; 0 none), or what is
    left of its group's hold (``vp_hold_group``: the group's first arrival, kept in ``hold_start``
    on the clock of ``now``, plus the hold)."""
    hold = params.get(HOLD_PARAM, "")
    if not hold.isdigit():
        return 0.0
    seconds = min(int(hold), MAX_HOLD_MS) / 1000
    group = params.get(HOLD_GROUP_PARAM, "")
    if not group:
        return seconds
    if group not in hold_start and len(hold_start) >= MAX_HOLD_GROUPS:
        hold_start.clear()
    start = hold_start.setdefault(group, now)
    return max(0.0, start + seconds - now)


async def answered(send: Any, params: Mapping[str, str]) -> bool:
    """Answer the request in the app's place when ``vp_answer`` asks for a status (400 - 599):
    :func:`error_body`; False when it does not ask."""
    status = params.get(ANSWER_PARAM, "")
    if not (status.isdigit() and 400 <= int(status) <= 599):
        return False
    payload = error_body(int(status), params.get(PROBE_PARAM, ""))
    await send({"type": "http.response.start", "status": int(status),
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
    return True


def header_value(name: bytes, value: bytes) -> str:
    """A header's value as recorded: a credential header's only as its :func:`fingerprint`."""
    text = value.decode("latin-1")
    return fingerprint(text) if name.decode("latin-1").lower() in SECRET_HEADERS else text


async def read_body(receive: Any, chunks: list[bytes]) -> bool:
    """Read the body into ``chunks`` (up to MAX_BODY); True if more was left unread."""
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return False
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return False
        if size > MAX_BODY:
            return True


def json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, if it is one."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


# --- the middleware -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Probe:
    """A request whose tag verified: its probe parameters (a read: ``read`` is the key)."""

    params: Mapping[str, str]
    nonce: str
    replay: bool = False
    read: str = ""


class Witness:
    """``Witness(app)`` (vLLM's ``--middleware``: the secret from :data:`ENV_SECRET_FILE`), or
    ``Witness(app, secret=b"...")``. See the module docstring."""

    def __init__(self, app: Any, secret: bytes | None = None) -> None:
        self.app = app
        self.secret = secret if secret is not None else load_secret(os.environ.get(ENV_SECRET_FILE))
        if self.secret is not None and len(self.secret) < MIN_SECRET:
            self.secret = None
        self.nonces: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.records: collections.deque[dict[str, Any]] = collections.deque()
        self.by_id: dict[str, dict[str, Any]] = {}
        self.stored = 0
        self.in_flight: dict[str, int] = {}
        self.hold_start: dict[str, float] = {}
        self.failed: set[str] = set()

    # -- ASGI --
    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        probe = None
        if self.secret is not None and scope.get("type") == "http":
            try:
                probe = self._admit(scope)
            except Exception as exc:   # never in vLLM's way
                self._failed("admit", exc)
        if probe is None or probe.replay:
            await self.app(scope, receive, send)
            return
        if probe.read:
            try:
                payload, sealed = self._read(probe)
            except Exception as exc:
                self._failed("read", exc)
                await self.app(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode()),
                                    (SEAL_HEADER.encode(), sealed.encode()),
                                    (b"cache-control", b"no-store")]})
            await send({"type": "http.response.body", "body": payload})
            return
        await self._witnessed(probe, scope, receive, send)

    async def _witnessed(self, probe: _Probe, scope: MutableMapping[str, Any], receive: Any,
                         send: Any) -> None:
        chunks: list[bytes] = []
        more = True
        try:
            more = await read_body(receive, chunks)
        except Exception as exc:   # what was read goes on to vLLM, then the rest as it comes
            self._failed("body", exc)
        body = b"".join(chunks)
        replay = [{"type": "http.request", "body": body, "more_body": more}]

        async def replayed() -> Any:
            if replay:
                return replay.pop()
            return await receive()

        principal = _header(scope, PRINCIPAL_HEADER)
        counted = False
        try:
            record: dict[str, Any] | None = None
            try:
                self.in_flight[principal] = self.in_flight.get(principal, 0) + 1
                counted = True
                record = self._record(scope, probe, body, self.in_flight[principal])
            except Exception as exc:
                self._failed("record", exc)
            if record is not None:
                try:
                    held = self._held_for(probe.params)
                except Exception as exc:
                    self._failed("hold", exc)
                    held = 0.0
                if held > 0:
                    record["held_ms"] = round(held * 1000, 3)
                    await asyncio.sleep(held)
                if await answered(send, probe.params):
                    return
            await self.app(scope, replayed, send)
        finally:
            if counted:
                left = self.in_flight.get(principal, 1) - 1
                if left > 0:
                    self.in_flight[principal] = left
                else:
                    self.in_flight.pop(principal, None)

    # -- the tag --
    def _admit(self, scope: MutableMapping[str, Any]) -> _Probe | None:
        """The request's verified tag, or None: not the probe's (passes untouched)."""
        assert self.secret is not None
        raw = scope.get("query_string", b"")
        if b"vp_tag=" not in raw and not (scope.get("path") == READ_PATH and b"mac=" in raw):
            return None
        query = urllib.parse.parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
        first: dict[str, str] = {}
        for k, v in query:
            first.setdefault(k, v)
        if scope.get("path") == READ_PATH and scope.get("method") == "GET":
            return self._admit_read(first)
        ts, _, rest = first.get(TAG_PARAM, "").partition(".")
        nonce, _, given = rest.partition(".")
        params = probe_params(query)
        if not params[PROBE_PARAM] or not self._fresh(ts, nonce):
            return None
        if not hmac.compare_digest(given, mac(self.secret, "tag", ts, nonce, *params.values())):
            return None
        if not self._spend(nonce, int(ts)):
            earlier = self.by_id.get(params[PROBE_PARAM])
            if earlier is not None and earlier.get("nonce") == nonce:
                earlier["arrivals"] = earlier.get("arrivals", 1) + 1   # the proxy resent it
            return _Probe(params, nonce, replay=True)
        return _Probe(params, nonce)

    def _admit_read(self, q: Mapping[str, str]) -> _Probe | None:
        assert self.secret is not None
        key = "id" if "id" in q else "prefix"
        ts, nonce, value = q.get("ts", ""), q.get("nonce", ""), q.get(key, "")
        if not self._fresh(ts, nonce):
            return None
        if not hmac.compare_digest(q.get("mac", ""), mac(self.secret, "read", ts, nonce, key, value)):
            return None
        if not self._spend(nonce, int(ts)):
            return None
        return _Probe({key: value}, nonce, read=key)

    @staticmethod
    def _fresh(ts: str, nonce: str) -> bool:
        if not ts.isdigit() or len(ts) > 12 or not 16 <= len(nonce) <= 64 or not nonce.isalnum():
            return False
        return abs(time.time() - int(ts)) <= WINDOW_S

    def _spend(self, nonce: str, ts: int) -> bool:
        """Mark ``nonce`` used; False if it was (or no room is left to remember it)."""
        now = time.time()
        while self.nonces:
            oldest, at = next(iter(self.nonces.items()))
            if at > now - 2 * WINDOW_S:
                break
            del self.nonces[oldest]
        if nonce in self.nonces or len(self.nonces) >= MAX_NONCES:
            return False
        self.nonces[nonce] = now
        return True

    # -- the records --
    def _record(self, scope: MutableMapping[str, Any], probe: _Probe, body: bytes,
                in_flight: int) -> dict[str, Any]:
        record = {**record_of(scope, body), "arrivals": 1, "in_flight": in_flight, "nonce": probe.nonce,
                  "at": time.time()}
        self._store(record)
        return record

    def _store(self, record: dict[str, Any]) -> None:
        size = len(json.dumps(record))
        record["size"] = size
        now = time.time()
        while self.records and (len(self.records) >= MAX_RECORDS or self.stored + size > MAX_STORED_BYTES
                                or self.records[0]["at"] < now - RECORD_TTL_S):
            old = self.records.popleft()
            self.stored -= old["size"]
            if self.by_id.get(old["id"]) is old:
                del self.by_id[old["id"]]
        self.records.append(record)
        self.stored += size
        self.by_id[record["id"]] = record

    def _read(self, probe: _Probe) -> tuple[bytes, str]:
        assert self.secret is not None
        hidden = ("nonce", "at", "size")
        if probe.read == "id":
            found = [r for r in (self.by_id.get(probe.params["id"]),) if r is not None]
        else:
            prefix = probe.params["prefix"]
            found = [r for r in list(self.records) if r["id"].startswith(prefix)]
        cutoff = time.time() - RECORD_TTL_S
        payload = json.dumps({"records": [{k: v for k, v in r.items() if k not in hidden}
                                          for r in found if r["at"] >= cutoff]}).encode()
        return payload, seal(self.secret, probe.nonce, payload)

    def _held_for(self, params: Mapping[str, str]) -> float:
        return held_for(self.hold_start, params, time.monotonic())

    def _failed(self, where: str, exc: BaseException) -> None:
        if where not in self.failed:
            self.failed.add(where)
            log.warning("vllm-perimeter witness: %s failed (%s); requests pass untouched",
                        where, type(exc).__name__)


def _header(scope: Mapping[str, Any], name: str) -> str:
    want = name.encode("latin-1")
    for k, v in scope.get("headers", []):
        if k.lower() == want:
            return str(v.decode("latin-1"))
    return ""
