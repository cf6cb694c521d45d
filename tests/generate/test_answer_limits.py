"""How much of an answer a proxy reads to settle or seal it: one fact (scanner/rules.py ANSWER_MAX,
ANSWER_LINE_MAX), emitted into perimeter-rules.json for njs and into the Lua script for Envoy, and
the same verdict at the boundary through the real proxies (NGINX 1.31 and 1.22 with njs, the NGINX
Lua runtime, whose answers njs seals, Envoy 1.40 with Lua): a sealed JSON answer of ANSWER_MAX bytes leaves sealed, one byte more leaves
nothing; a stream line of ANSWER_LINE_MAX bytes is sealed, one byte more and the rest of the
stream is not sent; a token budget's answers at the same limits are settled, one byte more and the
charge stands (NGINX 1.31, Envoy). The upstream is a fixed one here (the stand-in's answers are
small)."""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from scanner.audit.access_log import read as read_log
from scanner.generate import interface
from scanner.generate.interface import GenerateOptions
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.model import Plan
from scanner.policy.load import loads
from scanner.rules import ANSWER_LINE_MAX, ANSWER_MAX
from scanner.verify import loop
from tests.generate.test_ownership import REPO, owned_policy_text
from tests.probe.realproxy import proxy_named, unpaced
from tests.probe.test_token_budget import token_policy

RID = "resp_0123456789abcdef"
CHAT = "/v1/chat/completions"
USAGE = (7, 5)          # what the fixed upstream's chat answers report
SEALED = re.compile(RID + r"~[A-Za-z0-9_-]{22}")
TAG = 23                # "~" and the 22 characters of the tag
PAUSE = 0.3             # a stream's long line waits this long for its end: the proxy holds it whole


def json_answer(size: int) -> bytes:
    """A Responses API answer carrying RID, exactly ``size`` bytes."""
    head = '{"id":"' + RID + '","object":"response","pad":"'
    return (head + "x" * (size - len(head) - 2) + '"}').encode()


def event(size: int = 0) -> bytes:
    """One ``data:`` line carrying RID (``size`` bytes without its newline when given)."""
    head = 'data: {"type":"response.in_progress","response":{"object":"response","id":"' + RID + '","pad":"'
    pad = max(0, size - len(head) - 3) if size else 1
    return (head + "x" * pad + '"}}').encode()


class Upstream(BaseHTTPRequestHandler):
    """POST /v1/responses: input "json:N" answers a JSON answer of N bytes; "line:N" a stream whose
    second event is a line of N bytes, its newline sent PAUSE seconds after it."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length))
        if self.path == CHAT:
            self.chat(body)
            return
        kind, size = str(body["input"]).split(":")
        if kind == "json":
            self.json(json_answer(int(size)))
            return
        self.stream((event() + b"\n\n", event(int(size))), (b"\n\n" + event() + b"\n\ndata: [DONE]\n\n",))

    def json(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def stream(self, first: tuple[bytes, ...], rest: tuple[bytes, ...]) -> None:
        """A chunked event stream: the parts of ``first``, PAUSE seconds, those of ``rest``, the end."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for i, part in enumerate((*first, *rest, b"")):
            if i == len(first):
                time.sleep(PAUSE)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()


    def chat(self, body: dict[str, Any]) -> None:
        """A chat answer reporting USAGE: "json:N" a JSON answer of N bytes, "line:N" a stream whose
        first event is a line of N bytes (its newline PAUSE seconds after it), then the usage-only
        event and [DONE]."""
        kind, size = str(body["messages"][0]["content"]).split(":")
        usage = json.dumps({"usage": {"prompt_tokens": USAGE[0], "completion_tokens": USAGE[1],
                                      "total_tokens": sum(USAGE)}}, separators=(",", ":"))[1:-1]
        if kind == "json":
            head = '{"id":"c","object":"chat.completion","model":"m",' + usage + ',"pad":"'
            self.json((head + "x" * (int(size) - len(head) - 2) + '"}').encode())
            return
        head = 'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"'
        line = (head + "x" * (int(size) - len(head) - 5) + '"}}]}').encode()
        last = ('data: {"id":"c","object":"chat.completion.chunk","choices":[],' + usage + "}\n\n"
                "data: [DONE]\n\n").encode()
        self.stream((line,), (b"\n\n" + last,))


def owned_plan(tmp: Path, port: int) -> tuple[loop.Setup, Plan]:
    policy = loads(owned_policy_text(), source="p.yaml", base_dir=REPO / "policies")
    s = loop.setup(load_ref("vllm-0.29.0-everything"), unpaced(policy), tmp, port)
    secret = secrets.token_urlsafe(40)
    assert s.plan.body.responses_secret_file
    Path(s.plan.body.responses_secret_file).write_text(secret + "\n")
    return replace(s, owner_secret=secret), s.plan


def test_both_proxies_are_given_the_plans_limits(tmp_path: Path) -> None:
    _, plan = owned_plan(tmp_path, free_port())
    options = GenerateOptions(output_dir=str(tmp_path / "out"))
    nginx = {f.name: f.content for f in interface.get("nginx").render(plan, options).files}
    rules = json.loads(nginx["perimeter-rules.json"])
    assert (rules["answer_max"], rules["answer_line_max"]) == (ANSWER_MAX, ANSWER_LINE_MAX)
    module = nginx["perimeter.js"]
    assert "perimeter_rules.answer_max" in module and "perimeter_rules.answer_line_max" in module
    assert str(ANSWER_MAX) not in module and str(ANSWER_LINE_MAX) not in module   # no copy of its own
    envoy = "".join(f.content for f in interface.get("envoy").render(plan, options).files)
    assert re.findall(r"local JSON_MAX, LINE_MAX = (\d+), (\d+)\n", envoy) == [(str(ANSWER_MAX), str(ANSWER_LINE_MAX))]
    seal = envoy.split("local function seal_response(h)\n")[1].split("function ")[0]
    assert "h:bodyChunks()" in seal and "h:body()" not in seal   # read by chunks: not Envoy's buffer


