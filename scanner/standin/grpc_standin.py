"""Run the gRPC stand-in (``_grpc_standin.py``) in a Python that has grpcio, and read back what
reached it. Stopped by its own pid."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from scanner.errors import InternalError, UsageError
from scanner.net import wait_for_port

SCRIPT = Path(__file__).with_name("_grpc_standin.py")


@dataclass(frozen=True)
class GrpcCall:
    method: str
    metadata: tuple[str, ...]
    principal: str
    authorization: bool


class GrpcStandin:
    """``with GrpcStandin(python, methods, port) as s: ... s.calls()``."""

    def __init__(self, python: str, methods: tuple[str, ...], port: int, start_timeout: float = 20.0) -> None:
        self.python, self.methods, self.port, self.start_timeout = python, methods, port, start_timeout
        self._dir = tempfile.TemporaryDirectory(prefix="vllm-perimeter-grpc-standin-")
        self.record = Path(self._dir.name, "calls.jsonl")
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GrpcStandin:
        listed = Path(self._dir.name, "methods.json")
        listed.write_text(json.dumps(list(self.methods)), encoding="utf-8")
        self.record.touch()
        log = Path(self._dir.name, "stderr.txt")
        try:
            with log.open("wb") as err:
                self._proc = subprocess.Popen(
                    [self.python, str(SCRIPT), str(self.port), str(listed), str(self.record)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        except OSError as exc:
            raise UsageError(f"cannot run {self.python}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                raise InternalError(f"the gRPC stand-in exited: {tail[0] if tail else '?'}")
            if wait_for_port("127.0.0.1", self.port, timeout=0.5):
                return self
        self.__exit__(None, None, None)
        raise InternalError(f"the gRPC stand-in did not listen on 127.0.0.1:{self.port} "
                            f"in {self.start_timeout:.0f}s")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        self._dir.cleanup()

    def calls(self) -> list[GrpcCall]:
        out = []
        for line in self.record.read_text(encoding="utf-8").splitlines():
            raw: dict[str, Any] = json.loads(line)
            out.append(GrpcCall(raw["method"], tuple(raw["metadata"]), raw["principal"],
                                raw["authorization"]))
        return out
