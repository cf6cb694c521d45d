"""netscan against listeners the tests open on 127.0.0.1 (no other address is ever probed)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner.cli.main import main
from scanner.documents import validate
from scanner.errors import UsageError
from scanner.netscan import ports as port_sets
from scanner.netscan import scan as scan_mod
from scanner.netscan.model import PortAttempt, ScanVantage
from scanner.netscan.policy import findings, networks_of, port_policy
from scanner.policy.load import loads

POLICY = """\
schema_version: 1
name: ports-test
networks:
  loop: [127.0.0.0/8]
  admin: [10.9.0.0/24]
audiences:
  none: {kind: none}
routes:
  - {path: /x, audience: none}
ports:
  allow:
    - {port: %d, networks: [loop], note: the test's allowed listener}
    - {port: 29500, networks: [admin]}
"""


@pytest.fixture
def listener() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield int(sock.getsockname()[1])
    sock.close()


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_connect_finds_open_and_closed(listener: int, closed_port: int,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["netscan", "127.0.0.1", "--method", "connect", "--format", "json",
                      "--ports", f"{listener},{closed_port}", "--timeout", "0.5"], capsys)
    doc = json.loads(out)
    validate("netscan-result", doc, "netscan output")   # the published schema holds
    states = {a["port"]: (a["state"], a["method"], a["reason"]) for a in doc["attempts"]}
    assert states[listener] == ("open", "connect", "connected")
    assert states[closed_port] == ("closed", "connect", "refused")
    assert doc["method"] == "connect" and "--method connect" in doc["method_note"]
    assert all(a["latency_ms"] >= 0 for a in doc["attempts"])
    # The bundled policy has no ports: section: only its proxy port (8080) may answer.
    assert [f["port"] for f in doc["findings"]] == [listener]
    assert doc["findings"][0]["severity"] == "medium" and rc == 0  # default --fail-on high
    for fail_on, expected in (("medium", 1), ("low", 1), ("none", 0)):
        rc, _, _ = run(["netscan", "127.0.0.1", "--method", "connect", "--ports", str(listener),
                        "--fail-on", fail_on], capsys)
        assert rc == expected, fail_on


def test_policy_allows_port_from_vantage_network(listener: int, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY % listener)
    rc, out, _ = run(["netscan", "127.0.0.1", "--method", "connect", "--ports", str(listener),
                      "--policy", str(policy), "--format", "json", "--fail-on", "info"], capsys)
    doc = json.loads(out)
    assert doc["vantage"]["networks"] == ["loop"] and doc["findings"] == [] and rc == 0
    # From a vantage declared to be in admin only, the same port is a finding.
    rc, out, _ = run(["netscan", "127.0.0.1", "--method", "connect", "--ports", str(listener),
                      "--policy", str(policy), "--vantage", "admin", "--fail-on", "medium",
                      "-o", str(tmp_path / "r.txt")], capsys)
    assert rc == 1
    text = (tmp_path / "r.txt").read_text()
    assert "MEDIUM NS001" in text and "only from loop" in text


def test_fallback_to_connect_says_so(listener: int, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(scan_mod.syn, "unavailable_reason", lambda: "not root")
    rc, out, _ = run(["netscan", "127.0.0.1", "--ports", str(listener)], capsys)
    assert "method: connect - connect() FALLBACK: raw SYN not possible (not root)" in out
    rc, _, err = run(["netscan", "127.0.0.1", "--ports", str(listener), "--method", "syn"], capsys)
    assert rc == 2 and err.strip() == "error: --method syn is not possible here: not root"


@pytest.mark.parametrize("argv, message", [
    (["--ports", "70000"], "'70000' is not a TCP port"),
    (["--ports", "9-1"], "runs backwards"),
    (["--ports", "1-2000"], "more than --max-ports 1024"),
    (["--source", "nope"], "--source 'nope' is not an IP address"),
    (["--source", "192.0.2.77"], "--source 192.0.2.77 is not an address of this host"),
    (["--interface", "nosuchif0"], "no such network interface"),
    (["--source", "::1"], "--source ::1 is IPv6 but 127.0.0.1 is IPv4"),
    (["--timeout", "0"], "--timeout must be"),
    (["--vantage", "nosuch"], "--vantage 'nosuch' is not a network"),
])
def test_bad_input_exit_2_one_line(argv: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["netscan", "127.0.0.1", "--method", "connect", *argv], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_unresolvable_host_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["netscan", "no-such-host.invalid", "--ports", "1"], capsys)
    assert rc == 3 and "cannot resolve" in err


def test_parse_ports_and_defaults() -> None:
    assert port_sets.parse_ports("8000, 29500-29502,8000") == (8000, 29500, 29501, 29502)
    assert port_sets.parse_ports("1-5", max_ports=5) == (1, 2, 3, 4, 5)
    with pytest.raises(UsageError):
        port_sets.parse_ports("1-6", max_ports=5)
    defaults = port_sets.default_ports()
    for port in (8000, 29500, 29550, 14579, 5600, 6379, 8265, 10001):
        assert port in defaults
    assert all(k.note for k in port_sets.KNOWN_PORTS)


def test_severity_high_for_internal_ports_medium_otherwise() -> None:
    policy = loads(POLICY % 1)
    vantage = ScanVantage("127.0.0.1", networks=networks_of("127.0.0.1", policy.networks))
    attempts = [PortAttempt(p, "open", "syn", "syn-ack", 0.1) for p in (1, 29500, 6379, 8000, 12345)]
    attempts.append(PortAttempt(5600, "closed", "syn", "rst", 0.1))
    got = {f.port: f.severity for f in findings("h", attempts, vantage, port_policy(policy))}
    assert got == {29500: "high", 6379: "high", 8000: "high", 12345: "medium"}


def test_unreachable_verdict() -> None:
    assert scan_mod.unreachable((PortAttempt(1, "filtered", "connect", "net-unreachable"),))
    assert not scan_mod.unreachable((PortAttempt(1, "filtered", "connect", "timeout"),))
    assert not scan_mod.unreachable(())


def test_raw_syn_on_loopback(listener: int, closed_port: int) -> None:
    """Root only: raw SYNs to 127.0.0.1 (PF_INET raw sender, BPF-filtered raw listeners)."""
    from scanner.netscan import syn

    why = syn.unavailable_reason()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"raw SYN must run under CI: {why}")
        pytest.skip(f"raw SYN not possible: {why}")
    got = {a.port: (a.state, a.reason) for a in syn.scan("127.0.0.1", (listener, closed_port), 2.0)}
    assert got == {listener: ("open", "syn-ack"), closed_port: ("closed", "rst")}


def _ipv4(src: str, dst: str, proto: int, payload: bytes) -> bytes:
    import struct
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, proto, 0,
                       socket.inet_aton(src), socket.inet_aton(dst)) + payload


def _tcp(sport: int, dport: int, flags: int) -> bytes:
    import struct
    return struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 0x50, flags, 0, 0, 0)


def test_syn_answer_parsing() -> None:
    from scanner.netscan.syn import parse

    target = socket.inet_aton("10.0.0.2")
    assert parse(_ipv4("10.0.0.2", "10.0.0.1", 6, _tcp(80, 61001, 0x12)), target) == \
        ((61001, 80), "open", "syn-ack")
    assert parse(_ipv4("10.0.0.2", "10.0.0.1", 6, _tcp(81, 61002, 0x14)), target) == \
        ((61002, 81), "closed", "rst")
    assert parse(_ipv4("10.0.0.3", "10.0.0.1", 6, _tcp(80, 61001, 0x12)), target) is None  # other host
    assert parse(_ipv4("10.0.0.2", "10.0.0.1", 6, _tcp(80, 61001, 0x18)), target) is None  # data
    quoted = _ipv4("10.0.0.1", "10.0.0.2", 6, _tcp(61003, 82, 0x02))[:28]
    for code, reason in ((1, "host-unreachable"), (13, "icmp-unreachable-13")):
        icmp = bytes([3, code, 0, 0, 0, 0, 0, 0]) + quoted
        assert parse(_ipv4("10.0.0.254", "10.0.0.1", 1, icmp), target) == ((61003, 82), "filtered", reason)
    assert parse(b"\x60" + bytes(39), target) is None  # IPv6
