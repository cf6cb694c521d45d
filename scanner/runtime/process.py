"""A proxy or server process we start, wait for, and always stop (process group, bounded waits)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from scanner.errors import InternalError, PortInUse
from scanner.net import bind_failed, on_free_port, wait_listening


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    host: str
    port: int
    log: Path
    start_timeout: float = 20.0
    env: dict[str, str] | None = None
    logs: tuple[Path, ...] = ()    # other logs the process writes (Envoy's --log-path)
    # the argv for a port: a process nothing else names the port of (a test's redis-server) then
    # moves to a fresh port when its port was taken (scanner.net.on_free_port)
    argv_for: Callable[[int], list[str]] | None = field(default=None, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _seen: dict[Path, int] = field(default_factory=dict, repr=False)

    def start(self) -> ManagedProcess:
        """Start it and wait until it listens itself; PortInUse when its logs say its port is
        taken, so that scanner.net.on_free_port starts it on another; with
        ``argv_for``, it does so itself."""
        argv_for = self.argv_for
        if argv_for is None:
            return self._start()

        def at(port: int) -> ManagedProcess:
            self.port, self.argv = port, argv_for(port)
            return self._start()

        return on_free_port(at, self.port, self.host)

    def _start(self) -> ManagedProcess:
        # no check that the port is free first: an Envoy hot restart binds its parent's listener
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # what the other logs hold already is an earlier run's (Envoy appends to its --log-path)
        self._seen = {p: p.stat().st_size if p.exists() else 0 for p in self.logs}
        with open(self.log, "wb") as fh:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                          start_new_session=True, env=self.env)
        # listening itself: a connect would succeed to another process's listener on the port too
        try:
            ready = wait_listening(self._proc.pid, self.host, self.port, self.start_timeout,
                                   give_up=self.failed)
        except BaseException:   # Ctrl-C, SIGTERM while it starts: nobody holds it yet to stop it
            self.stop()
            raise
        if not ready or self.failed():
            taken = self.cannot_bind()
            tail = self.log_tail()
            self.stop()
            if taken:
                raise PortInUse(f"{self.name} could not bind {self.host}:{self.port}: {tail}")
            raise InternalError(f"{self.name} did not start on {self.host}:{self.port}: {tail}")
        return self

    def failed(self) -> bool:
        """Has the process exited, or said it cannot bind its port?"""
        return self._proc is None or self._proc.poll() is not None or self.cannot_bind()

    def cannot_bind(self) -> bool:
        """Do its logs say a port it listens on was taken?"""
        return any(bind_failed(self._read(p)) for p in (self.log, *self.logs))

    def _read(self, path: Path) -> str:
        """What ``path`` holds, from where it ended when this run started."""
        try:
            with open(path, "rb") as fh:
                fh.seek(self._seen.get(path, 0))
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 3) -> str:
        """The last ``lines`` of its output, else of its other logs."""
        text = self._read(self.log).strip() or "\n".join(self._read(p) for p in self.logs).strip()
        return " | ".join(text.splitlines()[-lines:])

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
    """Stop a process started with ``start_new_session=True`` and every process of its group,
    a child that outlives its leader too (an NGINX worker still closing after its master): SIGTERM
    to the group, then wait (at most ``grace``) until the leader and the group are gone, SIGKILL to
    what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:    # the group is gone already
        proc.poll()
        return
    end = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    while _group_alive(proc.pid) and time.monotonic() < end:
        time.sleep(0.02)
    if _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)
        end = time.monotonic() + 1.0
        while _group_alive(proc.pid) and time.monotonic() < end:
            time.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    """Is a process of group ``pgid`` still running? Zombies (ended, waiting for their parent or
    init to reap them) do not count: where init reaps nothing they would never go."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:           # ended while we looked
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False
