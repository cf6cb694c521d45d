"""Streams held by the client (issue 30, item 4; scanner.probe.send._send_streamed and the
concurrency check's judging of them), without a proxy: a loopback server that streams an answer
slowly or at once, and attempts made by hand."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.probe.cases import Case
from scanner.probe.checks.load import Concurrency, stream_body
from scanner.probe.interface import Attempt, Credential, Target, Vantage
from scanner.probe.send import Sender
from scanner.verify import loop


@asynccontextmanager
async def streaming(events: int, gap: float, status: int = 200) -> AsyncIterator[int]:
    """A server answering every request with ``events`` chunks ``gap`` seconds apart."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(f"HTTP/1.1 {status} OK\r\nContent-Type: text/event-stream\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n".encode())
            for _ in range(events):
                writer.write(b"8\r\ndata: x\n\r\n")
                await writer.drain()
                await asyncio.sleep(gap)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def case(hold_ms: int) -> Case:
    return Case(check="concurrency", method="POST", path="/v1/chat/completions", send_method="POST",
                target="/v1/chat/completions", credential=Credential("none", "none"), vantage=Vantage(),
                expected="allow", body=b'{"stream": true}', hold_ms=hold_ms, stream_hold=True)


async def held(events: int, gap: float, hold_ms: int) -> Attempt:
    async with streaming(events, gap) as port:
        sender = Sender(Target(f"http://127.0.0.1:{port}"), timeout=5)
        try:
            return await sender.send(case(hold_ms))
        finally:
            await sender.aclose()


def test_a_stream_still_coming_when_the_hold_ends_is_open_that_long() -> None:
    a = asyncio.run(held(events=50, gap=0.1, hold_ms=600))
    assert a.status == 200 and not a.error, a
    assert 450 <= a.open_ms <= 700, a.open_ms          # from its head to the close at the hold's end
    assert 550 <= a.latency_ms <= 900, a.latency_ms     # the client closed it at the hold's end


def test_a_stream_answered_whole_before_the_hold_ends_was_not_held() -> None:
    a = asyncio.run(held(events=2, gap=0.01, hold_ms=600))
    assert a.status == 200 and a.open_ms == 0, a
    assert a.latency_ms < 500, a.latency_ms


def attempt(sent: float, open_s: float, closed: float, status: int = 200, reason: str = "") -> Attempt:
    return Attempt(check="concurrency", method="POST", path="/p", request_line="POST /p HTTP/1.1",
                   credential="user", fingerprint="", vantage="default", expected="allow", status=status,
                   outcome="reached" if status == 200 else "limited", reason=reason, sent_at=sent,
                   latency_ms=(closed - sent) * 1000, open_ms=open_s * 1000, verdict="proved")


def test_answers_at_once_and_a_zone_full_while_a_member_ran() -> None:
    streams = [attempt(0.0, 5.0, 6.0), attempt(0.1, 5.0, 6.1), attempt(0.2, 0.0, 0.3),   # ended early
               attempt(6.05, 1.0, 7.05)]                                                 # after a close
    assert Concurrency.answered_at_once(streams) == 2
    assert Concurrency.answering(streams, 2.0, 2.5) == 2     # both long streams all the while
    assert Concurrency.answering(streams, 5.5, 6.05) == 1    # the first closed at 6.0


def test_the_chat_route_streams_and_a_get_route_does_not() -> None:
    s = loop.setup(load_ref("vllm-0.29.0-default"), load_policy(None), Path(tempfile.mkdtemp()), 9999, 2)
    routes = {(d.method, d.path): d for d in s.plan.allowed}
    body = stream_body(routes[("POST", "/v1/chat/completions")])
    assert body is not None
    doc = json.loads(body)
    assert doc["stream"] is True and doc["max_completion_tokens"] == 4096 and doc["messages"][0]["role"] == "user"
    assert stream_body(routes[("GET", "/v1/models")]) is None
    assert stream_body(routes[("POST", "/v1/chat/completions/render")]) is None   # renders, generates nothing
    assert stream_body(routes[("POST", "/v1/completions")]) is not None
