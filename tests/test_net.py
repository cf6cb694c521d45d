"""scanner.net: free ports outside the ephemeral range, and a start retried on a fresh port when
its port was taken (PortInUse) and only then."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from scanner import net
from scanner.errors import InternalError, PortInUse
from scanner.runtime.process import ManagedProcess


@contextmanager
def held(port: int = 0) -> Iterator[int]:
    """A loopback port held by a listening socket of the test's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield int(s.getsockname()[1])


def test_free_ports_are_outside_the_ephemeral_range_bindable_and_never_handed_out_twice() -> None:
    low, high = net.ephemeral_range()
    ports = [net.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]
    assert all(net.LOWEST <= p <= net.HIGHEST for p in ports)
    assert all(net.bindable("127.0.0.1", p) for p in ports[-20:])


def test_the_pick_range_is_the_larger_side_of_the_ephemeral_range(tmp_path: Path) -> None:
    assert net.pick_range((32768, 60999)) == (10000, 32767)
    assert net.pick_range((10500, 40000)) == (40001, 65535)      # little room below: above it
    assert net.pick_range((1024, 65535)) == (10000, 65535)        # no room outside: all, retries recover
    odd = tmp_path / "range"
    odd.write_text("garbage\n")
    assert net.ephemeral_range(odd) == net.LINUX_EPHEMERAL
    odd.write_text("50000 40000\n")
    assert net.ephemeral_range(odd) == net.LINUX_EPHEMERAL


def test_free_port_skips_a_port_that_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    with held() as taken:
        free = net.free_port()      # any free one, to offer second
        monkeypatch.setattr(net, "_handed", set())   # as if never handed out
        offered = iter([taken, free])
        monkeypatch.setattr(net.random, "randint", lambda _a, _b: next(offered))
        assert net.free_port() == free


def test_a_start_on_a_taken_port_is_retried_on_another_port() -> None:
    tried: list[int] = []

    def start(port: int) -> socket.socket:   # a server that binds its port, as NGINX does
        tried.append(port)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            s.close()
            raise PortInUse(str(exc)) from None
        return s

    with held() as taken:
        server = net.on_free_port(start, taken)
        with server:
            assert tried[0] == taken
            assert server.getsockname()[1] == tried[-1] != taken
            assert len(tried) == 2


def test_a_failure_that_is_not_a_taken_port_is_not_retried() -> None:
    calls: list[int] = []

    def start(port: int) -> None:
        calls.append(port)
        raise InternalError("the config is wrong")

    with pytest.raises(InternalError, match="the config is wrong"):
        net.on_free_port(start)
    assert len(calls) == 1


def test_the_retries_are_bounded() -> None:
    calls: list[int] = []

    def start(port: int) -> None:
        calls.append(port)
        raise PortInUse("taken")

    with pytest.raises(PortInUse, match="no port could be bound"):
        net.on_free_port(start, attempts=3)
    assert len(calls) == 3 and len(set(calls)) == 3


@pytest.mark.parametrize("line", [
    "nginx: [emerg] bind() to 127.0.0.1:18424 failed (98: Address already in use)",
    "nginx: [emerg] bind() to 127.0.0.1:18424 failed (98: Address in use)",
    "cannot bind '127.0.0.1:19923': Address already in use",
    "# Warning: Could not create server TCP listening socket 127.0.0.1:16447: bind: Address already in use",
    "error while attempting to bind on address ('127.0.0.1', 11752): address already in use",
])
def test_the_servers_bind_failures_are_recognised(line: str) -> None:
    assert net.bind_failed(f"some line\n{line}\nanother")


def test_other_failures_are_not_bind_failures() -> None:
    assert not net.bind_failed("nginx: [emerg] unknown directive \"js_import\" | connect() failed (111: Connection refused)")


SERVER = """
import socket, sys, time
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as exc:
    print(f"cannot listen: {exc.strerror}", flush=True)
    sys.exit(1)
s.listen()
time.sleep(60)
"""


def test_a_process_whose_port_is_taken_is_started_again_on_another(tmp_path: Path) -> None:
    """Its own listener decides it started, not a connect (which another's listener answers too);
    the taken port is seen in its log."""
    tried: list[int] = []

    def start(port: int) -> ManagedProcess:
        tried.append(port)
        return ManagedProcess("server", [sys.executable, "-c", SERVER, str(port)], "127.0.0.1", port,
                              log=tmp_path / f"server-{port}.log").start()

    with held() as taken:
        proc = net.on_free_port(start, taken)
        try:
            assert tried[0] == taken and proc.port == tried[-1] != taken
            assert net.listens(proc._proc.pid if proc._proc else 0, proc.port)
            assert "Address already in use" in (tmp_path / f"server-{taken}.log").read_text()
        finally:
            proc.stop()


def test_a_process_that_fails_otherwise_is_not_started_again(tmp_path: Path) -> None:
    tried: list[int] = []

    def start(port: int) -> ManagedProcess:
        tried.append(port)
        return ManagedProcess("broken", [sys.executable, "-c", "import sys; print('bad config'); sys.exit(1)"],
                              "127.0.0.1", port, log=tmp_path / "broken.log").start()

    with pytest.raises(InternalError, match="bad config") as info:
        net.on_free_port(start)
    assert not isinstance(info.value, PortInUse)
    assert len(tried) == 1


def test_listens_tells_the_owner_of_a_listener() -> None:
    import os

    with held() as port:
        assert net.listens(os.getpid(), port) in (True, None)   # None: no /proc here
        if sys.platform == "linux":
            assert net.listens(os.getpid(), port) is True
            assert net.listens(1, port) is False
