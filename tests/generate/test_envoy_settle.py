"""Envoy 1.40: token budgets settled from usage (issue 19 item 3; the rules: scanner/plan/settle.py).
The Lua asks a stream for its usage where the plan says so (its program's ask_usage step: EnvelopeSpec.ask_usage),
reads the usage from the JSON answer or the stream's events as they go by, drops the usage-only
event it asked for, and credits the unused reservation to the principal's next requests (the
bucket's charge, perimeter.hits, lowered by it). One Envoy in front of the stand-in for the module."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from scanner import mutate
from scanner.audit.access_log import Entry, entries
from scanner.errors import GenerateError
from scanner.generate.envoy import EnvoyGenerator
from scanner.generate.envoy_model import build_model
from scanner.generate.interface import GenerateOptions
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.model import Decision, Plan
from scanner.runtime import envoy
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.test_token_budget import token_policy

CATALOG = "vllm-0.29.0-default"
LIMIT = 2000
CHAT = "/v1/chat/completions"
DELAY = 0.15     # the stand-in's spacing of a stream's steps


def _plan(tmp: Path) -> loop.Setup:
    tmp.mkdir(parents=True, exist_ok=True)
    return loop.setup(load_ref(CATALOG), token_policy(LIMIT, LIMIT), tmp, free_port())


def _rendered(plan: Plan, tmp: Path, extra: dict[str, str] | None = None) -> str:
    options = GenerateOptions(output_dir=str(tmp), access_log=str(tmp / "access.log"), extra=extra or {})
    config = EnvoyGenerator().render(plan, options)
    return next(f.content for f in config.files if f.name == "envoy.yaml")


# --- the config -----------------------------------------------------------------------------------

def test_the_lua_asks_where_the_plan_says_and_the_bucket_is_charged_hits(tmp_path: Path) -> None:
    plan = _plan(tmp_path).plan
    text = _rendered(plan, tmp_path)
    doc = yaml.safe_load(text)
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    tokens = [f for f in hcm["http_filters"] if f["name"].startswith("perimeter.tokens")]
    assert tokens and all(r["hits_addend"]["format"] == "%DYNAMIC_METADATA(perimeter:hits)%"
                          for f in tokens for r in f["typed_config"]["rate_limits"])
    model = build_model(plan, GenerateOptions(output_dir=str(tmp_path)))
    groups, programs = {g.id: g for g in model.lua_groups}, dict(model.programs)

    def asks(d: Decision) -> bool:
        group = groups[next(r.lua_group for r in model.routes if r.name == f"allow:{d.method} {d.path}")]
        return bool(group.program) and any(s.op == "ask_usage" for s in programs[group.program].steps)

    asking = {d.path for d in plan.allowed if asks(d)}
    assert CHAT in asking and "/v1/completions" in asking        # their models take stream_options
    assert all(asks(d) == (bool(d.token_zone) and d.envelope_spec.ask_usage) for d in plan.allowed)
    lua = hcm["http_filters"][1]["typed_config"]["default_source_code"]["inline_string"]
    assert lua.count('{["op"] = "ask_usage"}') >= 1 and "local WORKERS = 1\n" in lua
    four = _rendered(plan, tmp_path, {"workers": "4"})
    assert "local WORKERS = 4\n" in four and "\n# --concurrency 4 " in four   # and the run line says so


@pytest.mark.parametrize("bad", ["0", "x", "-1", "2000"])
def test_workers_must_be_a_concurrency(tmp_path: Path, bad: str) -> None:
    with pytest.raises(GenerateError, match="workers"):
        _rendered(_plan(tmp_path).plan, tmp_path, {"workers": bad})


def test_settlement_skipped_charges_the_whole_reservation(tmp_path: Path) -> None:
    s = _plan(tmp_path)
    written = envoy.write(s.plan, tmp_path / "proxy").parent
    op = mutate.OPERATORS["envoy.settlement-skipped"]
    assert op.family == "remove" and "token-budget" in op.catches
    assert op.apply(written, s.plan)
    text = (written / "envoy.yaml").read_text()
    assert "perimeter:hits" not in text.split("http_filters:", 1)[1].split("perimeter.upstream_errors")[0]


# --- on the real proxy ----------------------------------------------------------------------------

@dataclass
class Live:
    setup: loop.Setup
    directory: Path
    headers: dict[str, str]
    source: str

    def send(self, body: object, path: str = CHAT) -> tuple[int, bytes, list[float], float]:
        """(status, answer, arrival times of its chunks from the send, total time)."""
        c = http.client.HTTPConnection(self.setup.plan.listen.address, self.setup.plan.listen.port,
                                       timeout=20, source_address=(self.source, 0))
        t0 = time.monotonic()
        c.request("POST", path, body=json.dumps(body), headers=self.headers)
        r = c.getresponse()
        parts, times = [], []
        while True:
            piece = r.read1(65536)
            if not piece:
                break
            parts.append(piece)
            times.append(time.monotonic() - t0)
        c.close()
        return r.status, b"".join(parts), times, time.monotonic() - t0

    def log(self) -> list[Entry]:
        return list(entries(self.lines())[0])

    def raw(self) -> list[dict[str, Any]]:
        """The access log's lines as JSON (after a flush: the proxy runs with flush_ms=50)."""
        return [json.loads(line) for line in self.lines()]

    def lines(self) -> list[str]:
        time.sleep(0.3)
        return (self.directory / "access.log").read_text().splitlines()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("settle")
    s = _plan(tmp)
    directory = tmp / "proxy"
    cred = next(c for c in s.credentials if c.role == "user")
    with StandinThread(load_ref(CATALOG), "127.0.0.1", s.plan.upstream.servers[0][1], stream_delay=DELAY), \
            envoy.process(s.plan, directory, flush_ms=50):
        yield Live(s, directory, {**cred.headers(), "Content-Type": "application/json"}, _public(s))


