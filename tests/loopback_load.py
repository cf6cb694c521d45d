"""Other loopback traffic, to run beside the suite (issue 27 item 8: the suite stays green while
another load takes loopback ports). Not a test:

    .venv/bin/python -m tests.loopback_load --seconds 1800 &   # then: bash .ci/run

Two kinds of traffic, bounded in time and count, on 127.0.0.1 only:

* holders: each binds a random port of the whole unprivileged range (``free_port``'s range
  included: what another team's servers do on a shared CI host), listens, holds it 0.1-2 s,
  closes it, again;
* churn: clients connect to a local echo server and exchange a line, again and again, so
  outgoing connections keep taking (and leaving in TIME_WAIT) ports of the ephemeral range.

It prints how many ports it held and connections it made when it ends."""

from __future__ import annotations

import argparse
import contextlib
import random
import socket
import threading
import time

LOW, HIGH = 1024, 65535


def hold_ports(until: float, stats: dict[str, int], lock: threading.Lock) -> None:
    while time.monotonic() < until:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", random.randint(LOW, HIGH)))   # a port, not a secret
                s.listen(1)
            except OSError:
                continue
            with lock:
                stats["held"] += 1
            time.sleep(min(random.uniform(0.1, 2.0), max(0.0, until - time.monotonic())))


def echo_server(server: socket.socket, until: float) -> None:
    server.settimeout(0.5)
    while time.monotonic() < until:
        try:
            conn, _ = server.accept()
        except OSError:
            continue
        with conn:
            conn.settimeout(1.0)
            with contextlib.suppress(OSError):
                conn.sendall(conn.recv(64))


def churn(port: int, until: float, stats: dict[str, int], lock: threading.Lock) -> None:
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as c:
                c.sendall(b"ping\n")
                c.recv(64)
        except OSError:
            pass
        with lock:
            stats["connections"] += 1
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1800.0, help="how long (at most 4 hours)")
    ap.add_argument("--holders", type=int, default=32, help="threads holding random ports (1-64)")
    ap.add_argument("--clients", type=int, default=2, help="threads connecting to the echo server (0-16)")
    args = ap.parse_args()
    seconds = min(max(args.seconds, 1.0), 4 * 3600.0)
    started = time.monotonic()
    until = started + seconds
    stats = {"held": 0, "connections": 0}
    lock = threading.Lock()
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threads = [threading.Thread(target=echo_server, args=(server, until), daemon=True)]
    threads += [threading.Thread(target=hold_ports, args=(until, stats, lock), daemon=True)
                for _ in range(min(max(args.holders, 1), 64))]
    threads += [threading.Thread(target=churn, args=(port, until, stats, lock), daemon=True)
                for _ in range(min(max(args.clients, 0), 16))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(timeout=max(0.0, until - time.monotonic()) + 3.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        print(f"loopback load: {stats['held']} ports held, {stats['connections']} connections "
              f"in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
