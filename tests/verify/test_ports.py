"""``verify`` when the port it picked for the proxy is taken before the proxy binds it (another
process's listener, as under pytest-xdist or a user's CI): the proxy starts on another port, its
config written again (a mutant's weakened again), and the run is the same."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scanner import net
from scanner.errors import InternalError
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.plan.model import Plan
from scanner.probe.interface import ProbeOptions
from scanner.runtime.process import ManagedProcess
from scanner.runtime.proxy import Proxy
from scanner.verify import loop, mutation
from tests.verify.installed import installed

OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("matrix",))


@contextmanager
def held() -> Iterator[int]:
    """A free port held by a listener of the test's (answering no HTTP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", net.free_port()))
        s.listen()
        yield int(s.getsockname()[1])


@dataclass(frozen=True)
class Recording:
    """``inner``, recording the port of each start."""

    inner: Proxy
    ports: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def kind(self) -> str:
        return self.inner.kind

    def write(self, plan: Plan, directory: Path) -> Path:
        return self.inner.write(plan, directory)

    def validate(self, plan: Plan, directory: Path) -> str:
        return self.inner.validate(plan, directory)

    def start(self, plan: Plan, directory: Path) -> ManagedProcess:
        self.ports.append(plan.listen.port)
        return self.inner.start(plan, directory)


@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_a_proxy_whose_port_is_taken_runs_on_another(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = Recording(installed(name))
    with held() as taken:
        picks = iter([taken])
        monkeypatch.setattr(loop, "free_port", lambda host="127.0.0.1": next(picks, 0) or net.free_port(host))
        runs, mutants = mutation.mutants(load_ref("vllm-0.29.0-default"), load_policy(None), [proxy], OPTIONS,
                                         only=(f"{proxy.kind}.key-check-removed",))
    # the plan named the taken port: the unmutated proxy and the mutant each tried it, then ran elsewhere
    assert proxy.ports[::2] == [taken, taken] and len(proxy.ports) == 4, (taken, proxy.ports)
    assert taken not in proxy.ports[1::2], (taken, proxy.ports)
    base = runs[0].result
    assert not base.deviations and not base.unreachable, [f.title for f in base.findings] or base.reason
    assert any(c.status == "proved" for c in base.coverage)
    assert [(m.status, m.expected) for m in mutants] == [("caught", True)], mutants


def test_a_start_that_fails_otherwise_is_not_retried(tmp_path: Path) -> None:
    """A config the proxy rejects is an error at once: no second port tried."""
    proxy = Recording(installed("nginx"))
    s = loop.setup(load_ref("vllm-0.29.0-default"), load_policy(None), tmp_path, net.free_port())
    conf = proxy.write(s.plan, tmp_path / "proxy")
    (conf / "nginx.conf").write_text("events {}\nhttp { server { listen 127.0.0.1:"
                                     f"{s.plan.listen.port}; nonsense_directive on; }} }}\n")
    with ExitStack() as stack, pytest.raises(InternalError, match="rejected"):
        loop.start_checked(proxy, s.plan, tmp_path / "proxy", stack)
    assert proxy.ports == []


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_a_proxy_that_finds_its_port_taken_as_it_binds_moves(name: str, tmp_path: Path) -> None:
    """The port taken between the pick and the proxy's bind (a connect to it succeeds: another's
    listener answers, no HTTP): the proxy's own log says so (NGINX "bind() ... (98: Address [already] in use)", Envoy "cannot bind"), it is
    stopped at once (NGINX would try for 2.5 s) and started on another port."""
    import http.client

    from scanner.runtime import fleet

    proxy = Recording(installed(name))
    s = loop.setup(load_ref("vllm-0.29.0-default"), load_policy(None), tmp_path, net.free_port())
    with held() as taken, ExitStack() as stack:
        plan = fleet.replica(s.plan, taken)
        proxy.write(plan, tmp_path / "proxy")
        now = loop.start_checked(proxy, plan, tmp_path / "proxy", stack)
        assert proxy.ports == [taken, now.listen.port] and now.listen.port != taken
        conn = http.client.HTTPConnection("127.0.0.1", now.listen.port, timeout=10)
        try:
            conn.request("GET", "/v1/models")   # no key, from outside every network: refused by the proxy
            assert conn.getresponse().status in (401, 403)
        finally:
            conn.close()
