"""A fleet on one machine (``verify --replicas N`` and the tests): one redis-server, one limiter
(``vllm-perimeter limiter``) with the zones file ``generate`` wrote, and N replicas of one proxy,
each the same plan on its own loopback port. Every process on a random free loopback port,
stopped by its process group.

    fleet = Fleet.plan_for(plan, replicas=2)          # the plan with the fleet's addresses
    with Fleet(fleet_plan, proxy, directory) as f:    # redis, limiter, replicas started
        f.urls                                        # one base URL per replica
        f.redis.stop()                                # the store gone mid-run
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from scanner.errors import UsageError
from scanner.generate.shared import ZONES_FILE
from scanner.plan.model import Plan
from scanner.policy.model import Shared
from scanner.runtime.process import ManagedProcess
from scanner.runtime.proxy import Proxy


def redis_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise UsageError("a fleet needs redis-server (apt-get install redis-server)")
    return path


def redis_process(directory: Path, port: int) -> ManagedProcess:
    """redis-server on ``port`` on loopback, no persistence."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(directory)]
    return ManagedProcess("redis-server", argv, "127.0.0.1", port, log=directory / "redis.log")


def limiter_process(directory: Path, redis_url: str, zones_file: Path, port: int) -> ManagedProcess:
    argv = [sys.executable, "-m", "scanner.cli.main", "limiter", "--redis", redis_url,
            "--zones", str(zones_file), "--listen", f"127.0.0.1:{port}"]
    return ManagedProcess("limiter", argv, "127.0.0.1", port, log=directory / "limiter.log")


def plan_for(plan: Plan, replicas: int, redis_port: int, limiter_port: int) -> Plan:
    """``plan`` for a fleet of ``replicas`` on this machine: the limiter on ``limiter_port``,
    Redis on ``redis_port`` (the policy's ``on_unavailable`` kept; ``deny`` for a plan without
    ``shared:``). The shared zones are the plan's own (scanner.plan.build)."""
    from scanner.plan.build import shared_plan

    old = plan.shared
    shared = Shared(redis=f"redis://127.0.0.1:{redis_port}/0", limiter=("127.0.0.1", limiter_port),
                    on_unavailable=old.on_unavailable if old else "deny", replicas=replicas)
    return replace(plan, shared=shared_plan(plan, shared, "the fleet"))


def replica(plan: Plan, port: int) -> Plan:
    """The same plan listening on ``port`` (each replica of a fleet on this machine)."""
    return replace(plan, listen=replace(plan.listen, port=port))


class Fleet:
    """Redis, the limiter and ``len(ports)`` replicas of ``proxy`` for a fleet plan (plan_for);
    :meth:`write` first (the limiter reads the first replica's zones file)."""

    def __init__(self, plan: Plan, proxy: Proxy, directory: Path, ports: tuple[int, ...]) -> None:
        shared = plan.shared
        if shared is None:
            raise UsageError("a fleet needs a plan with shared limits")
        self.plan, self.proxy, self.directory, self.ports = plan, proxy, directory, ports
        self.redis_port = int(shared.redis.rsplit(":", 1)[1].split("/")[0])
        self.redis = redis_process(directory / "redis", self.redis_port)
        self.limiter = limiter_process(directory, shared.redis, directory / ZONES_FILE, shared.limiter[1])
        self.replicas: list[ManagedProcess] = []
        self.dirs = [directory / f"replica{i + 1}" for i in range(len(ports))]
        self.written: list[Path] = []

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(f"http://127.0.0.1:{p}" for p in self.ports)

    def write(self) -> list[Path]:
        """Each replica's config (its own port); the generated directories (editable: mutants)."""
        pairs = zip(self.ports, self.dirs, strict=True)
        self.written = [self.proxy.write(replica(self.plan, port), d) for port, d in pairs]
        return self.written

    def zones(self) -> None:
        """The limiter's zones file: the one generate wrote (the same in every replica's directory),
        with any zone a replica's files name besides (a mutant's own keys: scanner.mutate.fleet)."""
        merged: dict[str, object] = {}
        first: dict[str, object] = {}
        for d in self.written:
            doc = json.loads((d / ZONES_FILE).read_text(encoding="utf-8"))
            first = first or doc
            merged.update(doc["zones"])
        text = json.dumps({**first, "zones": merged}, indent=2, sort_keys=True)
        (self.directory / ZONES_FILE).write_text(text, encoding="utf-8")

    def start(self) -> Fleet:
        """Redis, the limiter, the replicas; all stopped again when one cannot start (its port
        taken: PortInUse, and the caller starts a fleet on fresh ports, scanner.net.on_free_port)."""
        self.zones()
        try:
            self.redis.start()
            self.limiter.start()
            for port, d in zip(self.ports, self.dirs, strict=True):
                self.replicas.append(self.proxy.start(replica(self.plan, port), d).start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in (*self.replicas, self.limiter, self.redis):
            proc.stop()
        self.replicas = []

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
