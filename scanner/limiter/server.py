"""The limiter service: one loopback (or pod) port that speaks both doors.

A connection that opens with the HTTP/2 preface (``PRI * HTTP/2.0``: Envoy's gRPC client, h2c
with prior knowledge) is served as gRPC (scanner.limiter.rls) with the ``h2`` library; any other
is HTTP/1.1 (scanner.limiter.http_api) with ``h11``. One asyncio loop, one Redis client (a pool
of connections); many streams of one HTTP/2 connection are answered concurrently. The messages
are the generated protobuf classes (scanner.limiter.proto); the framing is here, not grpcio's
server, because one port serves both doors (the plan's one ``shared.limiter`` address for Envoy
and njs): grpcio's server owns its port and would need a second address in every layout, and it
is slower here (about 0.13 ms p50 and 140 µs CPU more per call: tests/limiter/bench_grpc.py).

gRPC framing: each message is 1 byte (compressed: 0 only, the service announces no encoding),
a 4-byte big-endian length and the protobuf bytes. An answer is HEADERS (``:status 200``,
``content-type: application/grpc``), one DATA message and trailers ``grpc-status: 0``; a
failure is a trailers-only answer with ``grpc-status`` and ``grpc-message``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h11
import hpack

from scanner.errors import LimiterCallError, StoreUnavailableError
from scanner.limiter import decide, http_api, proto, rls, store
from scanner.limiter.config import LimiterConfig

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GRPC_OK, GRPC_INVALID_ARGUMENT, GRPC_UNIMPLEMENTED, GRPC_UNAVAILABLE, GRPC_INTERNAL = 0, 3, 12, 14, 13
MAX_MESSAGE = 64 * 1024
GRPC_UNITS: dict[str, float] = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
READ = 65536
Ready = Callable[[str, int], None]
# a call naming no owner: the gRPC connection it came on owns its slots (store.Owners),
# ``conn:P:N`` (P: this process, so that no other limiter's connection has the name)
_CONNECTIONS = itertools.count(1)
_PROCESS = secrets.token_hex(4)


@dataclass(frozen=True)
class Service:
    redis: store.Client
    config: LimiterConfig
    outage: decide.Outage = field(default_factory=decide.Outage)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await _opening(reader)
            if first.startswith(PREFACE):
                await _Grpc(self, writer).serve(reader, first)
            else:
                await _serve_http1(self, reader, writer, first)
        except (ConnectionError, asyncio.IncompleteReadError, h2.exceptions.ProtocolError):
            pass
        except asyncio.CancelledError:   # shutting down: end quietly
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _opening(reader: asyncio.StreamReader) -> bytes:
    """The first bytes: as many as decide whether this is the HTTP/2 preface."""
    data = b""
    while len(data) < len(PREFACE) and PREFACE.startswith(data):
        chunk = await reader.read(READ)
        if not chunk:
            break
        data += chunk
    return data


def try_timeout(headers: Iterable[tuple[str | bytes, str | bytes]]) -> float | None:
    """How long the caller waits for this try, in seconds: Envoy's ``x-envoy-expected-rq-timeout-ms``
    (its retry policy's per-try timeout), else gRPC's ``grpc-timeout`` (``1000m``: digits and a
    unit, H M S m u n); None when neither is there or readable. A call answered after it has
    been given up, and sent again by Envoy, must not be charged twice: the limiter makes this its
    Redis deadline (scanner.limiter.store.call_timeout)."""
    found = {(k.decode() if isinstance(k, bytes) else k).lower(): v.decode() if isinstance(v, bytes) else v
             for k, v in headers}
    envoy = found.get("x-envoy-expected-rq-timeout-ms", "")
    if envoy.isdigit() and 0 < int(envoy) <= 10**7:
        return int(envoy) / 1000
    grpc = found.get("grpc-timeout", "")
    if 2 <= len(grpc) <= 9 and grpc[:-1].isdigit() and grpc[-1] in GRPC_UNITS:
        return int(grpc[:-1]) * GRPC_UNITS[grpc[-1]] or None
    return None


def grpc_message(text: str) -> str:
    """gRPC's percent-encoding of ``grpc-message``: bytes outside printable ASCII, and ``%``."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in text.encode())


# --- gRPC over h2c ----------------------------------------------------------------------------

# The header blocks of an OK answer, HPACK-encoded once: literal never-indexed fields (``:status``
# from the static table) leave the dynamic table alone, so the same bytes are right on every
# connection at any point (unless the peer resized the table: then the encoder itself runs).
OK_HEADERS: tuple[tuple[bytes, bytes], ...] = ((b":status", b"200"), (b"content-type", b"application/grpc"))
OK_TRAILERS: tuple[tuple[bytes, bytes], ...] = ((b"grpc-status", b"0"),)
_OK_BLOCKS: dict[tuple[tuple[bytes, bytes], ...], bytes] = {
    block: hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in block])
    for block in (OK_HEADERS, OK_TRAILERS)}


