"""HTTP/2 cleartext and gRPC on the perimeter's HTTP/1.1 listener (issue 11, item 4).

Measured before: NGINX (1.31 static, 1.22 Debian) refused an HTTP/2 prior-knowledge preface
itself (400, marked bad-request) but forwarded ``content-type: application/grpc`` and served an
``Upgrade: h2c`` offer as plain HTTP/1.1; Envoy 1.40 (``codec_type: AUTO``) spoke HTTP/2 to a
prior-knowledge client and routed it, and forwarded gRPC-shaped requests too. Now both answer
the preface 400 bad-request, gRPC 415 ``grpc``; NGINX refuses the h2c offer (403 ``upgrade``),
Envoy's HTTP/1 codec strips it (no upgrade, nothing of it upstream: the witness proves it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.plan.inputs import load_policy
from scanner.probe import h2c, send
from scanner.probe.cases import Case
from scanner.probe.checks.protocol import OFFER, PRIOR, SHAPED
from scanner.probe.classify import grpc_status
from scanner.probe.interface import Credential, ProbeOptions, Vantage
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("protocol",))
PROXIES = ("nginx", "nginx-debian", "envoy")


def test_an_h2c_request_is_the_preface_settings_and_one_headers_frame() -> None:
    data = h2c.request("GET", "/v1/models", "probe", {"Authorization": "Bearer k", "Connection": "close"}, None)
    assert data.startswith(h2c.PREFACE + h2c.frame(h2c.SETTINGS, 0, 0))
    frames = h2c.frames(data[len(h2c.PREFACE):])
    assert [(k, f, s) for k, f, s, _p in frames] == [(h2c.SETTINGS, 0, 0), (h2c.HEADERS, 5, 1)]
    block = frames[1][3]
    assert b"\x05:path\x0a/v1/models" in block and b"authorization" in block and b"connection" not in block
    assert h2c.frames(h2c.request("POST", "/x", "p", {}, b"{}")[len(h2c.PREFACE):])[-1][:3] == (h2c.DATA, 1, 1)


def test_the_status_of_an_http2_answer_is_read_where_it_needs_no_state() -> None:
    settings = h2c.frame(h2c.SETTINGS, 0, 0, b"\0\x03\0\0\0\x64")
    assert h2c.is_settings(settings) and not h2c.is_http1(settings)
    assert h2c.answer_status(settings + h2c.frame(h2c.HEADERS, 4, 1, b"\x88")) == 200
    assert h2c.answer_status(settings + h2c.frame(h2c.HEADERS, 4, 1, b"\x48\x03403rest")) == 403
    assert h2c.answer_status(settings + h2c.frame(h2c.HEADERS, 4, 1, b"\x48\x82\xff\xff")) is None  # Huffman
    assert not h2c.answered(settings) and h2c.answered(settings + h2c.frame(h2c.GOAWAY, 0, 0, b"\0" * 8))


def test_a_grpc_framed_reply_of_the_proxy_keeps_the_status_its_body_states() -> None:
    marked = {"x-perimeter-decision": "deny", "grpc-status": "2",
              "grpc-message": '{"error":{"code":415,"message":"gRPC is not served here"}}'}
    assert grpc_status(200, marked) == 415
    assert grpc_status(200, {**marked, "grpc-message": "%7B%22error%22%3A%7B%22code%22%3A403%7D%7D"}) == 403
    assert grpc_status(200, {k: v for k, v in marked.items() if k != "x-perimeter-decision"}) == 200
    assert grpc_status(404, marked) == 404


def test_an_h2c_case_is_never_written_into_an_http1_pipeline() -> None:
    case = Case("protocol", "GET", "/v1/models", "GET", "/v1/models", Credential("none", "none"), Vantage(),
                "deny")
    assert send._pipelinable(case) and not send._pipelinable(replace(case, h2c=True))
    assert send.request_line(replace(case, h2c=True)) == "GET /v1/models HTTP/2 (h2c prior knowledge)"


@pytest.mark.parametrize(("name", "pipeline"), [(n, 1) for n in PROXIES] + [("envoy", 8)])
def test_the_listener_refuses_h2c_and_grpc(tmp_path: Path, name: str, pipeline: int) -> None:
    res = probe_through(tmp_path, proxy_named(name), load_policy(None), CATALOG, replace(OPTIONS, pipeline=pipeline))
    assert not res.findings and not res.unreachable, [(f.rule, f.detail) for f in res.findings] or res.reason
    assert res.coverage and all(c.status == "proved" for c in res.coverage), res.coverage
    by_note: dict[str, set[tuple[int | None, str]]] = {}
    for a in res.attempts:
        by_note.setdefault(a.note, set()).add((a.status, a.reason))
    assert by_note[PRIOR] == {(400, "bad-request")}
    assert by_note[SHAPED] == {(415, "grpc")}
    if name == "envoy":   # the HTTP/1 codec strips the offer: served as HTTP/1.1, nothing of it upstream
        assert all(a.layer == "upstream" for a in res.attempts if a.note == OFFER)
        assert all(a.upstream is not None and a.upstream.header("upgrade") is None
                   and a.upstream.header("http2-settings") is None for a in res.attempts if a.note == OFFER)
    else:
        assert by_note[OFFER] == {(403, "upgrade")}


@pytest.mark.parametrize(("name", "mutant"), [
    ("nginx", "h2c-accepted"), ("nginx", "grpc-accepted"), ("nginx-debian", "grpc-accepted"),
    ("envoy", "h2c-accepted"), ("envoy", "grpc-accepted"),
])
def test_each_protocol_mutant_is_caught(tmp_path: Path, name: str, mutant: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), load_policy(None), CATALOG,
                        replace(OPTIONS, stop_on_failure=False), mutant)
    assert res.findings and {f.rule for f in res.findings} == {"VP017"}, [(f.rule, f.title) for f in res.findings]
    note = PRIOR if mutant == "h2c-accepted" else SHAPED
    assert all(note in f.detail for f in res.findings)
