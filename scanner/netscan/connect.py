"""The unprivileged method: a full TCP ``connect()`` per port, bounded by a per-port timeout."""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from scanner.netscan.model import PortAttempt

_REASONS = {
    errno.ECONNREFUSED: "refused",
    errno.EHOSTUNREACH: "host-unreachable",
    errno.ENETUNREACH: "net-unreachable",
    errno.ETIMEDOUT: "timeout",
    errno.EACCES: "denied-locally",
    errno.EPERM: "denied-locally",
}


def open_socket(family: int, kind: int, source: str | None, interface: str | None) -> socket.socket:
    """A socket bound to ``source`` (port 0) and/or ``interface`` (SO_BINDTODEVICE)."""
    sock = socket.socket(family, kind)
    try:
        if interface:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        if source:
            sock.bind((source, 0))
    except OSError:
        sock.close()
        raise
    return sock


def probe(address: str, family: int, port: int, timeout: float,
          source: str | None = None, interface: str | None = None) -> PortAttempt:
    start = time.monotonic()
    try:
        sock = open_socket(family, socket.SOCK_STREAM, source, interface)
    except OSError as exc:
        return PortAttempt(port, "filtered", "connect", _reason(exc), 0.0)
    with sock:
        # Close with RST, not FIN: no TIME_WAIT pile-up and no half-open sessions on the target.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
        except TimeoutError:
            return PortAttempt(port, "filtered", "connect", "timeout", _ms(start))
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                return PortAttempt(port, "closed", "connect", "refused", _ms(start))
            return PortAttempt(port, "filtered", "connect", _reason(exc), _ms(start))
        return PortAttempt(port, "open", "connect", "connected", _ms(start))


def scan(address: str, family: int, ports: Sequence[int], timeout: float, concurrency: int,
         source: str | None = None, interface: str | None = None) -> tuple[PortAttempt, ...]:
    """Probe every port, at most ``concurrency`` at a time; results in port order."""
    workers = max(1, min(concurrency, len(ports)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="netscan") as pool:
        return tuple(pool.map(lambda p: probe(address, family, p, timeout, source, interface), ports))


def _reason(exc: OSError) -> str:
    if exc.errno in _REASONS:
        return _REASONS[exc.errno]
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__).lower()


def _ms(start: float) -> float:
    return (time.monotonic() - start) * 1000.0