def _public(s: loop.Setup) -> str:
    return next(v.address or "" for v in s.vantages if v.name == "public")


def _body(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, **extra}


def _events(answer: bytes) -> list[str]:
    return [line[6:] for line in answer.decode().split("\n") if line.startswith("data: ")]


def test_answers_are_settled_more_requests_than_their_reservations_fit(live: Live) -> None:
    n = 12     # reservations of about 430 tokens each: 4 fit 2000 unsettled
    got = [live.send(_body())[0] for _ in range(n)]
    assert got == [200] * n, got
    mine = [e for e in live.log() if e.path == CHAT][-n:]
    for e in mine:
        inp, out = (int(x) for x in e.usage.split("+"))
        assert e.tokens_charged and e.tokens_charged > 400 and inp + out < 100, e
    assert sum(e.tokens_charged or 0 for e in mine) > 2 * LIMIT     # let through: settled
    refunds = [r for r in live.raw() if r["path"] == CHAT][-n:]
    assert all(int(r["tokens_refunded"]) == int(r["tokens_charged"]) - sum(map(int, r["usage"].split("+")))
               for r in refunds), refunds


def test_a_stream_not_asking_is_asked_and_the_usage_event_dropped(live: Live) -> None:
    status, answer, times, total = live.send(_body(max_tokens=6, stream=True))
    assert status == 200
    events = _events(answer)
    assert events[-1] == "[DONE]"
    assert not any('"usage"' in e for e in events), events           # asked by the proxy: hidden
    assert all(json.loads(e)["choices"] for e in events[:-1])
    # streamed as it came: the first bytes long before the end (nothing held)
    assert times[0] < total - 3 * DELAY, (times, total)
    print(f"stream chunks arrived at {[round(t, 2) for t in times]} s (steps every {DELAY} s)")
    e = [x for x in live.log() if x.path == CHAT][-1]
    assert e.usage and int(e.usage.split("+")[1]) == 6, e


def test_a_stream_asking_keeps_its_usage_event(live: Live) -> None:
    status, answer, _times, _total = live.send(
        _body(max_tokens=4, stream=True, stream_options={"include_usage": True}))
    events = _events(answer)
    assert status == 200 and events[-1] == "[DONE]"
    usage = json.loads(events[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    e = [x for x in live.log() if x.path == CHAT][-1]
    assert e.usage == f"{usage['usage']['prompt_tokens']}+4"


def test_a_stream_cut_short_keeps_its_charge(live: Live) -> None:
    # the client leaves after the first event: no usage event reaches the Lua, nothing is credited
    import socket

    raw = json.dumps(_body(max_tokens=300, stream=True)).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in live.headers.items())
    for _ in range(2):
        sock = socket.create_connection((live.setup.plan.listen.address, live.setup.plan.listen.port),
                                        timeout=20, source_address=(live.source, 0))
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(raw)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + raw)
        got = b""
        deadline = time.monotonic() + 10
        while b"data: " not in got and time.monotonic() < deadline:
            got += sock.recv(65536)
        sock.close()
        assert got.startswith(b"HTTP/1.1 200") and b"data: " in got and b"[DONE]" not in got, got[:300]
    time.sleep(4 * DELAY + 0.5)     # the upstream stream is reset and the request logged
    cut = [r for r in live.raw() if r["path"] == CHAT][-2:]
    assert all(int(r["tokens_charged"]) > 300 for r in cut), cut
    assert all(r["usage"] is None and not r["tokens_refunded"] for r in cut), cut


