"""Token budgets settled from usage on NGINX 1.31 (njs 0.9; issue 19, items 3 and 6): the njs body
filter on token-budget locations returns the charge less the answer's usage (scanner/plan/settle.py
is the reference), a settled stream asks for its usage and the client does not see the usage-only
event it did not ask for, every other byte on time; an answer without usage, a stream cut short and
``best_of`` over ``n`` keep their charge; the access log's ``usage`` is ``INPUT+OUTPUT``. One NGINX
in front of the stand-in (OpenAI-shaped answers with usage, scanner/standin/openai_answers.py) for
the module, one principal per test (a budget of its own)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from scanner.audit import access_log
from scanner.generate.nginx_model import RULES
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import body as plan_body
from scanner.plan import settle
from scanner.plan.model import Decision, Plan
from scanner.probe.checks.tokens import body_of_cost
from scanner.probe.interface import Credential
from scanner.runtime.proxy import NginxProxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from scanner.witness_asgi import ANSWER_PARAM, PROBE_PARAM, STANDIN_READ_PATH
from tests.generate.nginx_harness import get_build
from tests.probe.realproxy import unpaced
from tests.probe.test_token_budget import token_policy

CATALOG = "vllm-0.29.0-default"
LIMIT = 2000
COST = LIMIT // 3           # three fit the budget unsettled
DELAY = 0.05                # the stand-in's spacing of stream steps
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HIDDEN = "hidden"


@dataclass
class Stand:
    setup: loop.Setup
    standin: str
    directory: Path
    users: list[Credential]

    @property
    def plan(self) -> Plan:
        return self.setup.plan

    def decision(self, path: str) -> Decision:
        d = self.plan.decision("POST", path)
        assert d is not None and d.token_zone
        return d


@pytest.fixture(scope="module")
def stand(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    build = get_build("static-1.31")
    tmp = tmp_path_factory.mktemp("settle")
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, unpaced(token_policy(LIMIT, LIMIT)), tmp, port, keys_per_role=6)
    proxy = NginxProxy(build, "nginx")
    proxy.write(s.plan, tmp / "proxy")
    users = [c for c in s.credentials if c.role == "user"]
    with StandinThread(inventory, "127.0.0.1", port, stream_delay=DELAY) as standin, ExitStack() as stack:
        loop.start_checked(proxy, s.plan, tmp / "proxy", stack)
        yield Stand(s, standin.url, tmp, users)


def public(s: Stand) -> str:
    return next(v.address or "" for v in s.setup.vantages if v.name == "public")


def send(s: Stand, who: Credential, path: str, body: bytes, query: str = "",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(s.plan.listen.address, s.plan.listen.port, timeout=20,
                                      source_address=(public(s), 0))
    try:
        conn.request("POST", path + (f"?{query}" if query else ""), body,
                     {**who.headers(), "Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def witnessed(s: Stand, probe: str) -> dict[str, object]:
    host, port = s.standin.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", f"{STANDIN_READ_PATH}?id={probe}")
    records = json.loads(conn.getresponse().read())["records"]
    conn.close()
    assert len(records) == 1, records
    return dict(records[0])


def costed(s: Stand, path: str, base: dict[str, object]) -> bytes:
    body = body_of_cost(s.decision(path), COST, base, 1 << 20)
    assert body is not None and plan_body.token_cost(s.decision(path), body) == COST
    return body


def log_lines(s: Stand, who: Credential, count: int) -> list[access_log.Entry]:
    """``who``'s access-log entries once there are ``count`` (NGINX writes a line as the request
    ends, which may be just after the client has its answer)."""
    # the credentials of a role come in the order of its principals (loop.setup)
    name = [p.name for p in s.plan.principals if p.role == who.role][s.users.index(who)]
    logs = list((s.directory / "proxy").rglob("access.log"))
    assert len(logs) == 1, logs
    for _ in range(50):
        got, bad = access_log.read(logs[0])
        mine = [e for e in got if e.principal == name]
        if len(mine) >= count:
            break
        time.sleep(0.05)
    assert bad == 0 and len(mine) == count, (name, [(e.principal, e.path, e.status) for e in got])
    return mine


def events(raw: bytes) -> list[str]:
    """The data of each SSE event, ``created`` dropped (a clock second)."""
    out = []
    for block in raw.decode().split("\n\n"):
        data = block.removeprefix("data: ")
        if not block:
            continue
        if data.startswith("{"):
            doc = json.loads(data)
            doc.pop("created", None)
            data = HIDDEN if settle.hidden(doc) else json.dumps(doc, sort_keys=True)
        out.append(data)
    return out


def refused_at(s: Stand, who: Credential, body: bytes, most: int = 8, query: str = "") -> int:
    """How many requests of ``body`` reach before the budget refuses one (at most ``most``)."""
    for i in range(most):
        status, headers, _ = send(s, who, COMPLETIONS, body, query)
        if status == 429:
            assert headers.get("x-perimeter-reason") == "token-budget" and headers.get("retry-after")
            return i
        assert status in (200, 400), status
    return most


# --- the generated config ---------------------------------------------------------------------------

def test_only_token_budget_locations_run_a_body_filter(stand: Stand) -> None:
    text = next((stand.directory / "proxy").rglob("perimeter-http.conf")).read_text()
    blocks = text.split("\n    location ")
    filtered = [b for b in blocks if "js_body_filter perimeter.settle" in b]
    assert filtered and all("js_header_filter perimeter.settleHeaders;" in b and "proxy_pass" in b for b in filtered)
    assert len(filtered) == text.count("js_body_filter") == text.count("js_header_filter")
    # every one of them charges a token budget: its route's check names a zone
    zoned = {c.split()[0] for c in text.split("map $perimeter_check $perimeter_tokens {")[1].split("}")[0]
             .splitlines()[2:] if c.strip()}
    assert zoned
    # a settled stream asks for its usage on the zone's routes whose model takes stream_options only
    rules = json.loads(next((stand.directory / "proxy").rglob(RULES)).read_text())
    asking = {c for c, pid in rules["checks"].items()
              if any(step["op"] == "ask_usage" for step in rules["programs"][pid])}
    assert asking and asking <= zoned
    # the bundled policy (no budget) has no body filter anywhere: no cost elsewhere
    golden = Path(__file__).parent / "golden" / "nginx" / "default" / "perimeter-http.conf"
    assert "js_body_filter" not in golden.read_text() and "js_header_filter" not in golden.read_text()


# --- JSON answers -------------------------------------------------------------------------------

def test_answers_reporting_usage_return_the_unused_charge(stand: Stand) -> None:
    who = stand.users[0]
    body = costed(stand, COMPLETIONS, {"model": "m", "prompt": "hello"})
    spent, usages = 0, []
    for i in range(6):      # unsettled, the fourth is refused
        status, headers, answer = send(stand, who, COMPLETIONS, body, f"{PROBE_PARAM}=json{i}",
                                       {"Accept-Encoding": "gzip"})
        assert status == 200, answer
        usage = settle.usage_of(json.loads(answer))
        assert usage is not None and usage.tokens < COST
        usages.append(f"{usage.input}+{usage.output}")
        spent += COST - settle.refund(COST, usage, json.loads(body))
        # the body as the upstream sent it: its length, no encoding (the proxy asks for identity)
        assert headers.get("content-length") == str(len(answer)) and "content-encoding" not in headers
    sent = witnessed(stand, "json0")["headers"]
    assert isinstance(sent, list) and "accept-encoding" not in {k for k, _v in sent}
    lines = log_lines(stand, who, 6)
    assert [e.usage for e in lines] == usages and all(e.tokens_charged == COST for e in lines)
    # what is left after the settled charges, taken by requests that keep theirs (a 400, no usage)
    left = refused_at(stand, who, body, query=f"{ANSWER_PARAM}=400")
    assert left == (LIMIT - spent) // COST, (left, spent)


def test_the_log_carries_the_usage_the_answer_reported(stand: Stand) -> None:
    who = stand.users[1]
    body = json.dumps({"model": "m", "prompt": ["a", "b"], "n": 2, "max_tokens": 7}).encode()
    status, _h, answer = send(stand, who, COMPLETIONS, body)
    usage = settle.usage_of(json.loads(answer))
    assert status == 200 and usage is not None
    entry = log_lines(stand, who, 1)[-1]
    assert entry.usage == f"{usage.input}+{usage.output}" and entry.tokens_charged == 2 * 2 * 7 + len(body)


# --- streams ------------------------------------------------------------------------------------

def stream(s: Stand, who: Credential, body: dict[str, object] | bytes, query: str,
           stop_after: int = 0) -> tuple[bytes, list[float]]:
    """A streamed answer read as it comes: (its bytes, when each event arrived); ``stop_after``
    events read, the connection is closed (a stream cut short)."""
    sock = socket.create_connection((s.plan.listen.address, s.plan.listen.port), timeout=20,
                                    source_address=(public(s), 0))
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in who.headers().items())
    sock.sendall(f"POST {CHAT}?{query} HTTP/1.1\r\nHost: x\r\n{head}Content-Type: application/json\r\n"
                 f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
    data, times = b"", list[float]()
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            while data.count(b"\n\n") > len(times):
                times.append(time.monotonic())
            if stop_after and len(times) > stop_after:
                break
    finally:
        sock.close()
    head_end = data.index(b"\r\n\r\n")
    return _dechunk(data[head_end + 4:]) if b"chunked" in data[:head_end].lower() else data[head_end + 4:], times


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + rest[:n], rest[n + 2:]
    return out


def direct(s: Stand, raw: bytes) -> bytes:
    """The stand-in's own answer to ``raw`` (what the proxy forwarded), not through the proxy."""
    host, port = s.standin.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    conn.request("POST", CHAT, raw, {"Content-Type": "application/json"})
    out = conn.getresponse().read()
    conn.close()
    return out


