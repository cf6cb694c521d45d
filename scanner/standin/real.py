"""The real vLLM app, engine-less, served by uvicorn (lifespan off) in vLLM's own Python.

A faithful upstream for tests and demos: vLLM's own middleware, routing and
401/404/405/422 answers; handlers that need the engine answer 500, which still
proves reachability and changes no state.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from scanner.errors import InternalError, PortInUse
from scanner.inventory._runner import WORKER
from scanner.inventory.vllm_app import VllmExtraction, worker_request
from scanner.net import bind_failed, on_free_port, wait_listening
from scanner.runtime.process import stop_group


@dataclass
class RealVllmServer:
    """``with RealVllmServer(spec) as srv: httpx.get(srv.url + "/version")``"""

    spec: VllmExtraction
    host: str = "127.0.0.1"
    port: int = 0
    start_timeout: float = 90.0
    witness: bool = False          # wrap the app in the upstream witness (scanner.standin._witness)
    facts: dict[str, Any] = field(default_factory=dict)
    _proc: subprocess.Popen[bytes] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if "--ssl-certfile" in self.spec.serve_args else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def start(self) -> RealVllmServer:
        """On ``port``; else on a free port, another when it was taken before uvicorn bound it
        (scanner.net.on_free_port)."""
        if self.port:
            return self._start()

        def at(port: int) -> RealVllmServer:
            self.port = port
            return self._start()

        return on_free_port(at, 0, self.host)

    def _start(self) -> RealVllmServer:
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-perimeter-real-")
        req = Path(self._tmp.name, "request.json")
        res = Path(self._tmp.name, "result.json")
        req.write_text(json.dumps(worker_request(self.spec, "serve", host=self.host, port=self.port,
                                                 witness=self.witness)), encoding="utf-8")
        log = open(Path(self._tmp.name, "server.log"), "wb")  # noqa: SIM115 - closed with the dir
        self._proc = subprocess.Popen(
            [self.spec.python, str(WORKER), str(req), str(res)],
            env=self.spec.effective_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self._proc.poll() is None and not res.exists():
            time.sleep(0.1)
        if res.exists():
            result = json.loads(res.read_text(encoding="utf-8"))
            if not result.get("ok"):
                self.stop()
                raise InternalError(f"real vLLM app failed to build: {result['error']['message']}")
            self.facts = result["data"]
        remaining = max(1.0, deadline - time.monotonic())
        log_file = Path(self._tmp.name, "server.log")
        proc = self._proc

        def ended() -> bool:
            return proc.poll() is not None

        # uvicorn runs in the worker itself: listening there, not a connect another's listener answers
        if ended() or not wait_listening(proc.pid, self.host, self.port, remaining, give_up=ended) or ended():
            taken = bind_failed(log_file.read_text(encoding="utf-8", errors="replace"))
            self.stop()
            if taken:   # uvicorn: "[Errno 98] error while attempting to bind ...: address already in use"
                raise PortInUse(f"real vLLM app: {self.host}:{self.port} is already in use")
            raise InternalError(f"real vLLM app did not start on {self.host}:{self.port}")
        return self

    def stop(self) -> None:
        if self._proc is not None:
            stop_group(self._proc)
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RealVllmServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


