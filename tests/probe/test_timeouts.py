"""Upstream timeouts at their value (scanner/probe/checks/timeouts.py): through the real proxies,
the bundled policy's 10 s monitoring timeout is proved on every route that has it; a timeout
raised or lowered by hand in the generated config fails the run; a timeout longer than the
witness can hold is said so, never proved."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.inputs import load_policy
from scanner.policy.load import loads
from scanner.probe.checks.timeouts import Timeouts, provable
from scanner.probe.interface import ProbeOptions, ProbeResult, Target
from scanner.probe.registry import CheckContext
from scanner.verify import loop
from tests.probe.realproxy import Edit, probe_edited, proxy_named, sub

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("timeout",))

pytestmark = [pytest.mark.nginx, pytest.mark.envoy]


def _run(tmp_path: Path, name: str, edit: Edit | None = None) -> ProbeResult:
    return probe_edited(tmp_path, proxy_named(name), OPTIONS, edit, CATALOG)


def _retime(name: str, old: str, new: str) -> Edit:
    """Every timeout of ``old`` seconds set to ``new`` (NGINX proxy_read_timeout, Envoy route timeout)."""
    if name == "envoy":
        return sub("envoy.yaml", rf"(\n\s+idle_timeout: ){old}s\n", rf"\g<1>{new}s\n")
    return sub("perimeter-http.conf", rf"proxy_read_timeout {old}s;", f"proxy_read_timeout {new}s;")


def test_only_timeouts_the_witness_can_outlast_are_provable() -> None:
    assert provable(10) and provable(27.5)
    assert not provable(28) and not provable(120) and not provable(600)


@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_the_plans_timeouts_are_proved(tmp_path: Path, name: str) -> None:
    res = _run(tmp_path, name)
    assert res.exit_code(require_proof=True) == 0, [(f.rule, f.title, f.detail) for f in res.findings]
    cov = [c for c in res.coverage if c.check == "timeout"]
    proved = [c for c in cov if c.status == "proved"]
    assert proved and all(c.subject.startswith("timeout ") for c in proved)
    # the 120 s and 600 s timeouts are said to be out of reach, never proved
    assert any(c.status == "not-applicable" and "cannot be outlasted" in c.why for c in cov)
    held = [a for a in res.attempts if a.check == "timeout"]
    assert held and all(a.status == 504 and 9.5 <= a.latency_ms / 1000 <= 12.5 for a in held)


@pytest.mark.parametrize(("name", "new", "rule"), [
    ("nginx", "100", "VP005"), ("envoy", "100", "VP005"),   # raised x10: vLLM's late answer arrives
    ("nginx", "3", "VP006"), ("envoy", "3", "VP006"),       # lowered: the plan's requests cut short
])
def test_a_timeout_changed_by_hand_fails_the_run(tmp_path: Path, name: str, new: str, rule: str) -> None:
    res = _run(tmp_path, name, _retime(name, "10", new))
    assert res.exit_code() == 1
    assert {f.rule for f in res.findings if f.check == "timeout"} == {rule}, \
        [(f.rule, f.title, f.detail) for f in res.findings]


def test_without_a_witness_timeouts_are_not_applicable(tmp_path: Path) -> None:
    s = loop.setup(load_ref(CATALOG), load_policy(None), tmp_path, free_port())
    ctx = CheckContext(s.plan, Target("http://127.0.0.1:1"), s.credentials, s.vantages, OPTIONS)
    subjects = list(Timeouts().subjects(ctx))
    assert subjects and all(not x.applies and "witness" in x.why for x in subjects)
    assert list(Timeouts().generate(ctx)) == []


def test_a_timeout_raised_on_one_way_of_forwarding_fails_the_run(tmp_path: Path) -> None:
    # inference routes at 2 s: each is held once per way its bodies are forwarded (scanner/probe/
    # forms.py); NGINX's <up>_checked locations (bodies forwarded as sent) get 20 s by hand, the
    # route's own location and <up>_rewrite keep 2 s: only the kept form's request shows it
    text = (Path(__file__).resolve().parents[2] / "policies/vllm-default.yaml").read_text()
    assert text.count("timeout_s: 600\n") == 2      # the inference and service audiences
    policy = loads(text.replace("timeout_s: 600\n", "timeout_s: 2\n"))
    one_way = sub("perimeter-http.conf", r"(\n    location @perimeter_up_\w+_checked \{[^}]*?)proxy_read_timeout 2s;",
                  r"\1proxy_read_timeout 20s;")
    res = probe_edited(tmp_path, proxy_named("nginx"), OPTIONS, one_way, CATALOG, policy=policy)
    assert res.exit_code() == 1
    bad = [a for a in res.attempts if a.check == "timeout" and a.verdict == "failed"]
    assert bad and all("above" in a.why and "rewrite" not in a.note for a in bad), \
        [(a.path, a.note, a.why) for a in bad]
    # the same routes' rewritten bodies still time out at 2 s: only the way changed by hand fails
    rewritten = [a for a in res.attempts if a.check == "timeout" and "rewrite" in a.note]
    assert {a.path for a in rewritten} & {a.path for a in bad}
    assert rewritten and all(a.verdict == "proved" for a in rewritten), [(a.path, a.why) for a in rewritten]
    assert {f.rule for f in res.findings if f.check == "timeout"} == {"VP005"}


@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_a_stream_outlives_the_timeout_while_its_events_flow(tmp_path: Path, name: str) -> None:
    # timeout_s is how long the perimeter waits without a byte (NGINX proxy_read_timeout, Envoy's
    # route idle_timeout), not how long an answer may take: vLLM's long generations stream for
    # minutes. A 2 s timeout, events every 0.3 s for about 3 s: the whole stream arrives.
    import json
    import socket
    import time

    from scanner.standin.serve import StandinThread

    text = (Path(__file__).resolve().parents[2] / "policies/vllm-default.yaml").read_text()
    port = free_port()
    s = loop.setup(load_ref(CATALOG), loads(text.replace("timeout_s: 600\n", "timeout_s: 2\n")), tmp_path, port)
    proxy = proxy_named(name)
    cred = next(c for c in s.credentials if c.role == "user")
    public = next(v.address or "" for v in s.vantages if v.name == "public")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
                       "stream": True}).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in cred.headers().items())
    proxy.write(s.plan, tmp_path / "proxy")
    with StandinThread(load_ref(CATALOG), "127.0.0.1", port, stream_delay=0.3), \
            proxy.start(s.plan, tmp_path / "proxy"):
        sock = socket.create_connection((s.plan.listen.address, s.plan.listen.port), timeout=20,
                                        source_address=(public, 0))
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{head}Content-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        t0, data = time.monotonic(), b""
        while chunk := sock.recv(65536):
            data += chunk
        took = time.monotonic() - t0
        sock.close()
    assert data.startswith(b"HTTP/1.1 200") and b"[DONE]" in data, data[-300:]
    assert took > 2.5, took
