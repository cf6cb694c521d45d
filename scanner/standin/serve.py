"""Serve the stand-in (catalog/inventory) or the real engine-less vLLM app until interrupted."""

from __future__ import annotations

import errno
import signal
import socket
import threading
from collections.abc import Callable

from scanner.errors import InternalError, PortInUse, UsageError
from scanner.inventory.model import Inventory
from scanner.inventory.vllm_app import VllmExtraction
from scanner.net import wait_for_port
from scanner.standin.app import build_app
from scanner.standin.openai_answers import STREAM_DELAY_S
from scanner.standin.real import RealVllmServer


def serve_inventory(inventory: Inventory, host: str, port: int, api_keys: tuple[str, ...],
                    announce: Callable[[str], None], fetch_media: bool = False,
                    stream_delay: float = STREAM_DELAY_S) -> None:
    try:
        import uvicorn
    except ImportError:
        raise UsageError("the stand-in needs uvicorn: pip install 'vllm-perimeter[standin]'") from None
    app, _ = build_app(inventory, api_keys, fetch_media, stream_delay)
    announce(f"stand-in for {inventory.source.target or inventory.source.kind}: "
             f"{len(inventory.routes)} routes on http://{host}:{port} "
             f"(api key: {'on' if api_keys else 'off'}; stats at /__standin__/stats)")
    uvicorn.run(app, host=host, port=port, lifespan="off", log_level="warning", access_log=False)


def serve_real(spec: VllmExtraction, host: str, port: int, announce: Callable[[str], None]) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with RealVllmServer(spec, host=host, port=port) as server:
        announce(f"real vLLM {server.facts.get('version', '?')} app (engine-less) on {server.url}")
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass


class StandinThread:
    """The stand-in served by uvicorn in a background thread (for the demo and tests);
    ``stream_delay``: the seconds between a stream's steps (``stream_end_delay``: from its last
    event to the end of its body). It binds its socket itself when it
    starts, so a port taken after the pick is PortInUse (scanner.net.on_free_port), and ``port``
    0 is a port the kernel picks (read ``.port`` once started): held from the bind on, none
    can take it."""

    def __init__(self, inventory: Inventory, host: str, port: int, api_keys: tuple[str, ...] = (),
                 fetch_media: bool = False, stream_delay: float = STREAM_DELAY_S,
                 stream_end_delay: float = 0.0) -> None:
        try:
            import uvicorn
        except ImportError:
            raise UsageError("the stand-in needs uvicorn: pip install 'vllm-perimeter[standin]'") from None
        app, self.counters = build_app(inventory, api_keys, fetch_media, stream_delay, stream_end_delay)
        self.host, self.port = host, port
        config = uvicorn.Config(app, host=host, port=port, lifespan="off", log_level="error",
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> StandinThread:
        # IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that name it (else each kept-alive
        # answer waits ~40 ms for the client's delayed ACK: its head and body are two writes)
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM,
                             socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"stand-in: {self.host}:{self.port} is already in use") from None
            why = exc.strerror or exc
            raise InternalError(f"stand-in cannot bind {self.host}:{self.port}: {why}") from None
        self._sock, self.port = sock, int(sock.getsockname()[1])
        thread = self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                                 name="standin", daemon=True)
        thread.start()
        if not wait_for_port(self.host, self.port, 15.0, give_up=lambda: not thread.is_alive()):
            self.__exit__(None, None, None)
            raise InternalError(f"stand-in did not start on {self.host}:{self.port}")
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