def test_a_stream_asks_for_its_usage_and_the_client_sees_the_stream_it_asked_for(stand: Stand) -> None:
    who = stand.users[2]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True,
            "stream_options": {"continuous_usage_stats": False}}
    got, times = stream(stand, who, body, f"{PROBE_PARAM}=stream1")
    record = witnessed(stand, "stream1")
    forwarded = json.loads(str(record["body"]))
    assert forwarded == settle.asking_usage(body) and forwarded["stream_options"] == {"include_usage": True}
    alone = direct(stand, str(record["body"]).encode())
    mine, theirs = events(got), events(alone)
    # every byte the stand-in sent but the usage-only event, in order
    assert HIDDEN in theirs and HIDDEN not in mine
    assert mine == [e for e in theirs if e != HIDDEN] and mine[-1] == "[DONE]"
    assert got.endswith(b"data: [DONE]\n\n")
    # each event passed on as it came: the first long before the last (8 tokens, DELAY apart)
    assert times[-1] - times[0] >= 4 * DELAY, times
    usage = settle.stream_usage(json.loads(b[6:]) for b in alone.split(b"\n\n") if b.startswith(b"data: {"))
    entry = log_lines(stand, who, 1)[-1]
    assert usage is not None and entry.status == 200 and entry.usage == f"{usage.input}+{usage.output}"


