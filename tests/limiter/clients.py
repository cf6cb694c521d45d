"""Test clients of the limiter service: gRPC over one h2c connection, JSON over keep-alive HTTP/1.1."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events

from scanner.limiter import proto, rls


@dataclass(frozen=True)
class GrpcAnswer:
    grpc_status: int
    message: str
    response: proto.Response | None


@dataclass
class GrpcClient:
    """Unary calls one after the other on one HTTP/2 connection (blocking sockets: simple to time)."""

    host: str
    port: int
    timeout: float = 5.0
    sock: socket.socket = field(init=False)
    conn: h2.connection.H2Connection = field(init=False)

    def __post_init__(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                         header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def raw(self, path: str, body: bytes) -> GrpcAnswer:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                        (":authority", f"{self.host}:{self.port}"),
                                        ("content-type", "application/grpc"), ("te", "trailers")])
        self.conn.send_data(stream, body, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        headers: dict[str, str] = {}
        data = bytearray()
        for _ in range(1000):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            for event in self.conn.receive_data(chunk):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    headers.update({str(k): str(v) for k, v in event.headers})
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    self.sock.sendall(self.conn.data_to_send())
                    status = int(headers.get("grpc-status", "-1"))
                    response = proto.Response.FromString(bytes(data[5:])) if status == 0 else None
                    return GrpcAnswer(status, headers.get("grpc-message", ""), response)
            self.sock.sendall(self.conn.data_to_send())
        raise TimeoutError("no answer")

    def many(self, requests: list[proto.Request]) -> list[GrpcAnswer]:
        """Every request on its own stream, all sent before any answer is read (as Envoy multiplexes)."""
        streams = []
        for request in requests:
            stream = self.conn.get_next_available_stream_id()
            message = request.SerializeToString()
            self.conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", rls.SERVICE_PATH),
                                            (":authority", f"{self.host}:{self.port}"),
                                            ("content-type", "application/grpc"), ("te", "trailers")])
            self.conn.send_data(stream, b"\x00" + len(message).to_bytes(4, "big") + message, end_stream=True)
            streams.append(stream)
        self.sock.sendall(self.conn.data_to_send())
        headers: dict[int, dict[str, str]] = {s: {} for s in streams}
        data: dict[int, bytearray] = {s: bytearray() for s in streams}
        done: set[int] = set()
        for _ in range(10000):
            if done == set(streams):
                break
            for event in self.conn.receive_data(self.sock.recv(65536)):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    headers[event.stream_id].update({str(k): str(v) for k, v in event.headers})
                elif isinstance(event, h2.events.DataReceived):
                    data[event.stream_id] += event.data
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    done.add(event.stream_id)
            self.sock.sendall(self.conn.data_to_send())
        return [GrpcAnswer(int(headers[s].get("grpc-status", "-1")), headers[s].get("grpc-message", ""),
                           proto.Response.FromString(bytes(data[s][5:])) if headers[s].get("grpc-status") == "0"
                           else None) for s in streams]

    def call(self, request: proto.Request) -> GrpcAnswer:
        message = request.SerializeToString()
        return self.raw(rls.SERVICE_PATH, b"\x00" + len(message).to_bytes(4, "big") + message)

    def close(self) -> None:
        self.sock.close()


@dataclass
class HttpClient:
    host: str
    port: int
    conn: http.client.HTTPConnection = field(init=False)

    def __post_init__(self) -> None:
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, body: object) -> tuple[int, dict[str, object]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.conn.request("POST", path, data, {"content-type": "application/json"})
        reply = self.conn.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")

    def get(self, path: str) -> tuple[int, dict[str, object]]:
        self.conn.request("GET", path)
        reply = self.conn.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")

    def close(self) -> None:
        self.conn.close()


def descriptor(zone: str, key: str, *extra: tuple[str, str], hits: int | None = None,
               key_name: str = "principal") -> proto.Descriptor:
    return proto.descriptor((("zone", zone), (key_name, key), *extra), hits)