def test_best_of_over_n_keeps_its_charge(live: Live) -> None:
    status, _answer, _t, _total = live.send(
        {"model": "m", "prompt": "hi", "max_tokens": 50, "n": 1, "best_of": 2}, "/v1/completions")
    last = [r for r in live.raw() if r["path"] == "/v1/completions"][-1]
    assert status == 200 and last["usage"], last
    assert int(last["tokens_refunded"]) == 0, last


# --- the body a settled stream leaves with: the reference's (settle.asking_usage via body.forwarded) ---

STREAM_BODIES = (
    '"stream": true', '"stream": true, "stream_options": null', '"stream": true, "stream_options": {}',
    '"stream": true, "stream_options": {"include_usage": false}',
    '"stream": true, "stream_options": {"include_usage": true}',
    '"stream": true, "stream_options": {"include_usage": "true"}',
    '"stream": true, "stream_options": {"continuous_usage_stats": true}',
    '"stream": true, "stream_options": { "continuous_usage_stats" : true , "include_usage" : false }',
    '"stream": true, "stream_options": {"include_usage": true, "include_usage": false}',
    '"stream": true, "stream_options": {"include_usage": false, "include_usage": true}',
    '"stream": true, "stream_options": {"include_usage": true}, "stream_options": {}',
    '"stream_options": {}, "stream": true', '"stream": false, "stream": true', '"stream": true, "stream": false',
    '"stream": false', '"stream": "true"', '"stream": 1', '"stream": null', '"stream_options": {}',
    '"stream": true, "stream_options": []', '"stream": true, "stream_options": "x"',
    '"stream": true, "stream_options": {"incl\\u0075de_usage": true}',
    # include_usage as vLLM's pydantic reads a bool: these ask (nothing written), these do not
    '"stream": true, "stream_options": {"include_usage": "Yes"}',
    '"stream": true, "stream_options": {"include_usage": "\\u0074rue"}',
    '"stream": true, "stream_options": {"include_usage": 1}',
    '"stream": true, "stream_options": {"include_usage": 1.0}',
    '"stream": true, "stream_options": {"include_usage": 10e-1}',
    '"stream": true, "stream_options": {"include_usage": "ON"}',
    '"stream": true, "stream_options": {"include_usage": "no"}',
    '"stream": true, "stream_options": {"include_usage": 2}',
    '"stream": true, "stream_options": {"include_usage": " true"}',
    '"stream": true, "stream_options": {"include_usage": "1.0"}',
)


def streams_leave_as_the_reference_forwards_them(tmp_path: Path, proxy: Proxy) -> None:
    """Each of :data:`STREAM_BODIES` on chat and completions under a token budget through
    ``proxy`` reaches the upstream as the reference judge forwards it (scanner/plan/body.py)."""
    from scanner.plan.body import judge
    from tests.differential.harness import Case, compare, run, stand

    inventory = load_ref(CATALOG)
    s = stand(inventory, token_policy(10 ** 8), tmp_path)
    heads = ((CHAT, '"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5'),
             ("/v1/completions", '"model": "m", "prompt": "hi", "max_tokens": 5'))
    cases = [Case(f"s{i}-{j}", path, ("{" + head + ", " + b + "}").encode())
             for i, b in enumerate(STREAM_BODIES) for j, (path, head) in enumerate(heads)]
    seen = run(s, inventory, proxy, cases)
    differ, asked = [], 0
    for case in cases:
        d = s.setup.plan.decision("POST", case.path)
        assert d is not None and d.token_zone and d.envelope_spec.ask_usage
        ref = judge(d, case.raw, "", case.content_type)
        options = (ref.body or {}).get("stream_options")
        asked += isinstance(options, dict) and options.get("include_usage") is True \
            and b'"include_usage": true}' not in case.raw
        if cls := compare(ref, seen[case.id], case.raw):
            differ.append((case.id, case.raw, cls, seen[case.id]))
    assert not differ, differ
    assert asked >= 20     # the rewrite was exercised, not only the bodies left alone


def test_streams_leave_as_the_reference_forwards_them(tmp_path: Path) -> None:
    from scanner.runtime.proxy import EnvoyProxy
    streams_leave_as_the_reference_forwards_them(tmp_path, EnvoyProxy())


# --- the probe: a config without settlement fails it ------------------------------------------------

WITHOUT_SETTLEMENT = ("hits_addend: {format: \"%DYNAMIC_METADATA(perimeter:hits)%\"}",
                      "hits_addend: {format: \"%DYNAMIC_METADATA(perimeter:cost)%\"}")


def _unsettled(text: str) -> str:
    assert WITHOUT_SETTLEMENT[0] in text
    return text.replace(*WITHOUT_SETTLEMENT)