@dataclass
class Front:
    client: httpx.Client


@pytest.fixture(scope="module", params=["nginx", "nginx-debian", "nginx-lua", "envoy"])
def front(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    proxy = proxy_named(request.param)
    tmp = tmp_path_factory.mktemp(f"limits-{request.param}")
    port = free_port()
    s, plan = owned_plan(tmp, port)
    creds = {c.label: c for c in s.credentials}
    directory = tmp / "proxy"
    proxy.write(plan, directory)
    source = s.networks["public"][0].split("/")[0]
    server = ThreadingHTTPServer(("127.0.0.1", port), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with ExitStack() as stack:
            plan = loop.start_checked(proxy, plan, directory, stack)
            yield Front(stack.enter_context(httpx.Client(
                base_url=f"http://127.0.0.1:{plan.listen.port}", timeout=30, headers=creds["role:user"].headers(),
                transport=httpx.HTTPTransport(local_address=source))))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("size", [ANSWER_MAX, ANSWER_MAX + 1])
def test_a_json_answer_is_sealed_up_to_the_limit_and_past_it_not_sent(front: Front, size: int) -> None:
    r = front.client.post("/v1/responses", json={"model": "m", "input": f"json:{size}"})
    assert r.status_code == 200
    if size <= ANSWER_MAX:
        assert len(r.content) == size + TAG and SEALED.match(r.json()["id"])
    else:
        assert r.content == b""


@pytest.mark.parametrize("size", [ANSWER_LINE_MAX, ANSWER_LINE_MAX + 1])
def test_a_stream_line_is_sealed_up_to_the_limit_and_past_it_the_rest_not_sent(front: Front, size: int) -> None:
    r = front.client.post("/v1/responses", json={"model": "m", "input": f"line:{size}", "stream": True})
    assert r.status_code == 200
    lines = r.content.split(b"\n")
    sealed = [line for line in lines if SEALED.search(line.decode())]
    assert RID.encode() + b'"' not in r.content                   # never a raw id
    if size <= ANSWER_LINE_MAX:
        assert len(sealed) == 3 and len(sealed[1]) == size + TAG and lines[-3:] == [b"data: [DONE]", b"", b""]
    else:
        assert len(sealed) == 1 and r.content == sealed[0] + b"\n\n"    # the first event only


@pytest.mark.parametrize("name", ["nginx", "envoy"])   # (NGINX 1.22's njs 0.7 has no token budgets)
def test_an_answer_is_settled_up_to_the_limits_and_past_them_keeps_its_charge(tmp_path: Path, name: str) -> None:
    """A token budget's answers: a JSON answer of ANSWER_MAX bytes and a stream line of
    ANSWER_LINE_MAX are settled (the access log's usage), one byte more and the charge stands (no
    usage; the answer passes whole, a stream's rest unread: the usage event the proxy asked for then
    shows)."""
    proxy = proxy_named(name)
    port = free_port()
    s = loop.setup(load_ref("vllm-0.29.0-everything"), unpaced(token_policy(10_000_000, 1_000_000)), tmp_path, port)
    cred = next(c for c in s.credentials if c.role == "user")
    who = next(p.name for p in s.plan.principals if p.role == "user")
    directory = tmp_path / "proxy"
    proxy.write(s.plan, directory)
    source = s.networks["public"][0].split("/")[0]
    server = ThreadingHTTPServer(("127.0.0.1", port), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sizes = [("json", ANSWER_MAX), ("json", ANSWER_MAX + 1), ("line", ANSWER_LINE_MAX), ("line", ANSWER_LINE_MAX + 1)]
    try:
        with ExitStack() as stack:
            plan = loop.start_checked(proxy, s.plan, directory, stack)
            client = stack.enter_context(httpx.Client(
                base_url=f"http://127.0.0.1:{plan.listen.port}", timeout=30, headers=cred.headers(),
                transport=httpx.HTTPTransport(local_address=source)))
            for kind, size in sizes:
                r = client.post(CHAT, json={"model": "m", "max_tokens": 5, "stream": kind == "line",
                                            "messages": [{"role": "user", "content": f"{kind}:{size}"}]})
                assert r.status_code == 200, r.text[:200]
                if kind == "json":
                    assert len(r.content) == size and r.json()["usage"]["completion_tokens"] == USAGE[1]
                else:
                    first = r.content.split(b"\n")[0]
                    assert len(first) == size and first.endswith(b'"}}]}')       # the long line whole
                    # asked by the proxy: hidden when the stream was read, shown when it was not
                    assert (b'"choices":[],"usage"' in r.content) == (size > ANSWER_LINE_MAX)
                    assert r.content.endswith(b"data: [DONE]\n\n")
            for _ in range(150):       # Envoy flushes its access log every 10 s
                got = [e for e in read_log(next(directory.rglob("access.log")))[0] if e.principal == who]
                if len(got) >= len(sizes):
                    break
                time.sleep(0.1)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    settled = f"{USAGE[0]}+{USAGE[1]}"
    assert [e.usage for e in got] == [settled, "", settled, ""], [(e.path, e.status, e.usage) for e in got]
