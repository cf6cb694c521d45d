"""Run a sweep: check the inputs, pick the method, probe, decide reachability, add findings."""

from __future__ import annotations

import errno
import ipaddress
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from scanner.errors import TargetUnreachableError, UsageError
from scanner.netscan import connect, identify, syn
from scanner.netscan import policy as port_rules
from scanner.netscan.model import UNREACHABLE_REASONS, Method, PortAttempt, ScanResult, ScanVantage
from scanner.policy.model import Policy

MethodChoice = Literal["auto", "syn", "connect"]
MAX_TIMEOUT_S = 30.0
MAX_CONCURRENCY = 256


@dataclass(frozen=True)
class ScanRequest:
    host: str
    ports: tuple[int, ...]
    method: MethodChoice = "auto"
    source: str | None = None
    interface: str | None = None
    timeout: float = 1.0            # per port (connect) / after the last SYN (syn)
    concurrency: int = 64           # connect() probes in flight
    vantage_networks: tuple[str, ...] = ()  # override: the policy networks this vantage is in
    identify: bool = False          # ask each open port what it speaks (the HTTP/2 preface)


def run(req: ScanRequest, policy: Policy) -> ScanResult:
    _check(req, policy)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    family, address = resolve(req.host, req.source)
    local = route_source(family, address, req.ports[0], req.source, req.interface)
    method, note = choose_method(req.method, family)
    if method == "syn":
        attempts = syn.scan(address, req.ports, req.timeout, req.source, req.interface)
    else:
        attempts = connect.scan(address, family, req.ports, req.timeout, req.concurrency,
                                req.source, req.interface)
    if unreachable(attempts):
        raise TargetUnreachableError(
            f"{req.host} ({address}) is unreachable from {local}: {attempts[0].reason}")
    if req.identify:
        attempts = identify.identify(address, family, attempts, req.timeout, req.concurrency,
                                     req.source, req.interface)
    nets = req.vantage_networks or port_rules.networks_of(local, policy.networks)
    vantage = ScanVantage(address=local, interface=req.interface or "", networks=nets)
    found = port_rules.findings(req.host, attempts, vantage, port_rules.port_policy(policy))
    return ScanResult(host=req.host, address=address, vantage=vantage, method=method,
                      method_note=note, attempts=attempts, findings=found, policy=policy.name,
                      elapsed_s=time.monotonic() - t0, started_at=started_at)


def _check(req: ScanRequest, policy: Policy) -> None:
    if not req.ports:
        raise UsageError("no ports to scan")
    if not 0 < req.timeout <= MAX_TIMEOUT_S:
        raise UsageError(f"--timeout must be in (0, {MAX_TIMEOUT_S:g}] seconds, got {req.timeout:g}")
    if not 1 <= req.concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency must be 1-{MAX_CONCURRENCY}, got {req.concurrency}")
    for name in req.vantage_networks:
        if name not in policy.networks:
            raise UsageError(f"--vantage {name!r} is not a network of policy {policy.name!r} "
                             f"(networks: {', '.join(policy.networks) or 'none'})")
    if req.source is not None:
        try:
            ipaddress.ip_address(req.source)
        except ValueError:
            raise UsageError(f"--source {req.source!r} is not an IP address") from None
    if req.interface is not None:
        try:
            socket.if_nametoindex(req.interface)
        except OSError:
            raise UsageError(f"--interface {req.interface!r}: no such network interface") from None


def resolve(host: str, source: str | None) -> tuple[int, str]:
    """(family, address) of ``host``; the family of ``source`` when one is given."""
    family = socket.AF_UNSPEC
    if source is not None:
        version = ipaddress.ip_address(source).version
        family = socket.AF_INET6 if version == 6 else socket.AF_INET
        literal = _ip_literal(host)
        if literal is not None and literal.version != version:
            raise UsageError(f"--source {source} is IPv{version} but {host} is IPv{literal.version}")
    try:
        infos = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TargetUnreachableError(f"cannot resolve {host!r}: {exc.strerror}") from None
    fam, _, _, _, sockaddr = infos[0]
    return int(fam), str(sockaddr[0])


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def route_source(family: int, address: str, port: int, source: str | None,
                 interface: str | None) -> str:
    """The local address the kernel would use to reach ``address`` (a UDP connect: no packet)."""
    try:
        sock = connect.open_socket(family, socket.SOCK_DGRAM, source, interface)
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"--source {source} is not an address of this host") from None
        raise UsageError(f"cannot bind --source/--interface: {exc.strerror or exc}") from None
    with sock:
        try:
            sock.connect((address, port))
        except OSError as exc:
            raise TargetUnreachableError(
                f"{address} is unreachable from this vantage: {exc.strerror or exc}") from None
        return str(sock.getsockname()[0])


def choose_method(choice: MethodChoice, family: int) -> tuple[Method, str]:
    """The method and a sentence saying why (printed with the results)."""
    if choice == "connect":
        return "connect", "connect(): full TCP handshakes, as chosen with --method connect"
    why_not = syn.unavailable_reason()
    if why_not is None and family == socket.AF_INET6:
        why_not = "raw SYN scans are IPv4-only here"
    if why_not is None:
        return "syn", "raw SYN (scapy): SYN-ACK open, RST closed, silence or ICMP filtered"
    if choice == "syn":
        raise UsageError(f"--method syn is not possible here: {why_not}")
    return "connect", (f"connect() FALLBACK: raw SYN not possible ({why_not}); full TCP "
                       "handshakes are made and may be logged by the target")


def unreachable(attempts: tuple[PortAttempt, ...]) -> bool:
    """Nothing answered and every probe says there is no path to the host."""
    return bool(attempts) and all(a.state == "filtered" and a.reason in UNREACHABLE_REASONS
                                  for a in attempts)