def test_settlement_removed_by_hand_fails_the_probe(tmp_path: Path) -> None:
    # the probe's default flags but only the token-budget check (all of them on this paced policy
    # take over the default max_time: cut short, exit 3 whatever the settlement)
    from scanner.probe.interface import ProbeOptions
    from tests.probe.test_load_values import rules, run

    t0 = time.monotonic()
    result = run(tmp_path, "envoy", ProbeOptions(checks=("token-budget",)), _unsettled, token_policy(LIMIT, LIMIT))
    print(f"token-budget probe of the unsettled Envoy: {time.monotonic() - t0:.1f} s")
    assert result.exit_code() == 1, [c for c in result.coverage if c.check == "token-budget"]
    assert ("VP005", "token-budget", "token budget not settled") in rules(result), rules(result)


def test_a_credit_never_fills_the_bucket_past_its_budget(tmp_path: Path) -> None:
    # a budget of 60000 refills 1000 tokens a second: while a stream of about a second runs, the
    # bucket is full again, so its refund has no deficit to fill (a real refund would be capped by
    # max_tokens): the next request is charged its whole cost. A JSON answer right after a charge
    # leaves a deficit: the next one is charged less.
    s = loop.setup(load_ref(CATALOG), token_policy(60000), tmp_path, free_port())
    cred = next(c for c in s.credentials if c.role == "user")
    live = Live(s, tmp_path / "proxy", {**cred.headers(), "Content-Type": "application/json"}, _public(s))
    with StandinThread(load_ref(CATALOG), "127.0.0.1", s.plan.upstream.servers[0][1], stream_delay=0.2), \
            envoy.process(s.plan, live.directory, flush_ms=50):
        assert live.send(_body(stream=True))[0] == 200      # 10 tokens: about 2.4 s
        assert live.send(_body())[0] == 200
        assert live.send(_body())[0] == 200
        raw = live.raw()
    stream, first, second = raw[-3:]
    assert int(stream["tokens_refunded"]) > 400 and int(first["tokens_refunded"]) > 400, raw
    assert int(first["bucket_charged"]) == int(first["tokens_charged"]), first      # no deficit: no credit
    assert int(second["bucket_charged"]) < int(second["tokens_charged"]) - 300, second   # credited


def test_an_answer_without_usage_keeps_its_charge(live: Live) -> None:
    # n 0: vLLM refuses it; the stand-in answers its plain JSON (no usage): nothing to settle
    status, answer, _t, _total = live.send(_body(n=0))
    assert status == 200 and b'"usage"' not in answer, answer[:200]
    last = [r for r in live.raw() if r["path"] == CHAT][-1]
    assert last["tokens_charged"] and last["usage"] is None and last["tokens_refunded"] is None, last


def test_the_settlement_skipped_mutant_is_caught(tmp_path: Path) -> None:
    from tests.probe.realproxy import probe_through, proxy_named
    from tests.probe.test_token_budget import OPTIONS

    result = probe_through(tmp_path, proxy_named("envoy"), token_policy(LIMIT, LIMIT), CATALOG, OPTIONS,
                           mutant="settlement-skipped", paced=True)
    assert result.exit_code() == 1
    assert any(f.rule == "VP005" and f.check == "token-budget" and "not settled" in f.title
               for f in result.findings), result.findings


def test_the_kubernetes_bundle_renders_the_workers_it_runs(tmp_path: Path) -> None:
    from scanner.generate import kubernetes

    options = kubernetes.proxy_options("envoy", GenerateOptions(output_dir=str(tmp_path),
                                                                access_log=str(tmp_path / "a.log")))
    assert options.extra["workers"] == "2"      # the Deployment's --concurrency reads the same option
    config = EnvoyGenerator().render(_plan(tmp_path).plan, options)
    assert "local WORKERS = 2\n" in next(f.content for f in config.files if f.name == "envoy.yaml")


def test_two_workers_settle_and_prove_the_budget(tmp_path: Path) -> None:
    # Envoy --concurrency 2 with the config written for it: each worker holds its share of the
    # credits; the probe's requests (one kept-alive connection per lane) settle as with one
    from scanner.runtime.proxy import EnvoyProxy
    from tests.probe.realproxy import probe_through
    from tests.probe.test_token_budget import OPTIONS

    result = probe_through(tmp_path, EnvoyProxy(extra={"workers": "2"}), token_policy(LIMIT, LIMIT), CATALOG, OPTIONS,
                           paced=True, keys_per_role=2)
    assert "--concurrency 2 " in " ".join(p.read_text() for p in tmp_path.rglob("envoy.yaml"))
    zone = f"token-budget inference:key:{LIMIT}t/m/{LIMIT}"
    cov = {c.subject: c.status for c in result.coverage if c.check == "token-budget"}
    assert cov[zone] == cov[f"{zone} settled"] == cov[f"{zone} other principal"] == "proved", cov
    assert result.exit_code() == 0, result.findings
