"""One gRPC-shaped call over HTTP/2 cleartext (prior knowledge), as a gRPC client sends it:
``POST /package.Service/Method``, ``content-type: application/grpc``, ``te: trailers``, one
empty length-prefixed message. The answer is its ``:status`` and every header and trailer (lower
case names): a gRPC reply carries ``grpc-status`` in its trailers (or in a trailers-only reply).

HTTP/2 framing and HPACK are the ``h2`` library's; the socket is asyncio's, bound to the
vantage's source address.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import h2.config
import h2.connection
import h2.events

# an empty protobuf message: not compressed (0), length 0
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
_MAX_READ = 1 << 20


class GrpcCallError(Exception):
    """The call got no HTTP/2 answer (the connection closed or was reset first)."""


async def call(host: str, port: int, path: str, headers: Sequence[tuple[str, str]] = (),
               local_address: str | None = None, timeout: float = 10.0,
               message: bytes = EMPTY_MESSAGE) -> tuple[int, Mapping[str, str]]:
    """(HTTP status, headers and trailers) of one call; GrpcCallError without an answer."""
    return await asyncio.wait_for(_call(host, port, path, headers, local_address, message), timeout)


async def _call(host: str, port: int, path: str, headers: Sequence[tuple[str, str]],
                local_address: str | None, message: bytes) -> tuple[int, Mapping[str, str]]:
    reader, writer = await asyncio.open_connection(
        host, port, local_addr=(local_address, 0) if local_address else None)
    try:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                     header_encoding="utf-8"))
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", authority), ("content-type", "application/grpc"),
                                   ("te", "trailers"), *[(k.lower(), v) for k, v in headers]])
        conn.send_data(stream, message, end_stream=True)
        writer.write(conn.data_to_send())
        await writer.drain()
        return await _answer(conn, stream, reader, writer)
    finally:
        writer.close()


async def _answer(conn: h2.connection.H2Connection, stream: int, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> tuple[int, Mapping[str, str]]:
    status, seen, read = 0, {}, 0
    while read < _MAX_READ:
        data = await reader.read(65536)
        if not data:
            break
        read += len(data)
        for event in conn.receive_data(data):
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)) \
                    and event.stream_id == stream:
                for name, value in event.headers:
                    key = name.decode() if isinstance(name, bytes) else name
                    val = value.decode() if isinstance(value, bytes) else value
                    if key == ":status":
                        status = int(val)
                    else:
                        seen[key] = val
            elif isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) \
                    and event.stream_id == stream:
                if not status:
                    raise GrpcCallError("the stream was reset before any answer")
                return status, seen
            elif isinstance(event, h2.events.ConnectionTerminated):
                if status:
                    return status, seen
                raise GrpcCallError(f"the connection was closed (HTTP/2 GOAWAY, error {event.error_code})")
        pending = conn.data_to_send()
        if pending:
            writer.write(pending)
            await writer.drain()
    if status:
        return status, seen
    raise GrpcCallError("the connection closed before an HTTP/2 answer")
