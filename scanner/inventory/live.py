"""Black-box inventory of a running server (``inventory live URL``): measured, not extracted.

Candidates: every (method, path) of every bundled catalog, the route lists read from
``vllm-rs`` binaries (:mod:`scanner.inventory.rust`), the server's ``/openapi.json`` when it
serves one, and the methods the server itself names in ``Allow``. Each is classified
``served``, ``absent`` or ``unknown`` by the server's own answers:

1. **Calibration.** Each method is sent twice to a random path (``/vp-absent-<hex>``): that
   is what "absent" looks like here (FastAPI: 404 ``{"detail":"Not Found"}``; axum: 404 with
   an empty body). Answers are compared by status, content type and body (the path blanked);
   when the two calibration bodies differ (a request id in the body), by status and type only.
2. **Discovery.** ``OPTIONS <path>`` for every candidate path. Routers answer a method the path
   does not serve with 405 and ``Allow`` before any handler runs (Starlette and axum alike);
   vLLM's ``--api-key`` check skips OPTIONS, so this works without a key. An absent path gets
   the calibrated absent answer; a mount (``/metrics``) answers OPTIONS itself.
3. **Method probes.** A candidate method is sent only when it cannot act: GET, HEAD, OPTIONS,
   and POST with an *empty* body of content type ``application/x-vllm-perimeter-probe``
   (vLLM's routes reject it in validation: 400 "Unsupported Media Type"; axum's ``Json``
   extractor: 400/415), path templates filled with ``vllm-perimeter-probe``. Never sent by
   default: any method of a state-changing path (:mod:`scanner.state_changing`: /pause,
   /sleep, /collective_rpc, /update_weights, /scale_elastic_ep ...) and PUT, PATCH, DELETE
   anywhere. Those are served when the discovery 405 lists them in ``Allow``, absent when the
   path is absent, else unknown (Starlette's ``Allow`` names only the first route of a path
   that has several). ``allow_state_changes`` sends them too (same empty body): for a
   staging server only, they may pause, sleep or reset it.
4. **Guard.** With a key, every probe carries ``Authorization: Bearer <key>`` and each served
   route is asked again without it: ``guarded`` when that answer is 401/403 and the keyed one
   differs. For a state-changing path the guard is asked with a method the path does not
   serve (PATCH, PUT or DELETE): the guard answers 401 before routing, else the router 405.
   Without a key a 401/403 proves nothing about the route (vLLM answers 401 for every path
   under /v1), so such a route is served only if discovery listed the method.
5. **WebSocket** candidates (``/v1/realtime``) get an upgrade handshake (closed at once):
   served when the answer differs from an absent path's (101, or a handler's 500 engine-less).

Bounded: ``max_requests`` and ``max_time`` for the whole run, ``timeout`` per request,
``concurrency`` requests at a time. An unreachable target fails at calibration (exit 3).
The inventory lists served routes only (``source.kind`` ``live``; each route's ``origin``
says how it was seen); :class:`LiveResult` keeps every candidate's verdict and evidence.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from scanner.errors import InventoryError, TargetUnreachableError, UsageError
from scanner.inventory import catalog, rust
from scanner.inventory.model import ANY_METHOD, Inventory, Route, RouteKind, Source
from scanner.inventory.openapi import from_document
from scanner.output import read_text
from scanner.secrets import redact_url, scrub, url_secrets
from scanner.state_changing import is_state_changing

Verdict = Literal["served", "absent", "unknown"]
PROBE_CONTENT_TYPE = "application/x-vllm-perimeter-probe"
TEMPLATE_VALUE = "vllm-perimeter-probe"
USER_AGENT = "vllm-perimeter-inventory-live"
# Sent as the route's own method by default (POST only with an empty, non-JSON body).
SENDABLE = frozenset({"GET", "HEAD", "OPTIONS", "POST"})
# Methods a state-changing path is asked with for its guard (one it does not serve).
GUARD_PROBE_METHODS = ("PATCH", "PUT", "DELETE")
GUARD_STATUSES = frozenset({401, 403})
CALIBRATION_METHODS = ("OPTIONS", "GET", "HEAD", "POST")
OPENAPI_PATH = "/openapi.json"
MAX_BODY = 64 * 1024
MAX_OPENAPI_BYTES = 32 * 1024 * 1024
ORIGIN_PREFIX = "live"
_TEMPLATE = re.compile(r"\{[^}/]*\}|(?<=/):[A-Za-z_][A-Za-z0-9_]*|(?<=/)\*[A-Za-z_]*")

_RETRIED = ("ReadError", "RemoteProtocolError", "WriteError")
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class LiveInventory:
    """Where and how hard to ask. ``key`` is the API key itself (read from a file by the CLI;
    never printed, never written)."""

    url: str
    key: str | None = field(default=None, repr=False)
    timeout: float = 5.0
    max_time: float = 120.0
    max_requests: int = 3000
    concurrency: int = 4
    verify: bool = True
    ca_file: str | None = None
    allow_state_changes: bool = False
    catalogs: tuple[str, ...] | None = None      # catalog names or inventory files; None: all bundled
    binaries: tuple[str, ...] = ()               # vllm-rs binaries to read route lists from
    openapi: bool = True                         # read /openapi.json when the server serves it
    extra_paths: tuple[str, ...] = ()            # more candidate paths (methods from Allow)

    @property
    def base(self) -> str:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"{redact_url(self.url)} is not an http(s) URL")
        return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))

    @property
    def shown_url(self) -> str:
        return redact_url(self.base)

    def inventory(self) -> Inventory:
        return run(self).inventory


def read_key(path: str) -> str:
    """The API key in ``path`` (surrounding whitespace dropped); errors never show it."""
    value = read_text(Path(path), "key file", lambda msg: UsageError(f"--key {msg}")).strip()
    if not value or any(c.isspace() for c in value):
        raise UsageError(f"--key {path}: expected one key on one line")
    return value


# --- answers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerAnswer:
    """What the server said to one request (``status`` None: no answer, ``error`` says why)."""

    status: int | None
    content_type: str = ""
    body_digest: str = ""
    allow: tuple[str, ...] = ()
    error: str = ""

    @property
    def guard(self) -> bool:
        return self.status in GUARD_STATUSES

    def same(self, other: ServerAnswer, by_body: bool) -> bool:
        if self.status is None or self.status != other.status or self.content_type != other.content_type:
            return False
        return not by_body or self.body_digest == other.body_digest

    def brief(self) -> str:
        if self.status is None:
            return f"no answer ({self.error})"
        out = str(self.status)
        if self.allow:
            out += " allow " + ",".join(self.allow)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "content_type": self.content_type, "allow": list(self.allow),
                "body": self.body_digest, "error": self.error}


def _answer(resp: httpx.Response, path: str, body: bytes) -> ServerAnswer:
    ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    allow = tuple(sorted({m.strip().upper() for m in resp.headers.get("allow", "").split(",")
                          if m.strip()}))
    blanked = body.replace(path.encode("utf-8", "replace"), b"{path}")
    return ServerAnswer(resp.status_code, ctype, hashlib.sha256(blanked).hexdigest()[:16], allow)


# --- candidates ----------------------------------------------------------------------------


@dataclass
class Candidate:
    """A path some source says a vLLM server may serve, and the methods they name."""

    path: str
    methods: set[str] = field(default_factory=set)
    kinds: set[RouteKind] = field(default_factory=set)
    listed_by: set[str] = field(default_factory=set)

    @property
    def url_path(self) -> str:
        return concrete(self.path)

    @property
    def state_changing(self) -> bool:
        return is_state_changing(self.path)


def _template_regex(path: str) -> re.Pattern[str]:
    """The concrete paths a route template matches (``{x}`` one segment, ``{x:path}`` and
    ``*x`` the rest)."""
    out, i = "", 0
    for m in _TEMPLATE.finditer(path):
        out += re.escape(path[i:m.start()])
        out += ".*" if m.group(0).startswith("*") or m.group(0).endswith(":path}") else "[^/]+"
        i = m.end()
    return re.compile(out + re.escape(path[i:]))


def concrete(path: str) -> str:
    """``/v1/responses/{response_id}`` -> ``/v1/responses/vllm-perimeter-probe``."""
    return _TEMPLATE.sub(TEMPLATE_VALUE, path)


def _add(cands: dict[str, Candidate], path: str, methods: Iterable[str], kind: RouteKind,
         source: str) -> None:
    if not path.startswith("/"):
        return
    c = cands.setdefault(path, Candidate(path))
    c.methods.update(m.upper() for m in methods)
    c.kinds.add(kind)
    c.listed_by.add(source)


def catalog_candidates(refs: Sequence[str] | None = None) -> dict[str, Candidate]:
    """Every route of the given inventories (files or bundled catalog names). None: every
    bundled catalog extracted from a vLLM app (not the ones a live run made: their routes
    are in the binaries, and a catalog built from itself would not be reproducible)."""
    invs = [catalog.load_ref(ref) for ref in refs] if refs is not None else \
        [inv for inv in map(catalog.load_catalog, catalog.names()) if inv.source.kind != "live"]
    cands: dict[str, Candidate] = {}
    for inv in invs:
        for r in inv.routes:
            _add(cands, r.path, r.methods, r.kind, "catalog")
    return cands


# --- findings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveFinding:
    """One (path, method, kind): the verdict, the guard, and what was seen."""

    path: str
    method: str
    kind: RouteKind
    verdict: Verdict
    guarded: bool | None
    seen: tuple[str, ...]
    listed_by: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "method": self.method, "kind": self.kind, "verdict": self.verdict,
                "guarded": self.guarded, "seen": list(self.seen), "listed_by": list(self.listed_by)}


@dataclass(frozen=True)
class LiveResult:
    inventory: Inventory
    findings: tuple[LiveFinding, ...]
    calibration: Mapping[str, ServerAnswer]
    binaries: tuple[rust.RustRoutes, ...]
    openapi_read: bool
    requests: int
    seconds: float
    keyed: bool
    notes: tuple[str, ...] = ()

    def of(self, verdict: Verdict) -> tuple[LiveFinding, ...]:
        return tuple(f for f in self.findings if f.verdict == verdict)

    def summary(self) -> str:
        counts = ", ".join(f"{len(self.of(v))} {v}" for v in ("served", "absent", "unknown"))
        return (f"live: {len(self.inventory.routes)} routes served ({counts} method x path); "
                f"{self.requests} requests in {self.seconds:.1f}s"
                + ("" if self.keyed else "; no --key: guarded routes show only via OPTIONS"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.inventory.source.target,
            "keyed": self.keyed,
            "requests": self.requests,
            "calibration": {m: a.to_dict() for m, a in sorted(self.calibration.items())},
            "openapi_read": self.openapi_read,
            "binaries": [b.to_dict() for b in self.binaries],
            "notes": list(self.notes),
            "findings": [f.to_dict() for f in self.findings],
        }


# --- sending ---------------------------------------------------------------------------------


class _Budget(Exception):
    pass


class _Sender:
    """Every request of a run goes through here: counted, timed, capped."""

    def __init__(self, spec: LiveInventory) -> None:
        self.spec = spec
        self.base = spec.base
        self.shown = spec.shown_url
        self.secrets = (*url_secrets(spec.url), *((spec.key,) if spec.key else ()))
        self.deadline = time.monotonic() + spec.max_time
        self.count = 0
        self.lock = threading.Lock()
        tls: ssl.SSLContext | bool = spec.verify
        if spec.ca_file:
            try:
                tls = ssl.create_default_context(cafile=spec.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(f"--ca-file {spec.ca_file}: cannot load CA bundle: {exc}") from None
        self.tls = tls
        self.client = httpx.Client(
            verify=tls, timeout=spec.timeout, follow_redirects=False,
            limits=httpx.Limits(max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency),
            headers={"User-Agent": USER_AGENT})

    def close(self) -> None:
        self.client.close()

    def _take(self) -> None:
        with self.lock:
            if self.count >= self.spec.max_requests:
                raise _Budget(f"stopped at --max-requests {self.spec.max_requests}")
            if time.monotonic() > self.deadline:
                raise _Budget(f"stopped at --max-time {self.spec.max_time:g}s")
            self.count += 1

    def _headers(self, keyed: bool, with_body: bool) -> dict[str, str]:
        headers: dict[str, str] = {}
        if keyed and self.spec.key:
            headers["Authorization"] = f"Bearer {self.spec.key}"
        if with_body:
            headers["Content-Type"] = PROBE_CONTENT_TYPE
        return headers

    def http(self, method: str, path: str, keyed: bool = True) -> ServerAnswer:
        """One non-acting request: no body, or an empty body of a type nothing accepts. A
        connection the server dropped (a kept-alive one it closed after an error) is retried
        once on a new one; a timeout is not."""
        a = self._http(method, path, keyed)
        if a.status is None and a.error.startswith(_RETRIED):
            a = self._http(method, path, keyed)
        return a

    def _http(self, method: str, path: str, keyed: bool) -> ServerAnswer:
        self._take()
        with_body = method not in ("GET", "HEAD", "OPTIONS")
        try:
            with self.client.stream(method, self.base + path, headers=self._headers(keyed, with_body),
                                    content=b"" if with_body else None) as resp:
                body = b""
                stop = time.monotonic() + self.spec.timeout
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) >= MAX_BODY or time.monotonic() > stop:
                        break  # a stream that never ends: its first bytes are enough
                return _answer(resp, path, body[:MAX_BODY])
        except httpx.HTTPError as exc:
            return ServerAnswer(None, error=self._reason(exc))

    def get_json_bytes(self, path: str, limit: int) -> bytes | None:
        """GET ``path`` (keyed) and its body when 200 and at most ``limit`` bytes."""
        self._take()
        try:
            with self.client.stream("GET", self.base + path, headers=self._headers(True, False)) as resp:
                if resp.status_code != 200:
                    return None
                body = b""
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        return None
                return body
        except httpx.HTTPError:
            return None

    def websocket(self, path: str, keyed: bool = True) -> ServerAnswer:
        """An upgrade handshake; the connection is closed as soon as the status line is read."""
        self._take()
        parts = urlsplit(self.base)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        lines = [f"GET {parts.path}{path} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}",
                 "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                 f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
                 f"User-Agent: {USER_AGENT}",
                 *(f"{k}: {v}" for k, v in self._headers(keyed, False).items())]
        try:
            with socket.create_connection((host, port), timeout=self.spec.timeout) as raw:
                sock: socket.socket = raw
                if parts.scheme == "https":
                    ctx = self.tls if isinstance(self.tls, ssl.SSLContext) else ssl.create_default_context()
                    if self.tls is False:
                        ctx.check_hostname = False
                        ctx.verify_mode = ssl.CERT_NONE
                    sock = ctx.wrap_socket(raw, server_hostname=host)
                sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
                head = b""
                while b"\r\n\r\n" not in head and len(head) < MAX_BODY:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    head += chunk
        except (OSError, ssl.SSLError) as exc:
            return ServerAnswer(None, error=scrub(str(exc) or type(exc).__name__, self.secrets))
        return _handshake_answer(head)

    def _reason(self, exc: BaseException) -> str:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return scrub(f"{type(exc).__name__}: {text}", self.secrets)


def _handshake_answer(head: bytes) -> ServerAnswer:
    status_line, _, rest = head.partition(b"\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", status_line)
    if m is None:
        return ServerAnswer(None, error="no HTTP status line")
    headers, _, body = rest.partition(b"\r\n\r\n")
    ctype = ""
    for line in headers.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-type":
            ctype = value.decode("latin-1").split(";")[0].strip().lower()
    return ServerAnswer(int(m.group(1)), ctype, hashlib.sha256(body).hexdigest()[:16])


def _parallel(sender: _Sender, func: Callable[[T], R], items: Sequence[T]) -> list[R]:
    if sender.spec.concurrency <= 1 or len(items) <= 1:
        return [func(i) for i in items]
    with ThreadPoolExecutor(max_workers=sender.spec.concurrency) as pool:
        return list(pool.map(func, items))


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """What an absent path looks like, per method (keyed and, with a key, without it)."""

    absent: Mapping[str, ServerAnswer]
    by_body: Mapping[str, bool]
    websocket: ServerAnswer | None = None

    def is_absent(self, method: str, a: ServerAnswer) -> bool:
        ref = self.absent.get(method)
        return ref is not None and a.same(ref, self.by_body.get(method, True))

    @property
    def discovery_works(self) -> bool:
        """Does OPTIONS on an absent path answer something a real path would not?"""
        ref = self.absent.get("OPTIONS")
        return ref is not None and ref.status is not None and ref.status != 405 \
            and not ref.guard and not 200 <= ref.status < 300


def _calibrate(sender: _Sender, methods: Iterable[str], websocket: bool) -> Calibration:
    absent: dict[str, ServerAnswer] = {}
    by_body: dict[str, bool] = {}
    for method in sorted(set(methods)):
        first = sender.http(method, f"/vp-absent-{secrets.token_hex(6)}")
        if first.status is None:
            raise TargetUnreachableError(f"{sender.shown}: unreachable: {first.error}")
        second = sender.http(method, f"/vp-absent-{secrets.token_hex(9)}")
        absent[method] = first
        by_body[method] = second.same(first, True)
    ws = sender.websocket(f"/vp-absent-{secrets.token_hex(6)}") if websocket else None
    return Calibration(absent, by_body, ws)


def _openapi(sender: _Sender) -> dict[str, Candidate]:
    body = sender.get_json_bytes(OPENAPI_PATH, MAX_OPENAPI_BYTES)
    if body is None:
        return {}
    try:
        doc = json.loads(body.decode("utf-8"))
        inv = from_document(doc, sender.shown)
    except (UnicodeDecodeError, ValueError, InventoryError):
        return {}
    cands: dict[str, Candidate] = {}
    for r in inv.routes:
        _add(cands, r.path, r.methods, r.kind, "openapi")
    return cands


@dataclass
class _PathState:
    cand: Candidate
    discovery: ServerAnswer | None = None
    probes: dict[tuple[str, bool], ServerAnswer] = field(default_factory=dict)  # (method, keyed)
    siblings: dict[str, ServerAnswer] = field(default_factory=dict)  # method -> keyed, absent sibling

    @property
    def allow(self) -> tuple[str, ...]:
        d = self.discovery
        return d.allow if d is not None and d.status == 405 else ()


def run(spec: LiveInventory) -> LiveResult:
    """Ask the server at ``spec.url`` about every candidate; see the module docstring."""
    started = time.monotonic()
    if not 1 <= spec.concurrency <= 16:
        raise UsageError("--concurrency must be between 1 and 16")
    cands = catalog_candidates(spec.catalogs)
    known = set(cands)
    binaries = tuple(rust.read(b, known) for b in spec.binaries)
    for b in binaries:
        for p in b.paths:
            _add(cands, p, (), "http", "vllm-rs")
    for p in spec.extra_paths:
        _add(cands, p, (), "http", "given")
    sender = _Sender(spec)
    try:
        try:
            result = _run(spec, sender, cands, binaries)
        except _Budget as exc:
            raise TargetUnreachableError(f"{sender.shown}: inventory incomplete: {exc} "
                                         f"({sender.count} requests)") from None
    finally:
        sender.close()
    return LiveResult(inventory=result[0], findings=result[1], calibration=result[2],
                      binaries=binaries, openapi_read=result[3], requests=sender.count,
                      seconds=time.monotonic() - started, keyed=spec.key is not None, notes=result[4])


def _run(spec: LiveInventory, sender: _Sender, cands: dict[str, Candidate],
         binaries: tuple[rust.RustRoutes, ...]
         ) -> tuple[Inventory, tuple[LiveFinding, ...], dict[str, ServerAnswer], bool, tuple[str, ...]]:
    notes: list[str] = []
    has_ws = any("websocket" in c.kinds for c in cands.values())
    cal = _calibrate(sender, CALIBRATION_METHODS, has_ws)
    if spec.key:  # what an absent path looks like without the key (a guard over everything?)
        for method in ("GET", "POST"):
            unkeyed = sender.http(method, f"/vp-absent-{secrets.token_hex(6)}", keyed=False)
            if unkeyed.guard:
                notes.append(f"{method} to an absent path without the key: {unkeyed.brief()} "
                             "(a guard in front of every path)")
    if not cal.discovery_works:
        notes.append(f"OPTIONS to an absent path answers {cal.absent['OPTIONS'].brief()}: "
                     "discovery by OPTIONS does not work on this server")
    get_absent = cal.absent["GET"]
    if get_absent.status is not None and 200 <= get_absent.status < 300:
        notes.append(f"GET to an absent path answers {get_absent.brief()}: a catch-all; "
                     "served and absent look alike")
    openapi_read = False
    if spec.openapi:
        spec_cands = _openapi(sender)
        openapi_read = bool(spec_cands)
        for p, c in spec_cands.items():
            for kind in c.kinds:
                _add(cands, p, c.methods, kind, "openapi")

    states = {p: _PathState(c) for p, c in sorted(cands.items())}
    http_states = [s for s in states.values() if s.cand.kinds - {"websocket"}]

    def discover(s: _PathState) -> None:
        s.discovery = sender.http("OPTIONS", s.cand.url_path)

    _parallel(sender, discover, http_states)
    templates = [(c.path, _template_regex(c.path)) for c in cands.values() if _TEMPLATE.search(c.path)]
    for s in http_states:
        # methods the server names for the path are candidates too, unless a template route
        # may be the one answering (GET /v1/responses/render is GET /v1/responses/{response_id})
        if not any(t != s.cand.path and rx.fullmatch(s.cand.url_path) for t, rx in templates):
            s.cand.methods.update(m for m in s.allow if m != "OPTIONS" or "OPTIONS" in s.cand.methods)

    # method probes (keyed when a key is given)
    jobs = [(s, m) for s in http_states for m in sorted(s.cand.methods)
            if m != ANY_METHOD and _may_send(spec, s.cand, m)]
    if any(ANY_METHOD in s.cand.methods for s in http_states):
        jobs += [(s, "GET") for s in http_states if ANY_METHOD in s.cand.methods
                 and "GET" not in s.cand.methods and _may_send(spec, s.cand, "GET")]

    def probe(job: tuple[_PathState, str]) -> None:
        s, m = job
        s.probes[(m, True)] = sender.http(m, s.cand.url_path, keyed=True)

    _parallel(sender, probe, jobs)
    findings: list[LiveFinding] = []
    for s in http_states:
        findings += [_http_finding(spec, cal, s, m) for m in sorted(s.cand.methods)]
        if not s.cand.methods:  # a path no source gave methods for, and no Allow: OPTIONS says
            findings.append(_path_finding(cal, s))

    # guard: each served route asked without the key (without a key, the probes were)
    guard_jobs: list[tuple[_PathState, str]] = []
    for f in findings:
        s = states[f.path]
        m = _guard_method(spec, s, f.method) if f.verdict == "served" or _key_refused(spec, s, f) else None
        if m is not None and (m, not spec.key) not in s.probes and (s, m) not in guard_jobs:
            guard_jobs.append((s, m))

    def bare(job: tuple[_PathState, str]) -> None:
        s, m = job
        if spec.key:
            s.probes[(m, False)] = sender.http(m, s.cand.url_path, keyed=False)
            keyed = s.probes.get((m, True))
            if keyed is not None and keyed.guard:  # what a path beside it that surely is absent gets
                s.siblings[m] = sender.http(m, _sibling(s.cand.url_path), keyed=True)
        if (m, True) not in s.probes:
            s.probes[(m, True)] = sender.http(m, s.cand.url_path, keyed=True)

    _parallel(sender, bare, guard_jobs)
    findings = [_with_guard(spec, states[f.path], f) for f in findings]

    for s in states.values():
        if "websocket" in s.cand.kinds:
            findings.append(_ws_finding(spec, sender, cal, s))
    inv = _inventory(sender.shown, findings)
    return inv, tuple(sorted(findings, key=lambda f: (f.path, f.kind, f.method))), \
        dict(cal.absent), openapi_read, tuple(notes)


def _may_send(spec: LiveInventory, cand: Candidate, method: str) -> bool:
    if spec.allow_state_changes:
        return True
    return method in SENDABLE and not cand.state_changing


def _guard_method(spec: LiveInventory, s: _PathState, method: str) -> str | None:
    """The request that asks the guard about ``method`` at this path without acting."""
    if method == ANY_METHOD:
        return "GET" if _may_send(spec, s.cand, "GET") else None
    if _may_send(spec, s.cand, method):
        return method if method != "OPTIONS" else None  # vLLM's guard skips OPTIONS
    taken = set(s.allow) | s.cand.methods
    return next((m for m in GUARD_PROBE_METHODS if m not in taken), None) if s.allow else None


def _http_finding(spec: LiveInventory, cal: Calibration, s: _PathState, method: str) -> LiveFinding:
    d = s.discovery
    assert d is not None
    seen = [f"OPTIONS {d.brief()}"]
    listed = tuple(sorted(s.cand.listed_by | ({"allow"} if method in s.allow else set())))
    kind: RouteKind = "mount" if method == ANY_METHOD else "http"

    def out(verdict: Verdict) -> LiveFinding:
        return LiveFinding(s.cand.path, method, kind, verdict, None, tuple(seen), listed)

    path_absent = cal.discovery_works and cal.is_absent("OPTIONS", d)
    if method == ANY_METHOD:  # a mount answers methods no route declares: OPTIONS itself
        if d.status is None or d.guard or d.status == 405 or cal.is_absent("OPTIONS", d):
            return out("unknown" if d.status is None or d.guard else "absent")
        return out("served")
    a = s.probes.get((method, True))
    if a is None:
        seen.append(f"{method} not sent ({_why_not_sent(s.cand, method)})")
        if method in s.allow:
            return out("served")
        # a 405 whose Allow omits the method is not proof: Starlette names only the first
        # route of a path that has several
        return out("absent" if path_absent else "unknown")
    seen.append(f"{method} {a.brief()}")
    if a.status == 405 or (a.status is not None and cal.is_absent(method, a)):
        return out("absent")
    if a.status is None or a.guard:
        return out("served" if method in s.allow else "absent" if path_absent else "unknown")
    return out("served")


def _path_finding(cal: Calibration, s: _PathState) -> LiveFinding:
    """A candidate path without methods (a binary's route, ``--path``) whose OPTIONS answer
    named none: absent if that is the absent answer, served (OPTIONS) if it answered itself."""
    d = s.discovery
    assert d is not None
    if cal.discovery_works and cal.is_absent("OPTIONS", d):
        verdict: Verdict = "absent"
    elif d.status is None or d.guard or d.status == 405 or not cal.discovery_works:
        verdict = "unknown"
    else:
        verdict = "served"
    return LiveFinding(s.cand.path, "OPTIONS", "http", verdict, None, (f"OPTIONS {d.brief()}",),
                   tuple(sorted(s.cand.listed_by)))


def _why_not_sent(cand: Candidate, method: str) -> str:
    return "state-changing path" if cand.state_changing else f"{method} may act"


def _sibling(path: str) -> str:
    """A surely absent path in the same directory: ``/v1/x`` -> ``/v1/vp-absent-<hex>``."""
    return f"{path.rsplit('/', 1)[0]}/vp-absent-{secrets.token_hex(6)}"


def _key_refused(spec: LiveInventory, s: _PathState, f: LiveFinding) -> bool:
    """An unknown route whose keyed answer was 401/403: asked again without the key, a
    different answer shows the route itself answered (vLLM 0.33's scale-out routes: 403
    with the key, the guard's 401 without)."""
    keyed = s.probes.get((f.method, True))
    return bool(spec.key) and f.verdict == "unknown" and keyed is not None and keyed.guard


def _with_guard(spec: LiveInventory, s: _PathState, f: LiveFinding) -> LiveFinding:
    """``guarded``: the answer without the key is 401/403 and (with a key) the keyed one differs."""
    if _key_refused(spec, s, f):
        with_key, without = s.probes[(f.method, True)], s.probes.get((f.method, False))
        sibling = s.siblings.get(f.method)
        if without is None or without.status is None or without.same(with_key, True) \
                or sibling is None or sibling.same(with_key, True):
            return f  # the same 401/403 with and without the key, or for an absent path too
        return LiveFinding(f.path, f.method, f.kind, "served", without.guard,
                       (*f.seen, f"no key: {f.method} {without.brief()} (the key changed the "
                                 f"answer; an absent path beside it: {sibling.brief()})"),
                       f.listed_by)
    if f.verdict != "served":
        return f
    m = _guard_method(spec, s, f.method)
    keyed = s.probes.get((m, True)) if m else None
    bare = s.probes.get((m, False)) if m and spec.key else keyed
    if m is None or bare is None or bare.status is None:
        return LiveFinding(f.path, f.method, f.kind, f.verdict, None, (*f.seen, "guard not measured"),
                       f.listed_by)
    if spec.key:
        # the key changed a 401/403 into something else (vLLM 0.33's scale-out routes answer
        # 403 with the key too, but not the same 403)
        guarded = bare.guard and keyed is not None and keyed.status is not None \
            and not bare.same(keyed, True)
        note = f"no key: {m} {bare.brief()}"
        if m != f.method and f.method != ANY_METHOD:
            note += f", with key {keyed.brief() if keyed else '?'}"
    else:
        guarded = bare.guard
        note = "" if (m == f.method and f"{m} {bare.brief()}" in f.seen) else f"guard: {m} {bare.brief()}"
    return LiveFinding(f.path, f.method, f.kind, f.verdict, guarded, (*f.seen, *((note,) if note else ())),
                   f.listed_by)


def _ws_finding(spec: LiveInventory, sender: _Sender, cal: Calibration, s: _PathState) -> LiveFinding:
    a = sender.websocket(s.cand.url_path)
    seen = [f"websocket upgrade {a.brief()}"]
    listed = tuple(sorted(s.cand.listed_by))
    ref = cal.websocket
    if a.status is not None and a.status != 101 and ref is not None and a.same(ref, True):
        verdict: Verdict = "absent"
    elif a.status is None or a.guard:
        verdict = "unknown"
    else:
        verdict = "served"
    guarded: bool | None = None
    if verdict == "served" and spec.key:
        bare = sender.websocket(s.cand.url_path, keyed=False)
        seen.append(f"no key {bare.brief()}")
        guarded = bare.guard
    elif verdict == "served":
        guarded = False
    return LiveFinding(s.cand.path, "GET", "websocket", verdict, guarded, tuple(seen), listed)


def _inventory(target: str, findings: Sequence[LiveFinding]) -> Inventory:
    """Served findings as routes: one per (path, kind, guard), methods merged."""
    groups: dict[tuple[str, RouteKind, bool], list[LiveFinding]] = defaultdict(list)
    for f in findings:
        if f.verdict == "served":
            groups[(f.path, f.kind, bool(f.guarded))].append(f)
    routes = []
    for (path, kind, guarded), fs in groups.items():
        listed = sorted({x for f in fs for x in f.listed_by})
        seen = "; ".join(dict.fromkeys(s for f in fs for s in f.seen))
        routes.append(Route(path=path, methods=tuple(sorted({f.method for f in fs})), kind=kind,
                            guarded=guarded, origin=f"{ORIGIN_PREFIX}: {seen} [{','.join(listed)}]"))
    return Inventory(source=Source(kind="live", target=target), routes=tuple(routes))
