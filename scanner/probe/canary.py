"""The SSRF canary (``probe --ssrf-canary http://HOST:PORT``): a listener the probe runs for the
length of a run, at an address the vLLM server can reach, recording every request for a
``/vp-canary/TOKEN`` path. The ssrf-canary check (scanner.probe.checks.canary) puts URLs that
name it into allowed bodies; a token it saw means the upstream fetched a URL from a request body.

For staging with a real multimodal model: vLLM's engine-less app, and the stand-in unless started
with ``fetch_media``, fetch nothing. Loopback or the host's own addresses only; it answers 404.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

from scanner.errors import UsageError

PREFIX = "/vp-canary/"


class Canary:
    """The listener; ``seen()`` is the set of tokens requested so far (thread-safe)."""

    def __init__(self, url: str) -> None:
        self.host, self.port = parse(url)
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def url_for(self, token: str) -> str:
        return f"{self.url}{PREFIX}{token}"

    def seen(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._seen)

    def _record(self, path: str) -> None:
        if path.startswith(PREFIX):
            with self._lock:
                self._seen.add(path[len(PREFIX):].split("?")[0].split("/")[0])

    def __enter__(self) -> Canary:
        canary = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                canary._record(self.path)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = _any

            def log_message(self, format: str, *args: object) -> None:
                return

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = family

        try:
            self._server = Server((self.host, self.port), Handler)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise UsageError(f"--ssrf-canary {self.url}: cannot listen there ({why})") from None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="vp-canary", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def parse(url: str) -> tuple[str, int]:
    """(host, port) of ``http://HOST:PORT``, HOST an IP address (the fetch must not depend on a
    name the upstream resolves otherwise); one clear error otherwise."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/") \
            or parts.query or parts.username:
        raise UsageError(f"--ssrf-canary wants http://ADDRESS:PORT, an address of this host the upstream "
                         f"can reach (got {url!r})")
    try:
        ipaddress.ip_address(parts.hostname)
    except ValueError:
        raise UsageError(f"--ssrf-canary {url}: the host must be an IP address "
                         f"(got {parts.hostname!r})") from None
    return parts.hostname, port
