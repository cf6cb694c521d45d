"""Vantages bind their source address on the wire (keep-alive stream sender, no injected transport)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from scanner.plan.model import DECISION_HEADER
from scanner.probe.interface import ProbeOptions, Target, Vantage
from scanner.probe.runner import probe
from tests.probe import helpers as h

SEEN: set[str] = set()


class _Deny(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _deny(self) -> None:
        SEEN.add(self.client_address[0])
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error":"denied"}'
        self.send_response(404)
        self.send_header(DECISION_HEADER, "deny")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _deny

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def deny_server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Deny)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(("pipeline", "client"), [(1, "stream"), (8, "stream"), (1, "httpx")])
def test_vantage_source_addresses(deny_server: str, pipeline: int, client: str) -> None:
    SEEN.clear()
    vs = (Vantage("a", "127.0.0.2"), Vantage("b", "127.0.0.3"))
    r = probe(h.plan(), Target(deny_server), h.creds("user"), vs,
              ProbeOptions(rate=0, max_time=60, checks=("matrix", "bypass"), pipeline=pipeline,
                           client=client))  # type: ignore[arg-type]
    assert not r.unreachable, r.reason
    assert sorted(SEEN) == ["127.0.0.2", "127.0.0.3"]
    assert {a.vantage for a in r.attempts} == {"a", "b"}
    sent = [a for a in r.attempts if a.outcome != "skipped"]
    assert sent and all(a.status == 404 and a.layer == "proxy" for a in sent), \
        {(a.request_line, a.status, a.error) for a in sent if a.status != 404}
    # expected-allow cells met a deny: reported as availability findings, never as reachability
    # (a refusal that names no reason proves no denial either: not proven, never passed)
    assert {f.rule for f in r.findings} <= {"VP006", "VP011"}
    assert any(f.rule == "VP011" for f in r.findings)
