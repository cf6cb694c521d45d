"""A proxy or server process we start, wait for, and always stop (process group, bounded waits)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from scanner.errors import InternalError
from scanner.net import wait_for_port


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    host: str
    port: int
    log: Path
    start_timeout: float = 20.0
    env: dict[str, str] | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> ManagedProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as fh:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                          start_new_session=True, env=self.env)
        if not wait_for_port(self.host, self.port, self.start_timeout) or self._proc.poll() is not None:
            self.stop()
            raise InternalError(f"{self.name} did not start on {self.host}:{self.port}: {self.log_tail()}")
        return self

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc)

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def stop_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop a process started with ``start_new_session=True`` and all its children."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)
