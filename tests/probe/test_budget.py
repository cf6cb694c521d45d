"""The output budget holds when a request omits it (issue 10, item 3).

vLLM reads a generating route's output budget from one or two fields; without them (absent, or
null) it generates up to the rest of the context window, so a JSON cap alone means nothing to a
client that leaves the field out. The plan decides each budget route once
(:attr:`scanner.plan.model.Decision.budget`): the generated proxies write the cap in (or refuse),
the probe sends bodies without it and the witness shows what reached the upstream."""

from __future__ import annotations

import json
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from scanner.errors import PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan.budget import Budget
from scanner.plan.inputs import load_policy
from scanner.policy.load import loads
from scanner.policy.model import Policy
from scanner.probe.checks.limits import LimitsCheck
from scanner.probe.interface import ProbeOptions, ProbeResult, Target
from scanner.probe.registry import CheckContext
from scanner.runtime.proxy import Proxy
from scanner.verify import loop
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("limits",))
CHAT = Budget(("max_completion_tokens", "max_tokens"), "max_completion_tokens", 4096, "inject")


# --- the plan's decision ------------------------------------------------------------------------

def test_a_body_without_its_budget_gets_the_cap_written_in() -> None:
    assert CHAT.forwarded({"model": "m"}) == {"model": "m", "max_completion_tokens": 4096}
    # null is vLLM's "absent": the nulls go, the cap comes in
    assert CHAT.forwarded({"max_tokens": None, "max_completion_tokens": None}) == {"max_completion_tokens": 4096}


def test_a_body_with_its_budget_is_forwarded_as_sent() -> None:
    for body in ({"max_tokens": 10}, {"max_completion_tokens": 5, "max_tokens": None}):
        assert CHAT.forwarded(body) == body


def test_reject_and_pass() -> None:
    assert replace(CHAT, when_absent="reject").forwarded({"model": "m"}) is None
    assert replace(CHAT, when_absent="pass").forwarded({"model": "m"}) == {"model": "m"}


def test_the_plan_gives_each_generating_route_its_budget(tmp_path: Path) -> None:
    plan = loop.setup(load_ref(CATALOG), load_policy(None), tmp_path, 9).plan
    budgets = {(d.method, d.path): d.budget for d in plan.decisions if d.budget}
    assert budgets[("POST", "/v1/chat/completions")] == CHAT
    assert budgets[("POST", "/v1/completions")] == Budget(("max_tokens",), "max_tokens", 4096, "inject")
    assert budgets[("POST", "/v1/responses")].field == "max_output_tokens"
    # Anthropic's API generates up to its (required) max_tokens
    assert budgets[("POST", "/v1/messages")] == Budget(("max_tokens",), "max_tokens", 4096, "inject")
    # the service audience's own cap
    assert budgets[("POST", "/v1/chat/completions/batch")].cap == 8192
    # routes that do not generate, or that the policy denies, have none
    assert ("POST", "/v1/embeddings") not in budgets and ("POST", "/invocations") not in budgets
    doc = plan.body_dict()["decisions"]
    assert any(d["budget"] == CHAT.to_dict() for d in doc)


def test_when_absent_is_read_from_the_policy_and_checked() -> None:
    text = (Path(__file__).parents[2] / "policies" / "vllm-default.yaml").read_text()
    policy = loads(text.replace("concurrency: 16\n", "concurrency: 16\n      when_absent: reject\n", 1))
    assert policy.audiences["inference"].limits.when_absent == "reject"
    with pytest.raises(PolicyError, match=r"line \d+.*when_absent|when_absent.*line \d+|inject"):
        loads(text.replace("concurrency: 16\n", "concurrency: 16\n      when_absent: sometimes\n", 1))


# --- through the real proxies ------------------------------------------------------------------

def _proxy(name: str) -> Proxy:
    return proxy_named(name)


def _with(when_absent: str) -> Policy:
    policy = load_policy(None)
    audiences = {name: replace(a, limits=replace(a.limits, when_absent=when_absent))  # type: ignore[arg-type]
                 for name, a in policy.audiences.items()}
    return replace(policy, audiences=audiences)


def _probe(tmp_path: Path, proxy: Proxy, policy: Policy, mutant: str = "") -> ProbeResult:
    return probe_through(tmp_path, proxy, policy, CATALOG, OPTIONS, mutant)


