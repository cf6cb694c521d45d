"""netscan --identify names what answers the HTTP/2 preface on an open port (issue 11, item 4):
against the real Envoy 1.40 on 127.0.0.1, once with the generated HTTP/1.1-only listener and
once with the ``codec_type: AUTO`` mutant (an h2c listener, as a gRPC server is); the policy's
``ports:`` decides an h2c port like any other."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from scanner import mutate
from scanner.cli.main import main
from scanner.documents import validate
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.netscan import identify
from scanner.netscan.scan import ScanRequest, run
from scanner.plan.inputs import load_policy
from scanner.policy.load import loads
from scanner.runtime.proxy import EnvoyProxy
from scanner.verify import loop

POLICY = """\
schema_version: 1
name: h2c-test
networks:
  loop: [127.0.0.0/8]
audiences:
  none: {kind: none}
routes:
  - {path: /x, audience: none}
ports:
  allow:
    - {port: %d, networks: [loop]}
"""


def _envoy(tmp_path: Path, mutant: str, stack: ExitStack) -> int:
    tmp_path.mkdir()
    s = loop.setup(load_ref("vllm-0.29.0-default"), load_policy(None), tmp_path, free_port())
    proxy = EnvoyProxy()
    directory = tmp_path / "proxy"
    files = proxy.write(s.plan, directory)
    if mutant:
        mutate.OPERATORS[f"envoy.{mutant}"].apply(files, s.plan)
    loop.start_checked(proxy, s.plan, directory, stack)
    return s.plan.listen.port


@pytest.fixture
def silent() -> Iterator[int]:
    """A listener that accepts and never says anything."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield int(sock.getsockname()[1])
    sock.close()


def test_the_preface_answer_is_named() -> None:
    assert identify.classify(b"\0\0\x06\x04\0\0\0\0\0") == "h2c"
    assert identify.classify(b"HTTP/1.1 400 Bad Request\r\n") == "http/1.1"
    assert identify.classify(b"\x15\x03\x01\x00\x02") == "" and identify.classify(b"") == ""
    assert identify.classify(b"\0\0\x06\x04\0\0\0\0\x01") == ""     # SETTINGS on a stream: not a server's


def test_netscan_identifies_an_h2c_listener_and_an_http1_one(tmp_path: Path, silent: int,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with ExitStack() as stack:
        h2 = _envoy(tmp_path / "auto", "h2c-accepted", stack)
        h1 = _envoy(tmp_path / "http1", "", stack)
        allowed = loads(POLICY % h1)
        result = run(ScanRequest("127.0.0.1", (h2, h1, silent), method="connect", timeout=1.0,
                                 identify=True), allowed)
        speaks = {a.port: (a.state, a.service) for a in result.attempts}
        assert speaks == {h2: ("open", "h2c"), h1: ("open", "http/1.1"), silent: ("open", "")}
        # ports: decides an h2c port like any other: only the allowed one is quiet
        assert sorted(f.port for f in result.findings) == sorted((h2, silent))
        assert "HTTP/2 in clear text" in next(f.detail for f in result.findings if f.port == h2)
        # without --identify nothing is sent to an open port
        plain = run(ScanRequest("127.0.0.1", (h2,), method="connect", timeout=1.0), allowed)
        assert plain.attempts[0].service == ""
        with pytest.raises(SystemExit):
            main(["netscan", "127.0.0.1", "--method", "connect", "--identify", "--format", "json",
                  "--ports", str(h2), "--timeout", "1"])
        doc = json.loads(capsys.readouterr().out)
        validate("netscan-result", doc, "netscan output")
        assert doc["attempts"][0]["service"] == "h2c"
