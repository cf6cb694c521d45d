"""Raw-SYN netscan between two network namespaces the test creates (and deletes).

Topology, inside the namespaces only: ``vpa`` (10.231.0.1/30 and 10.231.0.9/32, the
scanner) -- veth -- ``vpb`` (10.231.0.2/30, a listener on one port). Runs as root with
``ip netns``; elsewhere it skips, except under CI=true (CI runs as root), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).with_name("vllm-perimeter"))
OPEN, CLOSED = 18080, 18081
POLICY = """\
schema_version: 1
name: netns-test
networks:
  inner: [10.231.0.0/30]
  admin: [10.231.0.9/32]
audiences:
  none: {kind: none}
routes:
  - {path: /x, audience: none}
ports:
  allow:
    - {port: 18080, networks: [admin]}
"""
LISTENER = ("import socket,sys,time; s=socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('10.231.0.2', {OPEN})); s.listen(8); print('ready', flush=True); time.sleep(120)")


@dataclass(frozen=True)
class Pair:
    scanner: str
    target: str
    veth: str        # the scanner's interface


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=20)


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` (apt-get install iproute2)"
    return None


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    why = _unavailable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"netns test cannot run under CI: {why}")
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}"
    p = Pair(scanner=f"vpa{tag}", target=f"vpb{tag}", veth=f"vpa{tag}v")
    peer = f"vpb{tag}v"
    listener = None
    try:
        _sh("ip", "netns", "add", p.scanner)
        _sh("ip", "netns", "add", p.target)
        _sh("ip", "-n", p.scanner, "link", "add", p.veth, "type", "veth", "peer", "name", peer,
            "netns", p.target)
        for ns, dev, addrs in ((p.scanner, p.veth, ("10.231.0.1/30", "10.231.0.9/32")),
                               (p.target, peer, ("10.231.0.2/30",))):
            for addr in addrs:
                _sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", p.target, "route", "add", "10.231.0.9/32", "dev", peer)
        listener = subprocess.Popen(["ip", "netns", "exec", p.target, sys.executable, "-c", LISTENER],
                                    stdout=subprocess.PIPE, text=True)
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        yield p
    except subprocess.CalledProcessError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"network namespaces unavailable: {exc.stderr.strip()}")
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(timeout=10)
        for ns in (p.scanner, p.target):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=20)


def netscan(p: Pair, *argv: str, tmp: Path) -> tuple[int, dict[str, object] | None, str]:
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    proc = subprocess.run(["ip", "netns", "exec", p.scanner, CLI, "netscan", *argv,
                           "--policy", str(policy), "--format", "json", "--timeout", "1"],
                          capture_output=True, text=True, timeout=60, check=False)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, doc, proc.stderr


def states(doc: dict[str, object] | None) -> dict[int, tuple[str, str, str]]:
    assert doc is not None
    return {a["port"]: (a["state"], a["method"], a["reason"]) for a in doc["attempts"]}  # type: ignore[attr-defined]


def test_raw_syn_open_closed_and_policy_finding(pair: Pair, tmp_path: Path) -> None:
    rc, doc, err = netscan(pair, "10.231.0.2", "--ports", f"{OPEN},{CLOSED}", "--method", "syn",
                           "--fail-on", "medium", tmp=tmp_path)
    assert states(doc) == {OPEN: ("open", "syn", "syn-ack"), CLOSED: ("closed", "syn", "rst")}, err
    assert doc is not None and doc["method"] == "syn"
    assert doc["vantage"] == {"address": "10.231.0.1", "interface": "", "networks": ["inner"]}
    # OPEN may answer only the admin network; from 10.231.0.1 (inner) it is a finding.
    assert [f["port"] for f in doc["findings"]] == [OPEN] and rc == 1  # type: ignore[attr-defined]


def test_raw_syn_from_source_address(pair: Pair, tmp_path: Path) -> None:
    rc, doc, err = netscan(pair, "10.231.0.2", "--ports", f"{OPEN},{CLOSED}", "--method", "syn",
                           "--source", "10.231.0.9", "--fail-on", "info", tmp=tmp_path)
    assert states(doc)[OPEN] == ("open", "syn", "syn-ack"), err
    assert doc is not None and doc["vantage"]["address"] == "10.231.0.9"  # type: ignore[index]
    assert doc["findings"] == [] and rc == 0   # admin may reach OPEN


def test_raw_syn_from_interface_and_connect(pair: Pair, tmp_path: Path) -> None:
    _, doc, err = netscan(pair, "10.231.0.2", "--ports", f"{OPEN},{CLOSED}", "--method", "syn",
                          "--interface", pair.veth, tmp=tmp_path)
    assert states(doc) == {OPEN: ("open", "syn", "syn-ack"), CLOSED: ("closed", "syn", "rst")}, err
    _, doc, err = netscan(pair, "10.231.0.2", "--ports", f"{OPEN},{CLOSED}", "--method", "connect",
                          "--source", "10.231.0.9", tmp=tmp_path)
    assert states(doc) == {OPEN: ("open", "connect", "connected"),
                           CLOSED: ("closed", "connect", "refused")}, err


def test_no_route_is_exit_3(pair: Pair, tmp_path: Path) -> None:
    # 10.231.1.1 has no route inside the scanner namespace: the kernel refuses before sending.
    for method in ("syn", "connect"):
        rc, doc, err = netscan(pair, "10.231.1.1", "--ports", "80", "--method", method, tmp=tmp_path)
        assert rc == 3 and doc is None and "unreachable" in err and len(err.strip().splitlines()) == 1
