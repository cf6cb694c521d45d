"""Stopping what the project started (scanner/runtime/process.py): by process group, every member."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from scanner.runtime.process import stop_group


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_that_outlives_its_leader_is_stopped_too() -> None:
    """The leader exits on SIGTERM, its child ignores it (as an NGINX worker finishing its
    connections outlives its master): stop_group leaves nothing of the group behind."""
    proc = subprocess.Popen(["sh", "-c", '(trap "" TERM; sleep 30) & sleep 30'], start_new_session=True)
    time.sleep(0.3)
    assert _alive(proc.pid)
    started = time.monotonic()
    stop_group(proc, grace=1.0)
    assert proc.returncode is not None and time.monotonic() - started < 5
    for _ in range(40):            # the killed child, reaped by init
        if not _alive(proc.pid):
            break
        time.sleep(0.05)
    assert not _alive(proc.pid)


def test_a_group_gone_already_is_nothing_to_stop() -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait(timeout=10)
    stop_group(proc, grace=1.0)
    assert proc.returncode == 0


def test_a_start_interrupted_before_it_listens_leaves_nothing_running(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or SIGTERM turned into an exception) while a server starts: nobody holds the
    ManagedProcess yet (``with`` never got it), so the start itself stops what it started (CI
    found the demo's NGINX still running after the demo exited on SIGINT)."""
    from scanner.runtime import process

    started: list[int] = []

    def interrupted(pid: int, *args: object, **kwargs: object) -> bool:
        started.append(pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(process, "wait_listening", interrupted)
    server = process.ManagedProcess("sleeper", ["sleep", "30"], "127.0.0.1", 9, log=tmp_path / "sleeper.log")
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert len(started) == 1
    for _ in range(40):
        if not _alive(started[0]):
            break
        time.sleep(0.05)
    assert not _alive(started[0])
