"""Request targets that name no path, sent byte for byte to each generated proxy (the bundled
policy's plan): asterisk-form ``OPTIONS *`` and authority-form ``CONNECT host:port``. No route
admits them; each proxy must refuse them itself, marked, with a reason. H4's campaign found Envoy
1.40 answering ``OPTIONS *`` with its own unmarked-reason 404 and ``CONNECT`` with the Lua filter's
500 (no route); nothing may reach the upstream (a raw socket that records what arrives)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.build import build
from scanner.plan.model import DECISION_HEADER, REASON_HEADER
from scanner.policy.load import loads
from scanner.runtime.proxy import get
from scanner.verify.loop import start_checked
from tests.generate.nginx_harness import LOOPBACK_NETWORKS, default_policy_text, listen_yaml, raw_request

pytestmark = [pytest.mark.nginx, pytest.mark.envoy]


class Recorder:
    """An upstream that records every connection's first bytes and answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    self.seen.append(conn.recv(4096))
                except OSError:
                    self.seen.append(b"")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture()
def upstream() -> Iterator[Recorder]:
    r = Recorder()
    try:
        yield r
    finally:
        r.close()


# (method, target, the statuses and reasons each proxy may refuse it with)
CASES = [
    ("OPTIONS", "*", {(400, "bad-request"), (404, "not-allowlisted")}),
    ("CONNECT", "127.0.0.1:80", {(400, "bad-request"), (403, "upgrade"), (405, "method-not-allowed")}),
]


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_targets_without_a_path_are_refused_marked(tmp_path: Path, name: str, upstream: Recorder) -> None:
    try:
        proxy = get(name)
    except Exception as exc:  # a missing build: the other tests of this suite skip the same way
        pytest.skip(str(exc))
    text = default_policy_text() + "\n" + listen_yaml(free_port("127.0.0.1"), "127.0.0.1", upstream.port)
    plan = build(load_ref("vllm-0.29.0-default"), loads(text, source="t.yaml", base_dir=tmp_path),
                 LOOPBACK_NETWORKS)
    proxy.write(plan, tmp_path / "proxy")
    with ExitStack() as stack:
        plan = start_checked(proxy, plan, tmp_path / "proxy", stack)
        for method, target, allowed in CASES:
            r = raw_request(plan.listen.port, target, method=method, timeout=5.0)
            got = (r.status, r.headers.get(REASON_HEADER.lower(), ""))
            assert got in allowed, (name, method, target, got, r.body[:200])
            assert r.headers.get(DECISION_HEADER.lower()) == "deny", (name, method, r.headers)
        # the proxy answers an ordinary request: it was listening, not just closing connections
        assert raw_request(plan.listen.port, "/probe-nothing-here").status == 404
    assert upstream.seen == [], upstream.seen
