"""``probe``'s progress display: on a terminal (stderr a tty) a line with cases, requests sent,
lanes, failures, elapsed, ETA and the time limit; nothing with -q, nothing when stderr is not a
terminal. The target is a stand-in perimeter that refuses everything (the display, not the
verdict, is under test)."""

from __future__ import annotations

import http.server
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner.plan.model import DECISION_HEADER, REASON_HEADER

REPO = Path(__file__).resolve().parents[2]
# the display's own words (scanner/cli/probe.py _Display)
SHOWN = ("cases", "sent", "lanes", "failed", "ETA", "limit")


class _Deny(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _deny(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error":"not allowlisted"}'
        self.send_response(404)
        self.send_header(DECISION_HEADER, "deny")
        self.send_header(REASON_HEADER, "not-allowlisted")
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


def argv(url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scanner.cli.main", "probe", url, "--inventory", "vllm-0.29.0-default",
            "--check", "sweep", "--format", "json", *extra]


def stderr_on_terminal(cmd: list[str]) -> str:
    """What ``cmd`` writes to its stderr when that is a terminal (a pty)."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"}
    for name in ("NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=terminal)
    os.close(terminal)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:            # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    proc.wait(timeout=120)
    return b"".join(chunks).decode("utf-8", "replace")


def test_progress_shown_on_a_terminal(deny_server: str) -> None:
    shown = stderr_on_terminal(argv(deny_server))
    assert all(word in shown for word in SHOWN), shown[-2000:]


def test_quiet_shows_nothing(deny_server: str) -> None:
    shown = stderr_on_terminal(argv(deny_server, "-q"))
    assert not any(word in shown for word in ("ETA", "lanes", "limit")), shown[-2000:]


def test_not_a_terminal_shows_nothing(deny_server: str) -> None:
    proc = subprocess.run(argv(deny_server), cwd=REPO, capture_output=True, text=True, check=False,
                          timeout=120)
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    assert not any(word in proc.stderr for word in ("ETA", "lanes", "limit")), proc.stderr[-2000:]
