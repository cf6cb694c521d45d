"""Concurrency limits proven without a witness (issue 30, item 4). On a zone with a generation
route the client holds 2 x limit + 2 streams open (each request whole, its answer read until the
hold ends: scanner.probe.send._send_streamed): a stream's head comes from the upstream, so more
answers coming at once than the limit is the limit raised, on either proxy (Envoy counts only
what it forwards). On the other zones it holds limit + 1 requests open (their body's last byte
sent after the hold, scanner.probe.send._send_dribbled): NGINX's limit_conn counts a request from
its head on and refuses the one over the limit (429 concurrency); Envoy buffers the body before
its router's circuit breaker counts, so there it cannot be seen filling up from outside (measured
on Envoy 1.40: the held requests open no upstream connection; not proven, never failed). The
bundled policy's own limits, two keys per role, the real proxies in front of the stand-in, whose
streams take a token a second (a generating model's pace; STREAM_DELAY_S), probed with no witness
(as a real deployment with default flags)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from scanner import mutate
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.plan.model import Plan
from scanner.probe.checks.load import SHORT_STREAMS, UNCOUNTED
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("concurrency",))
INFERENCE = r"(limit_conn perimeter_conn_\d+ )16;"   # the inference audience's zone (concurrency 16)
STREAM_DELAY_S = 1.0     # the stand-in's streams: 10 tokens, one a second (longer than every hold)
Edit = Callable[[Path, Plan], object]


def inference_raised(factor: int) -> Edit:
    """A reviewer's hand edit: the inference zone's limit_conn x ``factor`` (NGINX)."""
    def edit(files: Path, plan: Plan) -> None:
        conf = files / "perimeter-http.conf"
        text = conf.read_text()
        edited = re.sub(INFERENCE, lambda m: f"{m.group(1)}{16 * factor};", text)
        assert edited != text
        conf.write_text(edited)
    return edit


def run(tmp_path: Path, proxy: str, edit: Edit | None = None, stream_delay: float = STREAM_DELAY_S) -> ProbeResult:
    """The bundled plan for ``proxy`` (changed by ``edit``: a hand edit or a mutation operator's
    apply), probed through without a witness; the stand-in answers."""
    p = proxy_named(proxy)
    inventory = load_ref(CATALOG)
    with StandinThread(inventory, "127.0.0.1", 0, stream_delay=stream_delay) as standin:
        s = loop.setup(inventory, load_policy(None), tmp_path, standin.port, keys_per_role=2)

        def written(plan: Plan) -> None:   # again on another port, when the proxy's was taken
            files = p.write(plan, tmp_path / "proxy")
            if edit is not None:
                edit(files, plan)

        written(s.plan)
        return loop.proxy_run(s, p, tmp_path / "proxy", OPTIONS, "", written).result


def coverage(result: ProbeResult) -> dict[str, tuple[str, str]]:
    return {c.subject: (c.status, c.why) for c in result.coverage if c.check == "concurrency"}


@pytest.mark.parametrize("proxy", ["nginx", "nginx-debian"])
def test_nginx_refuses_the_request_over_the_limit_held_by_the_client(tmp_path: Path, proxy: str) -> None:
    result = run(tmp_path, proxy)
    cov = coverage(result)
    assert result.exit_code() == 0 and not result.findings, [(f.title, f.detail) for f in result.findings]
    assert len(cov) >= 3 and all(status == "proved" for status, _why in cov.values()), cov
    held = [a for a in result.attempts if a.check == "concurrency" and "by the client" in a.note]
    streams = [a for a in held if a.path == "/v1/chat/completions"]
    # the inference zone (16): 34 streams, 16 answered at once and 18 refused; the service (64) and
    # operator (2) zones: limit + 1 held bodies, exactly one refused in each
    assert len(streams) == 34 and sum(a.reason == "concurrency" for a in streams) == 18, \
        sorted({(a.status, a.reason, a.open_ms > 0) for a in streams})
    assert sum(a.open_ms > 0 for a in streams) == 16
    bodies = [a for a in held if a not in streams]
    assert len(bodies) == 65 + 3 and sum(a.reason == "concurrency" for a in bodies) == 2, \
        sorted({(a.status, a.reason) for a in bodies})


def test_nginx_concurrency_raised_x100_fails_the_probe_without_a_witness(tmp_path: Path) -> None:
    result = run(tmp_path, "nginx", inference_raised(100))
    assert result.exit_code() == 1, coverage(result)
    assert {f.title.split(": ")[0] for f in result.findings if f.rule == "VP005"} == \
        {"concurrency above the plan"}, [(f.title, f.detail) for f in result.findings]


def test_envoy_is_proved_by_streams_and_held_bodies_stay_not_proven(tmp_path: Path) -> None:
    """Envoy 1.40 unmodified: the inference zone is proved by the streams the client holds (16
    answered, 16 queued, 2 refused), its routes refused while they run; the zones without a
    generation route (service, operator) are not proven, never failed: the bodies held by the
    client never reach the circuit breaker."""
    result = run(tmp_path, "envoy")
    cov = coverage(result)
    assert result.exit_code() == 0 and not result.deviations, [(f.title, f.detail) for f in result.findings]
    inference = "concurrency inference:key:16"
    assert cov[inference][0] == "proved" and "at most 16 answered at once" in cov[inference][1], cov[inference]
    assert all(status == "proved" for k, (status, _why) in cov.items() if k.startswith(inference + " ")), cov
    held = [k for k in cov if k.startswith("concurrency ") and " via " not in k and not k.endswith(
        ("other principal", "other address")) and k != inference]
    assert held and all(cov[k] == ("not-proven", UNCOUNTED) for k in held), cov


def test_envoy_concurrency_raised_is_caught_without_a_witness(tmp_path: Path) -> None:
    """The operator envoy.concurrency-raised-x10 (scanner/mutate/core.py: the chat route's limit
    x10, rendered by the generator: its own clusters of 160): the 34 streams are all answered at
    once."""
    result = run(tmp_path, "envoy", mutate.OPERATORS["envoy.concurrency-raised-x10"].apply)
    cov = coverage(result)
    assert result.exit_code() == 1, cov
    assert cov["concurrency inference:key:16"][0] == "failed", cov["concurrency inference:key:16"]
    assert "34 streams were being answered by the upstream at once" in cov["concurrency inference:key:16"][1]
    assert "concurrency above the plan" in {f.title.split(": ")[0] for f in result.findings if f.rule == "VP005"}


def test_short_streams_prove_nothing(tmp_path: Path) -> None:
    """An upstream that answers its streams whole before the hold ends (the stand-in's default
    pace): nothing was seen holding a slot, so the mutant is not proven either way (exit 0),
    never failed on a guess."""
    result = run(tmp_path, "envoy", mutate.OPERATORS["envoy.concurrency-raised-x10"].apply,
                 stream_delay=0.002)
    cov = coverage(result)
    assert result.exit_code() == 0, cov
    status, why = cov["concurrency inference:key:16"]
    assert status == "not-proven" and why == SHORT_STREAMS.format(ended=34, n=34), (status, why)


def test_the_plan_operator_concurrency_raised_is_caught_without_a_witness(tmp_path: Path) -> None:
    """concurrency-raised-x10 (scanner/mutate/core.py: the chat route's limit x10, rendered by the
    generator) on NGINX 1.31, the policy's own rates, no witness: its streams are all answered
    at once."""
    result = run(tmp_path, "nginx", mutate.OPERATORS["nginx.concurrency-raised-x10"].apply)
    assert result.exit_code() == 1, coverage(result)
    assert "concurrency above the plan" in {f.title.split(": ")[0] for f in result.findings if f.rule == "VP005"}
