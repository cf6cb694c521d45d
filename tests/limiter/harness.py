"""A real redis-server on a random loopback port (no persistence), started and stopped by pid."""

from __future__ import annotations

import asyncio
import http.client
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from scanner.errors import PortInUse
from scanner.limiter import store
from scanner.net import free_port
from scanner.runtime.process import ManagedProcess

T = TypeVar("T")


def redis_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing; .ci/run installs it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return path


def redis_process(directory: Path, extra: tuple[str, ...] = ()) -> ManagedProcess:
    """redis-server on a free port; started on another when that one was taken meanwhile."""
    binary = redis_binary()

    def argv(port: int) -> list[str]:
        return [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(directory), *extra]

    port = free_port()
    return ManagedProcess("redis-server", argv(port), "127.0.0.1", port, log=directory / "redis.log",
                          argv_for=argv)


RESTART_TRIES = 10
RESTART_PAUSE_S = 0.3


def restart(proc: ManagedProcess) -> None:
    """Start ``proc`` again on its own port (the proxies' configs name it: no other will do),
    trying again while another process holds the port for a moment (other loopback traffic
    binds random ports), at most RESTART_TRIES starts. A process that would move to a fresh port
    when its own is taken (``argv_for``) keeps its own here."""
    argv_for, proc.argv_for = proc.argv_for, None
    try:
        for attempt in range(RESTART_TRIES):
            try:
                proc.start()
                return
            except PortInUse:
                if attempt == RESTART_TRIES - 1:
                    raise
                time.sleep(RESTART_PAUSE_S)
    finally:
        proc.argv_for = argv_for


def url(proc: ManagedProcess) -> str:
    return f"redis://127.0.0.1:{proc.port}/0"


INSPECT_TIMEOUT_S = 5.0


def run(fn: Callable[..., Awaitable[T]], proc: ManagedProcess, *args: object) -> T:
    """``fn(redis, *args)`` in a fresh event loop with a fresh client (closed after). The test's
    own reads wait up to INSPECT_TIMEOUT_S, not the service's 0.5 s: on a loaded machine a read
    that checks the service must not fail the test (CI: a ZCOUNT timed out at load average 6)."""
    async def main() -> T:
        client = store.connect(store.StoreSpec(url(proc), timeout_s=INSPECT_TIMEOUT_S))
        try:
            return await fn(client, *args)
        finally:
            await client.aclose()
    return asyncio.run(main())


ZONES = {
    "version": 1,
    "domain": "vllm-perimeter",
    "zones": {
        "rate:2/3": {"kind": "rate", "rps": 2, "burst": 3},
        "conc:2": {"kind": "concurrency", "limit": 2, "slot_ttl_s": 30},
        "tokens:600": {"kind": "tokens", "per_minute": 600},
        "wide": {"kind": "rate", "rps": 1000000, "burst": 1000000},
    },
}


def limiter_process(directory: Path, redis_url: str, zones: dict[str, object] | None = None) -> ManagedProcess:
    """The service as users run it: ``vllm-perimeter limiter`` on a random loopback port."""
    import json
    import sys

    zones_file = directory / "limiter.json"
    zones_file.write_text(json.dumps(zones or ZONES))

    def argv(port: int) -> list[str]:   # on another port when this one was taken meanwhile
        return [sys.executable, "-m", "scanner.cli.main", "limiter", "--redis", redis_url,
                "--zones", str(zones_file), "--listen", f"127.0.0.1:{port}"]

    port = free_port()
    return ManagedProcess("limiter", argv(port), "127.0.0.1", port, log=directory / "limiter.log", argv_for=argv)


def get(port: int, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """One GET through a proxy on loopback: (status, headers in lower case)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}
    finally:
        conn.close()
