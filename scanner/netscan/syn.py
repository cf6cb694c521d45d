"""The privileged method: raw TCP SYNs built and sent with scapy (imported lazily).

Answers are read from raw IPv4 sockets opened *before* the first SYN (TCP and ICMP), and
parsed with ``struct``: a busy host's unrelated traffic costs microseconds per packet, and
fast (loopback) answers queue in the socket instead of racing a sniffer. A SYN-ACK means
open (the kernel answers it with RST, so no connection is made), an RST means closed, an
ICMP unreachable or silence until the timeout means filtered.
"""

from __future__ import annotations

import ctypes
import logging
import os
import random
import select
import socket
import struct
import time
from collections.abc import Sequence
from contextlib import ExitStack

from scanner.netscan.model import PortAttempt

# ICMP destination-unreachable codes (RFC 792/1812) that say "no path", not "port filtered".
_ICMP_CODES = {0: "net-unreachable", 1: "host-unreachable"}
# Our SYNs' source ports: above Linux's default ephemeral range (32768-60999), so answers
# cannot be confused with the host's own connections.
_SPORT_LOW, _SPORT_SPAN = 61001, 4500
_SYN, _RST, _ACK = 0x02, 0x04, 0x10
_SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)

Key = tuple[int, int]  # (our source port, their port)


def unavailable_reason() -> str | None:
    """Why raw SYNs cannot be sent here (None: they can)."""
    if os.geteuid() != 0:
        return "not root"
    try:
        import scapy  # noqa: F401
    except ImportError:
        return "scapy is not importable"
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP).close()
    except OSError as exc:
        return f"raw sockets not allowed ({exc.strerror or exc})"
    return None


def scan(address: str, ports: Sequence[int], timeout: float,
         source: str | None = None, interface: str | None = None) -> tuple[PortAttempt, ...]:
    """One SYN per port (one source port each); answers read until ``timeout`` after the last."""
    # Scapy's warnings (e.g. "MAC address to reach destination not found") would go to stderr
    # and break the one-line error contract; silence answers show up as "filtered" anyway.
    logging.getLogger("scapy").setLevel(logging.ERROR)
    from scapy.config import conf
    from scapy.interfaces import resolve_iface
    from scapy.layers.inet import IP, TCP

    base = random.randint(0, _SPORT_SPAN - 1)
    probes = {(_SPORT_LOW + (base + i) % _SPORT_SPAN, p): p for i, p in enumerate(ports)}
    iface = interface or str(conf.route.route(address)[0])
    with ExitStack() as stack:
        target = socket.inet_aton(address)
        listeners = [stack.enter_context(_raw(proto, interface, target))
                     for proto in (socket.IPPROTO_TCP, socket.IPPROTO_ICMP)]
        # The interface's own L3 socket class: PF_INET raw on loopback (where PF_PACKET
        # injection draws no answer), PF_PACKET elsewhere.
        sender = resolve_iface(iface).l3socket(False)(iface=iface, promisc=False)
        stack.callback(sender.close)
        sent_at: dict[Key, float] = {}
        for sport, dport in probes:
            sender.send(IP(dst=address, src=source) / TCP(sport=sport, dport=dport, flags="S",
                                                          seq=random.getrandbits(32)))
            sent_at[(sport, dport)] = time.monotonic()
        found = _collect(listeners, address, sent_at, time.monotonic() + timeout)
    return tuple(found.get(key) or PortAttempt(port, "filtered", "syn", "timeout", timeout * 1000.0)
                 for key, port in probes.items())


def _raw(proto: int, interface: str | None, target: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)
    try:
        if proto == socket.IPPROTO_TCP:
            # In the kernel, before queueing: only TCP from the target to our source ports.
            _attach_filter(sock, _tcp_filter(target))
        if interface:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _tcp_filter(target: bytes) -> list[tuple[int, int, int, int]]:
    """Classic BPF over the IPv4 header, run in the kernel before queueing: TCP from the target,
    to one of our source ports, with RST or SYN+ACK set. Everything else (a busy loopback's
    data segments) never reaches this process."""
    high = _SPORT_LOW + _SPORT_SPAN - 1
    return [
        (0x20, 0, 0, 12),                                   # 0 ld   [12]       IPv4 source
        (0x15, 0, 9, struct.unpack("!I", target)[0]),       # 1 jeq  #target    else drop
        (0xB1, 0, 0, 0),                                    # 2 ldx  4*([0]&0xf) header length
        (0x48, 0, 0, 2),                                    # 3 ldh  [x+2]      TCP dest port
        (0x35, 0, 6, _SPORT_LOW),                           # 4 jge  #low       else drop
        (0x25, 5, 0, high),                                 # 5 jgt  #high      drop
        (0x50, 0, 0, 13),                                   # 6 ldb  [x+13]     TCP flags
        (0x45, 2, 0, _RST),                                 # 7 jset #RST       accept
        (0x54, 0, 0, _SYN | _ACK),                          # 8 and  #SYN|ACK
        (0x15, 0, 1, _SYN | _ACK),                          # 9 jeq  #SYN|ACK   accept, else drop
        (0x06, 0, 0, 0xFFFF),                               # 10 ret #65535     accept
        (0x06, 0, 0, 0),                                    # 11 ret #0         drop
    ]


def _attach_filter(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    raw = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    while True:  # drop whatever arrived before the filter was attached
        try:
            sock.recv(65535, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return


def _collect(listeners: list[socket.socket], address: str, sent_at: dict[Key, float],
             deadline: float) -> dict[Key, PortAttempt]:
    found: dict[Key, PortAttempt] = {}
    target = socket.inet_aton(address)
    while len(found) < len(sent_at):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(listeners, [], [], left)
        for sock in ready:
            try:
                data = sock.recv(65535)
            except BlockingIOError:
                continue
            answer = parse(data, target)
            if answer is None:
                continue
            key, state, reason = answer
            if key in sent_at and key not in found:
                found[key] = PortAttempt(key[1], state, "syn", reason,  # type: ignore[arg-type]
                                     (time.monotonic() - sent_at[key]) * 1000.0)
    return found


def parse(data: bytes, target: bytes) -> tuple[Key, str, str] | None:
    """(key, state, reason) of an IPv4 packet answering one of our SYNs to ``target``, else None."""
    if len(data) < 20 or data[0] >> 4 != 4:
        return None
    ihl = (data[0] & 0x0F) * 4
    proto = data[9]
    if proto == socket.IPPROTO_TCP and data[12:16] == target and len(data) >= ihl + 14:
        their, ours = struct.unpack("!HH", data[ihl:ihl + 4])
        flags = data[ihl + 13]
        if flags & _SYN and flags & _ACK:
            return (ours, their), "open", "syn-ack"
        if flags & _RST:
            return (ours, their), "closed", "rst"
        return None
    if proto == socket.IPPROTO_ICMP and len(data) >= ihl + 8 + 20:
        icmp_type, code = data[ihl], data[ihl + 1]
        inner = data[ihl + 8:]
        inner_ihl = (inner[0] & 0x0F) * 4
        if icmp_type != 3 or inner[9] != socket.IPPROTO_TCP or inner[16:20] != target \
                or len(inner) < inner_ihl + 4:
            return None
        ours, their = struct.unpack("!HH", inner[inner_ihl:inner_ihl + 4])
        return (ours, their), "filtered", _ICMP_CODES.get(code, f"icmp-unreachable-{code}")
    return None