class _AnswerEncoder(hpack.Encoder):
    """h2's HPACK encoder with the OK answer's two blocks looked up, not encoded. The door's CPU
    per call, measured in-process (h2 client bytes in, answer out, the decision stubbed): 146 us;
    with this encoder and inbound headers unchecked 128 us; with _CallDecoder too 108 us."""

    def encode(self, headers: Iterable[hpack.HeaderTuple | tuple[bytes | str, bytes | str]
                                       | tuple[bytes | str, bytes | str, bool | None]]
               | dict[bytes | str, bytes | str], huffman: bool = True) -> bytes:
        if not self.header_table.resized and isinstance(headers, list):
            found = _OK_BLOCKS.get(tuple(headers))
            if found is not None:
                return found
        return super().encode(headers, huffman)


class _CallDecoder(hpack.Decoder):
    """h2's HPACK decoder remembering the header blocks that leave the dynamic table as it was: a
    proxy's calls, once its table holds their fields, are the same bytes every time (Envoy sends
    ``:path`` as a Huffman-coded literal each call, never indexed: about 20 us of Python per call,
    measured). A block that changes the table (an entry added, evicted,
    a size update) forgets them all, since indexed fields then point elsewhere."""

    KEEP = 16

    def __init__(self) -> None:
        super().__init__()
        self.known: dict[bytes, list[hpack.HeaderTuple]] = {}

    def _state(self) -> tuple[int, object, int]:
        entries = self.header_table.dynamic_entries
        return len(entries), entries[0] if entries else None, self.header_table.maxsize

    def decode(self, data: bytes, raw: bool = False) -> list[hpack.HeaderTuple]:
        found = self.known.get(data) if raw else None
        if found is not None:
            return list(found)
        length, first, size = self._state()
        headers = list(super().decode(data, raw))
        after = self._state()
        if after[0] != length or after[1] is not first or after[2] != size:
            self.known.clear()
        elif raw:
            if len(self.known) >= self.KEEP:
                self.known.clear()
            self.known[bytes(data)] = headers
        return list(headers)


