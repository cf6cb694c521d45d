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

from scanner.errors import InternalError
from scanner.inventory._runner import WORKER
from scanner.inventory.vllm_app import VllmExtraction, worker_request
from scanner.net import free_port, wait_for_port
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
        self.port = self.port or free_port(self.host)
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
        if self._proc.poll() is not None or not wait_for_port(self.host, self.port, remaining):
            self.stop()
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


