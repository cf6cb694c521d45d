"""Loopback helpers: free ports and readiness waits, always bounded in time.

A port is picked now and bound later by another process (NGINX, Envoy, redis-server, uvicorn),
so two things keep it free meanwhile, and one recovers when it was not:

- :func:`free_port` picks at random *outside* the kernel's ephemeral range
  (``/proc/sys/net/ipv4/ip_local_port_range``): the range outgoing connections take their local
  ports from, and ``bind(0)`` too, so a port from it can be taken by any connection made before
  the server binds it. A pick is bindable when handed out, and never handed out twice by a process.
- :func:`on_free_port` runs ``start(port)`` and, when the start says the port was taken after all
  (:class:`~scanner.errors.PortInUse`: another process picked it), runs it again on a fresh
  port, a bounded number of times. Every start of a server on a picked port goes through it.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from scanner.errors import InternalError, PortInUse

T = TypeVar("T")

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = (32768, 60999)   # the kernel's default, when the file cannot be read
LOWEST = 10000                     # below: well-known and registered services' ports
HIGHEST = 65535
MIN_SPAN = 2000                    # fewer ports than this outside the ephemeral range: use them all
PICK_TRIES = 200                   # random picks before free_port gives up
START_ATTEMPTS = 4                 # on_free_port: starts in all (the first port and 3 fresh ones)
# How the servers we start say a port is taken: NGINX "bind() to 127.0.0.1:N failed (98: Address
# already in use)" (the static musl build: "(98: Address in use)"), Envoy "cannot bind
# '127.0.0.1:N': Address already in use", uvicorn "[Errno 98] ... address already in use",
# redis-server "bind: Address already in use", Python "EADDRINUSE"
BIND_FAILURE = re.compile(r"address (?:already )?in use|eaddrinuse", re.IGNORECASE)

_handed: set[int] = set()
_lock = threading.Lock()


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's ephemeral port range (low, high); Linux's default when it cannot be read."""
    try:
        low, high = (int(x) for x in path.read_text(encoding="ascii").split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return (low, high) if 1 <= low <= high <= HIGHEST else LINUX_EPHEMERAL


def pick_range(ephemeral: tuple[int, int] | None = None) -> tuple[int, int]:
    """The ports free_port picks from: the larger of LOWEST..(low-1) and (high+1)..65535; when
    neither holds MIN_SPAN ports (an ephemeral range over nearly everything), LOWEST..65535 (a
    collision is then possible, and on_free_port recovers from it)."""
    low, high = ephemeral or ephemeral_range()
    below, above = (LOWEST, low - 1), (max(LOWEST, high + 1), HIGHEST)
    best = max(below, above, key=lambda r: r[1] - r[0])
    return best if best[1] - best[0] + 1 >= MIN_SPAN else (LOWEST, HIGHEST)


def bindable(host: str, port: int, reuse: bool = False) -> bool:
    """Can a TCP socket bind ``host:port`` now? ``reuse``: with SO_REUSEADDR, as servers bind
    (a port with only TIME_WAIT connections left is then free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A random port outside the ephemeral range that ``host`` can bind now, not handed out
    before by this process (see the module's docstring)."""
    low, high = pick_range()
    with _lock:
        if len(_handed) >= (high - low + 1) // 2:   # a very long-lived process: forget the oldest picks
            _handed.clear()
        for _ in range(PICK_TRIES):
            port = random.randint(low, high)   # a port, not a secret
            if port not in _handed and bindable(host, port):
                _handed.add(port)
                return port
    raise InternalError(f"no free port on {host} in {low}..{high} after {PICK_TRIES} tries")


def bind_failed(text: str) -> bool:
    """Does a server's log say it could not bind its port because it was taken?"""
    return BIND_FAILURE.search(text) is not None


def on_free_port(start: Callable[[int], T], port: int = 0, host: str = "127.0.0.1",
                 attempts: int = START_ATTEMPTS) -> T:
    """``start(port)`` (``port`` 0: a free_port); when it raises PortInUse, ``start`` again on
    a fresh free_port, at most ``attempts`` starts in all. ``start`` writes whatever holds the
    port (a config, a plan) and stops what it started before it raises. Any other error is
    not retried."""
    tried: list[int] = []
    for _ in range(max(1, attempts)):
        port = port or free_port(host)
        tried.append(port)
        try:
            return start(port)
        except PortInUse:
            port = 0
    raise PortInUse(f"no port could be bound on {host} (tried {', '.join(map(str, tried))})")


PROC_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = "0A"   # the TCP state LISTEN in /proc/net/tcp


def listener_inodes(port: int, tables: tuple[Path, ...] = PROC_TCP) -> set[str] | None:
    """The socket inodes listening on TCP ``port`` (any address); None when the kernel's tables
    cannot be read (not Linux)."""
    found: set[str] = set()
    read = False
    for table in tables:
        try:
            lines = table.read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found if read else None


def listens(pid: int, port: int) -> bool | None:
    """Does process ``pid`` itself hold a socket listening on ``port``? None: cannot tell (no
    /proc). A connect alone cannot tell: it succeeds to another process's listener too."""
    inodes = listener_inodes(port)
    if inodes is None:
        return None
    if not inodes:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None if not Path("/proc/self/fd").exists() else False
    wanted = {f"socket:[{i}]" for i in inodes}
    for fd in fds:
        try:
            if str(fd.readlink()) in wanted:
                return True
        except OSError:
            continue
    return False


def wait_listening(pid: int, host: str, port: int, timeout: float = 30.0,
                   give_up: Callable[[], bool] = lambda: False) -> bool:
    """True once process ``pid`` listens on ``port`` (where /proc cannot tell: once a TCP connect
    to host:port succeeds); False after ``timeout`` seconds, or as soon as ``give_up()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owns = listens(pid, port)
        if owns or (owns is None and wait_for_port(host, port, 0.1)):
            return True
        if give_up():
            return False
        time.sleep(0.05)
    return False


def wait_for_port(host: str, port: int, timeout: float = 30.0,
                  give_up: Callable[[], bool] = lambda: False) -> bool:
    """True once a TCP connect to host:port succeeds; False after ``timeout`` seconds, or as
    soon as ``give_up()`` is true (the server exited, or said it cannot bind)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            if give_up():
                return False
            time.sleep(0.05)
    return False
