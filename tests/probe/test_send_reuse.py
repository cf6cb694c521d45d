"""When the stream sender reuses a kept-alive connection (scanner/probe/send.py): never one the
server has closed meanwhile (a keep-alive timeout, a close after its answer), never after an
error answer to a request with a body (the server may close it having left the body unread), and
a failure is not sent again behind the caller's back (whether it reached the upstream is then
not known). A raw asyncio server counts connections and requests."""

from __future__ import annotations

import asyncio

from scanner.probe.cases import Case
from scanner.probe.interface import Credential, Target, Vantage
from scanner.probe.send import Sender

CRED = Credential("none", "none")


class Server:
    """Answers each request ``status`` (keep-alive), then closes the connection after
    ``close_after`` requests on it (or, with ``close_on_5xx``, after each 5xx answer, as uvicorn
    does when the app raised after Starlette sent its complete 500 without Connection: close)."""

    def __init__(self, status: int = 200, close_after: int = 0, close_on_5xx: bool = False) -> None:
        self.status, self.close_after, self.close_on_5xx = status, close_after, close_on_5xx
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                self.requests += 1
                served += 1
                writer.write(f"HTTP/1.1 {self.status} X\r\nContent-Length: 2\r\n\r\nok".encode())
                await writer.drain()
                if self.close_on_5xx and self.status >= 500:
                    await asyncio.sleep(0.05)   # uvicorn logs the app's traceback first
                    break
                if self.close_after and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def case(body: bytes | None = None) -> Case:
    return Case("unit", "POST" if body else "GET", "/x", "POST" if body else "GET", "/x", CRED, Vantage(),
                "allow", body=body)


async def _run(server: Server, bodies: list[bytes | None], pause: float = 0.0) -> list[int | None]:
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    sender = Sender(Target(f"http://127.0.0.1:{port}"), 5.0)
    out = []
    try:
        for body in bodies:
            out.append((await sender.send(case(body))).status)
            await asyncio.sleep(pause)
    finally:
        await sender.aclose()
        srv.close()
        await srv.wait_closed()
    return out


def test_a_connection_the_server_closed_is_not_reused() -> None:
    server = Server(close_after=1)      # closes each connection after its one answer
    statuses = asyncio.run(_run(server, [None, None, None], pause=0.1))
    assert statuses == [200, 200, 200]
    assert (server.connections, server.requests) == (3, 3)    # each on a fresh one, none sent twice


async def _two_then_one(server: Server) -> list[int | None]:
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    sender = Sender(Target(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"), 5.0)
    try:
        first = await asyncio.gather(sender.send(case()), sender.send(case()))   # two connections kept
        await asyncio.sleep(0.2)                                                 # both closed by now
        last = await sender.send(case(b"{}"))
    finally:
        await sender.aclose()
        srv.close()
        await srv.wait_closed()
    return [a.status for a in (*first, last)]


def test_several_closed_connections_are_all_passed_over() -> None:
    server = Server(close_after=1)
    assert asyncio.run(_two_then_one(server)) == [200, 200, 200]
    assert (server.connections, server.requests) == (3, 3)


def test_a_kept_alive_connection_is_reused() -> None:
    server = Server()
    assert asyncio.run(_run(server, [None, b"{}", None])) == [200, 200, 200]
    assert (server.connections, server.requests) == (1, 3)


def test_not_after_an_error_answer_to_a_body() -> None:
    server = Server(status=400)
    assert asyncio.run(_run(server, [b"{}", b"{}", None, None])) == [400, 400, 400, 400]
    # a fresh one after each answered body; the bodiless requests share one
    assert (server.connections, server.requests) == (3, 4)


def test_not_after_a_server_error() -> None:
    """uvicorn closes the connection after an exception in the app even when the 500 it answered
    said nothing of closing (the real engine-less vLLM on GET /is_sleeping): a connection that
    answered 5xx is not reused, so the next request (sent at once, before the close is seen) is
    answered, not lost (CI: a pipelined probe recorded an error where a plain one read 500)."""
    server = Server(status=500, close_on_5xx=True)
    assert asyncio.run(_run(server, [None, None, None])) == [500, 500, 500]
    assert (server.connections, server.requests) == (3, 3)