class _Grpc:
    def __init__(self, service: Service, writer: asyncio.StreamWriter) -> None:
        self.service = service
        self.writer = writer
        # outbound headers are this module's own constants: h2's checks of them cost about a
        # third of its time per call (measured). Inbound ones are not checked either (about 15 us
        # a call, a tenth of the door's CPU): the door reads only ``:path`` (compared whole with the one
        # method it serves) and the two timeouts (try_timeout: digits only), and its callers are
        # the proxies alone (loopback, or a NetworkPolicy)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8", validate_outbound_headers=False,
            normalize_outbound_headers=False, validate_inbound_headers=False))
        self.conn.encoder = _AnswerEncoder()
        self.conn.decoder = _CallDecoder()
        self.conn.decoder.max_header_list_size = h2.connection.H2Connection.DEFAULT_MAX_HEADER_LIST_SIZE
        self.bodies: dict[int, bytearray] = {}
        self.paths: dict[int, str] = {}
        self.until: dict[int, float] = {}     # when the caller gives a stream's call up (monotonic)
        self.tasks: set[asyncio.Task[None]] = set()
        # the owners of the slots acquired here (the Envoy workers its calls name, else the
        # connection itself) are alive while it is open (a proxy killed mid-stream closes it:
        # their slots come back within the lease)
        self.owner = f"conn:{_PROCESS}:{next(_CONNECTIONS)}"
        self.named: set[str] = set()

    async def serve(self, reader: asyncio.StreamReader, first: bytes) -> None:
        self.conn.initiate_connection()
        data = first
        owners = store.session(self.service.redis).owners
        owners.opened(self.owner)
        peer_gone = False       # closed by the proxy (its owners are gone), not by this shutdown
        try:
            while data:
                self._events(self.conn.receive_data(data))
                out = self.conn.data_to_send()   # settings, pings, window updates: mostly nothing
                if out:
                    self.writer.write(out)
                    await self.writer.drain()
                data = await reader.read(READ)
            peer_gone = True
        except ConnectionError:
            peer_gone = True
            raise
        finally:
            for owner in (self.owner, *self.named):
                owners.closed(owner, peer_gone)
            for task in self.tasks:
                task.cancel()

    def _events(self, events: list[h2.events.Event]) -> None:
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                path = next((v for k, v in event.headers or () if k in (":path", b":path")), "")
                self.paths[event.stream_id] = path.decode() if isinstance(path, bytes) else path
                given = try_timeout(event.headers or ())
                if given is not None:
                    self.until[event.stream_id] = time.monotonic() + given
                self.bodies[event.stream_id] = bytearray()
            elif isinstance(event, h2.events.DataReceived):
                body = self.bodies.get(event.stream_id)
                if body is not None and len(body) + len(event.data) <= MAX_MESSAGE + 5:
                    body += event.data
                else:
                    self.bodies.pop(event.stream_id, None)
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                task = asyncio.create_task(self._answer(event.stream_id))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif isinstance(event, h2.events.StreamReset):
                self.bodies.pop(event.stream_id, None)
                self.paths.pop(event.stream_id, None)
                self.until.pop(event.stream_id, None)

    async def _answer(self, stream: int) -> None:
        path, body = self.paths.pop(stream, ""), self.bodies.pop(stream, None)
        status, message, payload = await self._call(path, body, self.until.pop(stream, None))
        try:
            if status == GRPC_OK:
                self.conn.send_headers(stream, list(OK_HEADERS))
                self.conn.send_data(stream, b"\x00" + len(payload).to_bytes(4, "big") + payload)
                self.conn.send_headers(stream, list(OK_TRAILERS), end_stream=True)
            else:
                self.conn.send_headers(stream, [(":status", "200"), ("content-type", "application/grpc"),
                                                ("grpc-status", str(status)),
                                                ("grpc-message", grpc_message(message))], end_stream=True)
            self.writer.write(self.conn.data_to_send())
        except (h2.exceptions.ProtocolError, ConnectionError):   # the stream or connection is gone
            pass

    async def _call(self, path: str, body: bytearray | None, until: float | None) -> tuple[int, str, bytes]:
        if path != rls.SERVICE_PATH:
            return GRPC_UNIMPLEMENTED, "unknown method", b""
        if body is None or len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            return GRPC_INVALID_ARGUMENT, "one uncompressed message of at most 64 KiB", b""
        try:
            request = proto.decode_request(bytes(body[5:]))
            answer = await rls.should_rate_limit(self.service.redis, self.service.config, request,
                                                 self._owner(request), until)
            self.service.outage.answered()
            return GRPC_OK, "", answer.SerializeToString()
        except StoreUnavailableError:
            # the proxy's own share decides (on_unavailable: local, the outage old enough)
            zones = [proto.entry(d, "zone") or "" for d in request.descriptors]
            if self.service.outage.local(self.service.config, zones):
                return GRPC_OK, "", rls.unavailable(request).SerializeToString()
            return GRPC_UNAVAILABLE, decide.UNAVAILABLE, b""
        except (LimiterCallError, proto.ProtoError) as exc:
            return GRPC_INVALID_ARGUMENT, str(exc)[:200], b""

    def _owner(self, request: proto.Request) -> str:
        """The owner of the call's slots: the Envoy worker it names (alive while a connection
        that carried it is open), else this connection."""
        named = rls.owner(request)
        if not named:
            return self.owner
        if named not in self.named:
            self.named.add(named)
            store.session(self.service.redis).owners.opened(named)
        return named


