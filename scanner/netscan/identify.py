"""What speaks on an open port, asked the least intrusive way that tells HTTP/2 apart: the
HTTP/2 connection preface and an empty SETTINGS frame, nothing else (no request, no stream).

An HTTP/2 server (h2c: gRPC servers, vllm-rs's gRPC port, a proxy with HTTP/2 on a clear
port) answers with its own SETTINGS frame; an HTTP/1.1 server refuses the preface line
``PRI * HTTP/2.0`` with a status line; anything else (silence, a TLS alert, a banner) is left
unnamed. One connection per open port, bounded by the per-port timeout."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from scanner.netscan.connect import open_socket
from scanner.netscan.model import PortAttempt
from scanner.probe import h2c

H2C, HTTP1 = "h2c", "http/1.1"
HELLO = h2c.PREFACE + h2c.frame(h2c.SETTINGS, 0, 0)


def classify(head: bytes) -> str:
    if h2c.is_settings(head):
        return H2C
    if h2c.is_http1(head):
        return HTTP1
    return ""


def speaks(address: str, family: int, port: int, timeout: float,
           source: str | None = None, interface: str | None = None) -> str:
    """``h2c``, ``http/1.1`` or "" for what answers the HTTP/2 preface on ``port``."""
    deadline = time.monotonic() + timeout
    try:
        sock = open_socket(family, socket.SOCK_STREAM, source, interface)
    except OSError:
        return ""
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        head = b""
        with contextlib.suppress(OSError):
            sock.settimeout(timeout)
            sock.connect((address, port))
            sock.sendall(HELLO)
            while len(head) < h2c.FRAME_HEAD and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                more = sock.recv(h2c.FRAME_HEAD - len(head))
                if not more:
                    break
                head += more
        return classify(head)


def identify(address: str, family: int, attempts: Sequence[PortAttempt], timeout: float, concurrency: int,
             source: str | None = None, interface: str | None = None) -> tuple[PortAttempt, ...]:
    """The attempts, each open port's with what answered the preface (``service``)."""
    opened = [a for a in attempts if a.state == "open"]
    if not opened:
        return tuple(attempts)
    workers = max(1, min(concurrency, len(opened)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="netscan-id") as pool:
        said = pool.map(lambda a: speaks(address, family, a.port, timeout, source, interface), opened)
        named = dict(zip((a.port for a in opened), said, strict=True))
    return tuple(replace(a, service=named[a.port]) if a.port in named else a for a in attempts)
