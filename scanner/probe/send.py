"""Sending cases: HTTP/1.1 written byte for byte over asyncio streams (keep-alive per vantage),
or through an injected httpx transport (tests).

httpx collapses dot segments (``/v1/../invocations`` goes out as ``/invocations``), so
requests are written verbatim over a stream: variants on a fresh connection each, the rest
on kept-alive connections (also several times faster than httpx). Every send is bounded by
the per-request timeout; every failure becomes an attempt with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import h11
import httpx

from scanner.errors import UsageError
from scanner.probe import grpc_call, h2c
from scanner.probe.cases import Case
from scanner.probe.classify import classify, error_reason, grpc_status
from scanner.probe.interface import Attempt, Credential, Target, TransportFactory, Vantage
from scanner.probe.verdict import TLS_REFUSED
from scanner.secrets import scrub

_MAX_HEAD = 64 * 1024
ANSWER_KEPT = 8192             # bytes of an answer body kept for a case with ``answer``
READ_KEPT = 65536              # ... for a case with ``read_answer`` (a JSON answer read whole)
# A kept-alive connection idle longer than this is not used again: below the keep-alive timeouts
# servers commonly have (uvicorn 5 s; NGINX 75 s), so the server has not closed it meanwhile.
KEEP_IDLE_S = 4.0
H2_SPOKEN = "the listener answered in HTTP/2 (h2c prior knowledge accepted)"
T = TypeVar("T")


def ssl_context(target: Target, cert: tuple[str, str] | None = None, tls12: bool = False) -> ssl.SSLContext:
    """Verification always on: the CA bundle given, else the system store. Never off. ``cert``:
    the client certificate and key a case presents (auth "cert") instead of ``--client-cert``."""
    try:
        ctx = ssl.create_default_context(cafile=target.ca_bundle) if target.ca_bundle \
            else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--ca-bundle {target.ca_bundle}: cannot load: {exc}") from None
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            ctx.load_cert_chain(*cert)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--cert {cert[0]}: cannot load the certificate or its key: {exc}") from None
    elif target.client_cert:
        try:
            ctx.load_cert_chain(target.client_cert, target.client_key)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--client-cert/--client-key: cannot load: {exc}") from None
    return ctx


# What the tls check offers a listener, each alone: (lowest version, highest version, OpenSSL
# cipher string). Security level 0 lets this host's OpenSSL 3 offer TLS 1.0 / 1.1 and the suites.
OFFERS: dict[str, tuple[ssl.TLSVersion, ssl.TLSVersion, str]] = {
    "TLSv1": (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1, "ALL:@SECLEVEL=0"),
    "TLSv1.1": (ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_1, "ALL:@SECLEVEL=0"),
    # broken suites only (3DES, RC4, DES, no encryption, export, MD5), at TLS 1.2: never in a
    # default list of OpenSSL's HIGH or BoringSSL's
    "weak ciphers": (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2,
                     "3DES:RC4:DES:eNULL:EXPORT:MD5:!aNULL:@SECLEVEL=0"),
}
CANNOT_OFFER = "this host's TLS library cannot offer it"
_CLIENT_SIDE = ("NO_PROTOCOLS_AVAILABLE", "NO_CIPHERS_AVAILABLE", "NO_CIPHER_MATCH", "UNSUPPORTED_PROTOCOL")


def offer_context(target: Target, offer: str) -> ssl.SSLContext:
    """A verifying context (as :func:`ssl_context`) that offers only ``OFFERS[offer]``."""
    low, high, ciphers = OFFERS[offer]
    ctx = ssl_context(target)
    with warnings.catch_warnings():   # TLS 1.0 / 1.1 are deprecated: offering them is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version, ctx.maximum_version = low, high
    ctx.set_ciphers(ciphers)
    return ctx


def _pool(vantage: Vantage, cred: Credential) -> str:
    """Connections are kept per vantage and per client certificate: a TLS connection carries the
    certificate it was opened with, so a case presenting another (or none) never reuses it."""
    return f"{vantage.name}\0{cred.cert_file}" if cred.kind == "cert" else vantage.name


class Sender:
    """One httpx client per vantage; raw cases over asyncio streams bound to the vantage."""

    def __init__(self, target: Target, timeout: float, factory: TransportFactory | None = None,
                 client: str = "stream") -> None:
        self.target = target
        self.timeout = timeout
        self.factory = factory
        # httpx for ordinary requests when asked or when a transport is injected; raw variants
        # go over streams unless a transport is injected (tests have no sockets)
        self.use_httpx = factory is not None or client == "httpx"
        self._ctx = ssl_context(target) if target.url.scheme == "https" else None
        self._cert_ctx: dict[tuple[str, str, str], ssl.SSLContext] = {}
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._idle: dict[str, list[_Conn]] = {}
        url = target.url
        self._url = url
        self._host = url.netloc.decode("ascii")
        self._prefix = url.raw_path.rstrip(b"/").decode()
        self._port = url.port or (443 if url.scheme == "https" else 80)

    def _context(self, cred: Credential) -> ssl.SSLContext | None:
        """The TLS context a case's credential connects with (None: plain HTTP)."""
        if self._ctx is None or cred.kind != "cert":
            return self._ctx
        pair = (cred.cert_file, cred.key_file)
        key = (*pair, "1.2" if cred.refused_in_handshake else "")
        if key not in self._cert_ctx:
            self._cert_ctx[key] = ssl_context(self.target, pair, cred.refused_in_handshake)
        return self._cert_ctx[key]

    def _client(self, vantage: Vantage, cred: Credential) -> httpx.AsyncClient:
        pool = _pool(vantage, cred)
        client = self._clients.get(pool)
        if client is None:
            transport = self.factory(vantage) if self.factory else httpx.AsyncHTTPTransport(
                local_address=vantage.address, verify=self._context(cred) or True, retries=0)
            client = httpx.AsyncClient(transport=transport, timeout=self.timeout,
                                       follow_redirects=False, trust_env=False)
            self._clients[pool] = client
        return client

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    def timeout_for(self, case: Case) -> float:
        """The per-request timeout; a request the witness holds may also wait in the proxy's queue."""
        return self.timeout + 2 * case.hold_ms / 1000

    async def _send_dribbled(self, case: Case) -> tuple[int, Mapping[str, str], bytes]:
        """A request held open by the client (``Case.dribble``): its head and all of its body but
        the last byte, then the last byte after ``hold_ms``, unless the proxy answered first (a
        refusal it makes on the head: NGINX's limit_conn counts a request from its head on). On a
        fresh connection, closed after the answer: never more than one per case, bounded by
        timeout_for."""
        data = raw_request(case, self._host, self._prefix)
        conn = await self._connect(case.vantage, case.credential)
        try:
            await conn.write(data[:-1])
            try:
                early = await _bounded(conn.reader.read(65536), case.hold_ms / 1000)
            except TimeoutError:
                early = None
            if early is None:
                await conn.write(data[-1:])
            else:
                conn.h11.receive_data(early)
                conn.eof = not early
            status, headers, _keep = await conn.response(case.send_method)
            return status, headers, conn.body
        finally:
            conn.close()

    async def _send_streamed(self, case: Case, start: float) -> tuple[int, Mapping[str, str], bytes, float]:
        """A stream held open by the client (``Case.stream_hold``): the whole request sent, its
        answer read until ``hold_ms`` after ``start``, then the connection closed. Also the
        milliseconds its answer was still coming from the upstream when the client closed it,
        counted from its head (0: it ended first, or no answer came): a stream's head comes from
        the upstream, so it was being answered there that long (Envoy counts a request in flight
        only once forwarded: the held body of Case.dribble never reaches its circuit breaker)."""
        conn = await self._connect(case.vantage, case.credential)
        deadline = start + case.hold_ms / 1000
        try:
            await conn.write(raw_request(case, self._host, self._prefix))
            status, headers = await conn.head(case.send_method)
            head_at = time.monotonic()   # a head only after the hold (queued) was not being answered in it
            still = status < 300 and head_at < deadline and await conn.read_until(deadline)
            return status, headers, conn.body, (time.monotonic() - head_at) * 1000 if still else 0.0
        finally:
            conn.close()

    async def _offer(self, case: Case, start: float) -> Attempt:
        """A handshake offering only ``case.tls_offer``, then the case's request if it completed:
        the error TLS_REFUSED when the listener refused it, CANNOT_OFFER when this host's TLS
        library would not even offer it."""
        try:
            ctx = offer_context(self.target, case.tls_offer)
        except ssl.SSLError as exc:
            return _attempt(case, start, error=f"{CANNOT_OFFER}: {exc.reason or exc}")
        local = (case.vantage.address, 0) if case.vantage.address else None
        try:
            reader, writer = await _bounded(asyncio.open_connection(
                self._url.host, self._port, ssl=ctx, server_hostname=self._url.host, local_addr=local,
                limit=_MAX_HEAD), self.timeout)
        except ssl.SSLError as exc:
            why = exc.reason or type(exc).__name__
            said = CANNOT_OFFER if why in _CLIENT_SIDE else TLS_REFUSED
            return _attempt(case, start, error=f"{said}: {why}")
        except ConnectionResetError:
            return _attempt(case, start, error=f"{TLS_REFUSED}: connection reset in the handshake")
        except Exception as exc:  # every failure is data
            return _attempt(case, start, error=scrub(error_reason(exc), _secrets(case)))
        conn = _Conn(reader, writer)
        try:
            await conn.write(raw_request(case, self._host, self._prefix))
            status, headers, _keep = await _bounded(conn.response(case.send_method), self.timeout)
        except Exception as exc:  # the handshake completed: that is the fact, whatever follows
            return _attempt(case, start, error=f"handshake completed; then {error_reason(exc)}")
        finally:
            conn.close()
        return _attempt(case, start, status=status, headers=headers)

    async def send(self, case: Case) -> Attempt:
        start = time.monotonic()
        if case.tls_offer:
            return await self._offer(case, start)
        try:
            if case.grpc_port:
                status, headers = await grpc_call.call(
                    self._url.host, case.grpc_port, case.target,
                    (*case.credential.headers().items(), *case.headers), case.vantage.address,
                    self.timeout_for(case))
                return _attempt(case, start, status=status, headers=headers)
            if case.h2c:
                status, headers, h2 = await _bounded(self._send_h2c(case), self.timeout_for(case))
                a = _attempt(case, start, status=status, headers=headers)
                return replace(a, error=H2_SPOKEN) if h2 else a
            if case.stream_hold and self.factory is None:
                status, headers, body, open_ms = await _bounded(self._send_streamed(case, start),
                                                                self.timeout_for(case))
                a = _attempt(case, start, status=status, headers=headers)
                return replace(a, open_ms=round(open_ms, 2))
            if case.dribble and self.factory is None:
                status, headers, body = await _bounded(self._send_dribbled(case), self.timeout_for(case))
            elif not self.use_httpx or (case.raw and self.factory is None):
                status, headers, body = await _bounded(self._send_raw(case), self.timeout_for(case))
            else:
                status, headers, body = await self._send_httpx(case)
        except Exception as exc:  # every failure is data
            return _attempt(case, start, error=scrub(error_reason(exc), _secrets(case)))
        a = _attempt(case, start, status=status, headers=headers)
        kept = ANSWER_KEPT if case.answer else READ_KEPT if case.read_answer else 0
        return replace(a, answer_body=body[:kept].decode("latin-1")) if kept else a

    async def send_many(self, cases: Sequence[Case]) -> list[Attempt]:
        """Several cases: pipelined per vantage on one kept-alive connection where eligible."""
        if self.use_httpx or len(cases) < 2:
            return [await self.send(c) for c in cases]
        groups: dict[str, list[int]] = {}
        out: list[Attempt | None] = [None] * len(cases)
        for i, c in enumerate(cases):
            if _pipelinable(c):
                groups.setdefault(_pool(c.vantage, c.credential), []).append(i)
            else:
                out[i] = await self.send(c)
        for idx in groups.values():
            for i, a in zip(idx, await self._send_pipelined([cases[i] for i in idx]), strict=True):
                out[i] = a
        return [a for a in out if a is not None]

    async def _send_pipelined(self, cases: Sequence[Case]) -> list[Attempt]:
        """Write all requests at once, read the answers in order; resend the unanswered singly."""
        if len(cases) == 1:
            return [await self.send(cases[0])]
        got: list[tuple[int, dict[str, str], float]] = []
        start = time.monotonic()
        with contextlib.suppress(Exception):  # what got no answer is sent again below
            await _bounded(self._pipeline(cases, got), self.timeout)
        out = []
        for c, (status, headers, at) in zip(cases, got, strict=False):
            out.append(_attempt(c, start, status=status, headers=headers, end=at))
        for c in cases[len(got):]:
            out.append(await self.send(c))
        return out

    def _reuse(self, vantage: Vantage, cred: Credential) -> _Conn | None:
        """A kept-alive connection of ``vantage`` (and ``cred``'s certificate) the server has not
        closed (nor may have: idle at most KEEP_IDLE_S); None: open a fresh one."""
        idle = self._idle.setdefault(_pool(vantage, cred), [])
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _keep(self, vantage: Vantage, cred: Credential, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(_pool(vantage, cred), []).append(conn)

    async def _pipeline(self, cases: Sequence[Case], got: list[tuple[int, dict[str, str], float]]) -> None:
        first = cases[0]
        conn = (self._reuse(first.vantage, first.credential)
                or await self._connect(first.vantage, first.credential))
        keep, reuse = False, True
        try:
            await conn.write(b"".join(raw_request(c, self._host, self._prefix, keep_alive=True)
                                      for c in cases))
            for c in cases:
                status, headers, keep = await conn.response(c.send_method)
                got.append((status, headers, time.monotonic()))
                reuse = reuse and reusable(c, status)
                if not keep:
                    break
        finally:
            if keep and reuse:
                self._keep(first.vantage, first.credential, conn)
            else:
                conn.close()

    async def _send_httpx(self, case: Case) -> tuple[int, Mapping[str, str], bytes]:
        base = self.target.url
        target = case.target
        if target.startswith(("http://", "https://")):
            target = httpx.URL(target).raw_path.decode("ascii")
        path, _, query = target.partition("?")
        url = base.copy_with(raw_path=(base.raw_path.rstrip(b"/") + path.encode()
                                       + (b"?" + query.encode() if query else b"")))
        content: bytes | None = case.body
        client = self._client(case.vantage, case.credential)
        for retry in (True, False):
            # A kept-alive connection the server closed meanwhile fails before any answer:
            # send once more on a fresh one (every probe request is non-acting).
            req = client.build_request(case.send_method, url, headers=case.all_headers(),
                                       content=_chunks(case.body) if case.chunked and case.body else content)
            try:
                resp = await client.send(req)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
                if retry:
                    continue
                raise
            body = await resp.aread() if case.answer or case.read_answer else b""
            await resp.aclose()
            return resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, body
        raise AssertionError("unreachable")

    async def _send_raw(self, case: Case) -> tuple[int, Mapping[str, str], bytes]:
        """HTTP/1.1 over asyncio streams: keep-alive per vantage, a fresh connection for variants.
        A connection is reused only while the server cannot have closed it (:meth:`_reuse`), and
        a failure is never sent again here: whether the request reached the upstream is then not
        known (the runner may send the case again, as a recorded attempt)."""
        data = raw_request(case, self._host, self._prefix, keep_alive=not case.raw)
        conn = None if case.raw else self._reuse(case.vantage, case.credential)
        if conn is None:
            conn = await self._connect(case.vantage, case.credential)
        try:
            await conn.write(data)
            status, headers, keep = await conn.response(case.send_method)
        except (ConnectionError, h11.ProtocolError):
            conn.close()
            raise
        if keep and not case.raw and reusable(case, status):
            self._keep(case.vantage, case.credential, conn)
        else:
            conn.close()
        return status, headers, conn.body

    async def _send_h2c(self, case: Case) -> tuple[int, Mapping[str, str], bool]:
        """One request as HTTP/2 with prior knowledge, on a fresh connection: (status, headers,
        did the listener speak HTTP/2). An HTTP/1.1 answer (the preface line refused) is read
        as any other; of an HTTP/2 one only ``:status`` (0 when not read), no headers."""
        target = case.target if case.target.startswith("/") else "/"
        conn = await self._connect(case.vantage, case.credential)
        try:
            await conn.write(h2c.request(case.send_method, self._prefix + target, self._host,
                                         case.all_headers(), case.body))
            head = await conn.reader.read(h2c.FRAME_HEAD)
            while head and len(head) < h2c.FRAME_HEAD:
                more = await conn.reader.read(h2c.FRAME_HEAD - len(head))
                if not more:
                    break
                head += more
            if not head:
                raise ConnectionError("connection closed without an answer to the HTTP/2 preface")
            if h2c.is_settings(head):
                data = head
                while not h2c.answered(data) and len(data) < _MAX_HEAD:
                    more = await conn.reader.read(65536)
                    if not more:
                        break
                    data += more
                return h2c.answer_status(data) or 0, {}, True
            conn.h11.receive_data(head)
            status, headers, _keep = await conn.response(case.send_method)
            return status, headers, False
        finally:
            conn.close()

    async def _connect(self, vantage: Vantage, cred: Credential) -> _Conn:
        url = self._url
        local = (vantage.address, 0) if vantage.address else None
        ctx = self._context(cred)
        reader, writer = await asyncio.open_connection(
            url.host, self._port, ssl=ctx, server_hostname=url.host if ctx else None,
            local_addr=local, limit=_MAX_HEAD)
        return _Conn(reader, writer)


class _Conn:
    """One connection: requests are written byte for byte (httpx would normalise their targets),
    responses are read by h11 (told the method of each request, so a HEAD has no body), one
    after the other, pipelined or not."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        self.eof = False
        self.body = b""          # the last answer's body, its first READ_KEPT bytes
        self.idle_since = 0.0    # when it was last put back to be reused

    def usable(self) -> bool:
        """May it carry another request: open both ways, nothing unread, idle at most KEEP_IDLE_S?"""
        return (not self.eof and not self.reader.at_eof() and not self.writer.is_closing()
                and not self.reader._buffer   # type: ignore[attr-defined]
                and time.monotonic() - self.idle_since <= KEEP_IDLE_S)

    async def write(self, data: bytes) -> None:
        """A server may answer before reading all of a large body (a 413) and reset the
        connection: if the write fails but an answer had arrived, that answer stands."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError:
            received = bytes(self.reader._buffer)   # type: ignore[attr-defined]
            if not received:                        # nothing came back: a real failure
                raise
            self.h11.receive_data(received)         # what the server said before the reset
            self.h11.receive_data(b"")
            self.eof = True

    async def response(self, method: str) -> tuple[int, dict[str, str], bool]:
        """(status, headers in lower case, does the connection stay open) of the next answer."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        self.h11.send(h11.Request(method=method, target="/", headers=[("Host", "probe")]))
        self.h11.send(h11.EndOfMessage())
        status, headers = 0, {}
        self.body = b""
        while True:
            event = await self._event()
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data) and len(self.body) < READ_KEPT:
                self.body += bytes(event.data[:READ_KEPT - len(self.body)])
            elif isinstance(event, h11.EndOfMessage):
                keep = self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE and not self.eof
                return status, headers, keep
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("connection closed without an answer")

    async def head(self, method: str) -> tuple[int, dict[str, str]]:
        """(status, headers in lower case) of the next answer, its body left to read."""
        self.h11.send(h11.Request(method=method, target="/", headers=[("Host", "probe")]))
        self.h11.send(h11.EndOfMessage())
        self.body = b""
        while True:
            event = await self._event()
            if isinstance(event, h11.Response):
                return event.status_code, {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
            if isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("connection closed without an answer")

    async def read_until(self, deadline: float) -> bool:
        """Read the answer's body (its first READ_KEPT bytes kept) until it ends (False) or the
        monotonic ``deadline`` passes with more still to come (True)."""
        while True:
            try:
                event = await _bounded(self._event(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return True
            if isinstance(event, h11.Data) and len(self.body) < READ_KEPT:
                self.body += bytes(event.data[:READ_KEPT - len(self.body)])
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return False

    async def _event(self) -> Any:
        """The next h11 event, reading from the connection as needed."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.eof:
                raise ConnectionError("connection closed without a complete answer")
            data = await self.reader.read(65536)
            if not data:
                self.eof = True
            self.h11.receive_data(data)

    def close(self) -> None:
        self.writer.close()


async def _bounded(coro: Coroutine[Any, Any, T], seconds: float) -> T:
    """``coro`` within ``seconds`` (asyncio.timeout where available: cheaper than wait_for)."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:
        return await asyncio.wait_for(coro, seconds)
    async with timeout(seconds):
        return await coro


def raw_request(case: Case, host: str, prefix: str = "", keep_alive: bool = False) -> bytes:
    """The request bytes for ``case``: its target verbatim (origin- or absolute-form); the
    case's own ``Host`` header, if it has one, in place of the target's."""
    target = case.target if case.target.startswith(("http://", "https://")) else prefix + case.target
    headers = case.all_headers()
    host = next((v for k, v in headers.items() if k.lower() == "host"), host)
    headers = {k: v for k, v in headers.items() if k.lower() != "host"}
    lines = [f"{case.send_method} {target} HTTP/1.1", f"Host: {host}"]
    if not any(k.lower() == "connection" for k in headers):
        lines.append(f"Connection: {'keep-alive' if keep_alive else 'close'}")
    body = case.body or b""
    if case.body is not None:
        if case.chunked:
            headers["Transfer-Encoding"] = "chunked"
            body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        else:
            headers["Content-Length"] = str(len(body))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _chunks(body: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i:i + size]


def request_line(case: Case) -> str:
    if case.grpc_port:
        return f"{case.send_method} {case.target} gRPC (HTTP/2, port {case.grpc_port})"
    return f"{case.send_method} {case.target} {'HTTP/2 (h2c prior knowledge)' if case.h2c else 'HTTP/1.1'}"


def _secrets(case: Case) -> tuple[str, ...]:
    """An error message never carries the key (a client library may quote a header)."""
    return (case.credential.secret,) if case.credential.secret else ()


def reusable(case: Case, status: int) -> bool:
    """May the connection carry another request after ``status`` answered ``case``? Not after an
    error answer to a request with a body: the server may have answered before reading all of it
    and close the connection after its answer (NGINX discards or lingers on what is left). Not
    after a server error: uvicorn closes the connection once the app has raised, even when the
    500 it sent was complete and said nothing of closing (the engine-less vLLM on GET
    /is_sleeping), so a request sent on it before the close is seen would be lost."""
    return not (status >= 500 or (case.body is not None and status >= 400))


def _pipelinable(case: Case) -> bool:
    return (not case.raw and not case.h2c and not case.grpc_port and not case.chunked and not case.hold_ms
            and not case.answer and not case.read_answer and len(case.body or b"") <= 65536)


def _attempt(case: Case, start: float, *, status: int | None = None, error: str = "",
             headers: Mapping[str, str] | None = None, end: float | None = None) -> Attempt:
    if status is not None and headers:
        status = grpc_status(status, headers)
    layer, outcome, marker, reason = classify(status, headers or {}) if status is not None \
        else ("none", "error", "", "")
    return Attempt(
        check=case.check, method=case.method, path=case.path, request_line=request_line(case),
        credential=case.credential.label, fingerprint=case.credential.fingerprint,
        vantage=case.vantage.name, expected=case.expected, status=status, error=error,
        layer=layer, decision=marker, outcome=outcome, reason=reason,
        latency_ms=round(((end or time.monotonic()) - start) * 1000, 2),
        note=_noted(case.note, status, headers), sent_at=start)


def _noted(note: str, status: int | None, headers: Mapping[str, str] | None) -> str:
    """A 429 that says when to come back (a token budget's Retry-After) keeps that in the note."""
    retry = (headers or {}).get("retry-after", "") if status == 429 else ""
    return f"{note}; Retry-After {retry[:16]}" if retry else note


def skipped(case: Case, why: str) -> Attempt:
    return Attempt(
        check=case.check, method=case.method, path=case.path, request_line=request_line(case),
        credential=case.credential.label, fingerprint=case.credential.fingerprint,
        vantage=case.vantage.name, expected=case.expected, error=f"skipped: {why}",
        outcome="skipped", note=case.note)