def test_a_client_asking_for_usage_gets_its_event(stand: Stand) -> None:
    who = stand.users[2]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    got, _times = stream(stand, who, body, f"{PROBE_PARAM}=stream2")
    assert json.loads(str(witnessed(stand, "stream2")["body"])) == body      # forwarded as sent
    mine = events(got)
    assert mine[-2] == HIDDEN and mine[-1] == "[DONE]"


# --- what keeps its charge ------------------------------------------------------------------------

def test_answers_without_usage_keep_their_charge(stand: Stand) -> None:
    body = costed(stand, COMPLETIONS, {"model": "m", "prompt": "hello"})
    assert refused_at(stand, stand.users[3], body, query=f"{ANSWER_PARAM}=400") == 3


def test_best_of_over_n_keeps_its_charge(stand: Stand) -> None:
    d = stand.decision(COMPLETIONS)
    body = next(b for x in range(COST) for b in [json.dumps({"model": "m", "prompt": "hello", "best_of": 4,
                                                              "max_tokens": x}).encode()]
                if plan_body.token_cost(d, b) == COST)
    assert not settle.refund(COST, settle.Usage(1, 1), json.loads(body))
    status, _h, answer = send(stand, stand.users[4], COMPLETIONS, body)
    assert status == 200 and settle.usage_of(json.loads(answer)) is not None     # reported, not counted
    assert refused_at(stand, stand.users[4], body) == 2


def test_a_stream_cut_short_keeps_its_charge(stand: Stand) -> None:
    who = stand.users[5]
    body = costed(stand, CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    for i in range(3):
        got, _times = stream(stand, who, body, f"{PROBE_PARAM}=cut{i}", stop_after=1)
        assert b"[DONE]" not in got
    time.sleep(12 * DELAY)      # the proxy has seen each stream end (the client gone): nothing settled
    cut = log_lines(stand, who, 3)
    assert len(cut) == 3 and all(e.usage == "" for e in cut), cut
    status, headers, _ = send(stand, who, CHAT, body)
    assert status == 429 and headers.get("x-perimeter-reason") == "token-budget"


# --- the body a settled stream leaves with: the reference's (settle.asking_usage via body.forwarded) ---

def test_streams_leave_as_the_reference_forwards_them(tmp_path: Path) -> None:
    """The stream_options shapes of tests/generate/test_envoy_settle.py through NGINX 1.31's njs."""
    from tests.generate.test_envoy_settle import streams_leave_as_the_reference_forwards_them
    streams_leave_as_the_reference_forwards_them(tmp_path, NginxProxy(get_build("static-1.31"), "nginx"))