def _budget_coverage(res: ProbeResult) -> list[Any]:
    return [c for c in res.coverage if c.subject.startswith("budget ")]


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_the_cap_is_written_in_and_it_is_proved(tmp_path: Path, name: str) -> None:
    res = _probe(tmp_path, _proxy(name), load_policy(None))
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    # chat, batch, completions, messages (Anthropic's), responses, generate (sampling_params.max_tokens)
    budgets = _budget_coverage(res)
    assert len(budgets) == 6 and all(c.status == "proved" for c in budgets), budgets
    seen = [a for a in res.attempts if a.subject.startswith("budget ")]
    assert len(seen) == 19     # 3 bodies a route; generate's also one without its sampling_params object
    for a in seen:
        assert a.upstream is not None and a.upstream.body is not None
        got = json.loads(a.upstream.body)
        if a.path == "/inference/v1/generate":
            if not isinstance(got.get("sampling_params"), dict):
                continue       # forwarded as sent: vLLM refuses a body without the object
            got = got["sampling_params"]
        assert got.get("max_completion_tokens", got.get("max_tokens", got.get("max_output_tokens"))) in (4096, 8192)


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_a_body_without_its_budget_is_refused_when_the_policy_says_so(tmp_path: Path, name: str) -> None:
    res = _probe(tmp_path, _proxy(name), _with("reject"))
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    budgets = _budget_coverage(res)
    assert len(budgets) == 6 and all(c.status == "proved" for c in budgets), budgets
    refused = [a for a in res.attempts if a.subject.startswith("budget ")]
    assert refused and all(a.status == 400 and a.reason.startswith("json-cap:") and a.reason.endswith(":absent")
                           for a in refused), refused[:2]


def test_without_a_witness_an_injected_budget_is_not_claimed(tmp_path: Path) -> None:
    plan = loop.setup(load_ref(CATALOG), load_policy(None), tmp_path, 9).plan
    ctx = CheckContext(plan, Target("http://127.0.0.1:9"), (), (), replace(OPTIONS, witness=""))
    budgets = [s for s in LimitsCheck().subjects(ctx) if s.key.startswith("budget ")]
    assert budgets and all(not s.applies and "witness" in s.why for s in budgets)
    ctx = replace(ctx, options=replace(OPTIONS, witness="http://127.0.0.1:9"))
    assert all(s.applies for s in LimitsCheck().subjects(ctx) if s.key.startswith("budget "))


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_a_route_that_forwards_bodies_without_their_budget_is_caught(tmp_path: Path, name: str) -> None:
    res = _probe(tmp_path, _proxy(name), load_policy(None), mutant="budget-not-enforced")
    caught = [f for f in res.findings if f.rule == "VP015"]
    assert caught, [(f.rule, f.title) for f in res.findings]
    # the mutant picks the first route with a budget (POST /inference/v1/generate: sampling_params.max_tokens)
    assert 'sampling_params: {} reached the upstream, the plan says {"max_tokens": 8192}' in caught[0].detail


# --- streaming still streams -------------------------------------------------------------------

class _Sse(BaseHTTPRequestHandler):
    """An SSE upstream: the first event, then the last only once the client has the first (or
    after 5 s); records the body it received and whether it was released in time."""

    protocol_version = "HTTP/1.1"
    got: ClassVar[list[bytes]] = []
    released: ClassVar[threading.Event] = threading.Event()
    in_time: ClassVar[list[bool]] = []

    def do_POST(self) -> None:
        self.got.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(b"data: first\n\n")
        self.in_time.append(self.released.wait(5.0))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_a_rewritten_request_still_streams(tmp_path: Path, name: str) -> None:
    proxy = _proxy(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sse)
    _Sse.got, _Sse.in_time, _Sse.released = [], [], threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        s = loop.setup(load_ref(CATALOG), load_policy(None), tmp_path, server.server_address[1])
        directory = tmp_path / "proxy"
        proxy.write(s.plan, directory)
        user = next(c for c in s.credentials if c.label == "role:user")
        public = next(v for v in s.vantages if v.name == "public")   # verify's loopback address for it
        with ExitStack() as stack:
            loop.start_checked(proxy, s.plan, directory, stack)
            url = f"http://127.0.0.1:{s.plan.listen.port}/v1/chat/completions"
            t0 = time.monotonic()
            events = []
            client = stack.enter_context(httpx.Client(
                transport=httpx.HTTPTransport(local_address=public.address), timeout=15))
            with client.stream("POST", url, headers=dict(user.headers()),
                               json={"model": "m", "stream": True, "messages": []}) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append((line, time.monotonic() - t0))
                        _Sse.released.set()
        assert [e for e, _ in events] == ["data: first", "data: [DONE]"]
        assert _Sse.in_time == [True], "the first event reached the client only after the upstream's last"
        assert json.loads(_Sse.got[0]) == {"model": "m", "stream": True, "messages": [],
                                            "max_completion_tokens": 4096}
    finally:
        server.shutdown()
        server.server_close()