# --- HTTP/1.1 -----------------------------------------------------------------------------------

async def _serve_http1(service: Service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       first: bytes) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_MESSAGE)
    conn.receive_data(first)
    while True:
        request = await _request(conn, reader)
        if request is None:
            return
        method, path, body = request
        if not method:
            answer = http_api.Answer(400, {"error": "not an HTTP/1.1 request"})
        elif body is None:
            answer = http_api.Answer(413, {"error": f"bodies are at most {http_api.MAX_BODY} bytes"})
        else:
            answer = await http_api.handle(service.redis, service.config, method, path, body, service.outage)
        data = answer.encoded()
        last = not method or body is None
        headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
        if last:
            headers.append(("connection", "close"))
        try:
            writer.write(conn.send(h11.Response(status_code=answer.status, headers=headers))
                         + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
            await writer.drain()
            if last or conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            return


async def _request(conn: h11.Connection,
                   reader: asyncio.StreamReader) -> tuple[str, str, bytes | None] | None:
    """(method, path, body) of the next request: method "" for one that is not HTTP/1.1, body None
    when it is over MAX_BODY; None at the end of the connection."""
    method = path = ""
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            answerable = conn.our_state in (h11.SEND_RESPONSE, h11.IDLE)
            return ("", "", b"") if answerable else None
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(READ))
        elif isinstance(event, h11.Request):
            method, path = event.method.decode(), event.target.decode("latin-1").split("?", 1)[0]
        elif isinstance(event, h11.Data):
            if len(body) + len(event.data) > http_api.MAX_BODY:
                return method, path, None
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return method, path, bytes(body)
        else:   # ConnectionClosed, PAUSED
            return None


async def serve(service: Service, host: str, port: int,
                ready: Ready | None = None) -> None:
    """Serve until cancelled; ``ready(host, port)`` once listening (port 0: the one chosen)."""
    handlers: set[asyncio.Task[None]] = set()

    def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a plain callback owning its task: asyncio 3.11 asks a coroutine callback's task for
        # its exception when done, which raises (and prints a traceback) for a task cancelled
        # before it first ran, as every open connection is on shutdown (SIGTERM, Ctrl-C)
        task = asyncio.get_running_loop().create_task(service.connection(reader, writer))
        handlers.add(task)
        task.add_done_callback(handlers.discard)

    server = await asyncio.start_server(accept, host, port, limit=READ)
    bound = server.sockets[0].getsockname()
    if ready is not None:
        ready(str(bound[0]), int(bound[1]))
    renewer = asyncio.get_running_loop().create_task(renew_leases(service))
    try:
        async with server:
            await server.serve_forever()
    finally:
        renewer.cancel()


async def renew_leases(service: Service) -> None:
    """The leases of the slots of requests in flight, renewed at once (a restarted limiter carries
    on its predecessor's before they lapse) and then every third of a lease until released
    (scanner.limiter.store.renew: from the leases' facts in Redis, whoever admitted them): a slot
    outlives its lease only while its request has not ended and its proxy may be alive
    (store.Owners); a Redis failure is retried next time."""
    lease = service.config.slot_lease_s
    while True:
        with contextlib.suppress(StoreUnavailableError):
            await store.renew(service.redis, lease)
        await asyncio.sleep(lease / 3)
