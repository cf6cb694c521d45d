"""The limiter tests' own harness: a process restarted on the port its peers already name."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from tests.limiter.harness import redis_process, restart


def test_a_restart_waits_for_its_own_port_and_never_moves(tmp_path: Path) -> None:
    """Another process holds the port for a moment when the restart comes (other loopback
    traffic): the restart tries again on that port, not on a fresh one (the proxies name it)."""
    proc = redis_process(tmp_path)
    proc.start()
    port = proc.port      # after the start: a port taken meanwhile moves it (argv_for)
    proc.stop()
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    threading.Timer(0.8, holder.close).start()
    try:
        restart(proc)
        assert proc.port == port and proc.argv_for is not None
        with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
            c.sendall(b"PING\r\n")
            assert c.recv(16) == b"+PONG\r\n"
    finally:
        proc.stop()
        holder.close()
