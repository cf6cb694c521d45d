"""The service's pipelined Redis client (scanner.limiter.resp, store.connect_fast) against a real
redis-server: many calls in flight on one connection, NOSCRIPT, a store stopped or frozen, AUTH,
TLS; every failure the same StoreUnavailableError redis-py's client gives, naming no secret."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from scanner.errors import StoreUnavailableError
from scanner.limiter import config as zones_config
from scanner.limiter import decide, resp, store
from scanner.limiter.config import RateZone
from scanner.runtime.process import ManagedProcess
from tests.limiter.harness import ZONES, redis_process, url


def fast(spec: store.StoreSpec) -> resp.Client:
    return store.connect_fast(spec)


def test_many_calls_in_flight_on_one_connection_are_exact(redis_server: ManagedProcess) -> None:
    """200 at once, pipelined: every one answered in order, the limit exact (burst 49: 50)."""
    zone = RateZone("fast-flood", rps=0.001, burst=49)

    async def go() -> tuple[int, int]:
        client = fast(store.StoreSpec(url(redis_server)))
        try:
            answers = await asyncio.gather(*(store.take(client, zone, "k", 1) for _ in range(200)))
            lefts = sorted(a.left for a in answers if a.admitted)
            return [a.admitted for a in answers].count(True), len(set(lefts))
        finally:
            await client.aclose()

    assert asyncio.run(go()) == (50, 50)


def test_a_reservation_over_three_zones_through_the_fast_client(redis_server: ManagedProcess) -> None:
    config = zones_config.parse(ZONES)
    calls = [decide.Call("rate:2/3", "fk"), decide.Call("conc:2", "fk"), decide.Call("tokens:600", "fk", 500)]

    async def go() -> tuple[bool, bool, str]:
        client = fast(store.StoreSpec(url(redis_server)))
        try:
            first = await decide.acquire(client, config, calls, "a")
            second = await decide.acquire(client, config, calls, "b")     # 500 + 500 > 600 tokens
            return first.admitted, second.admitted, second.refusal.reason if second.refusal else ""
        finally:
            await client.aclose()

    assert asyncio.run(go()) == (True, False, "token-budget")


def test_noscript_falls_back_to_eval(redis_server: ManagedProcess) -> None:
    zone = RateZone("fast-noscript", rps=1, burst=1)

    async def go() -> tuple[bool, bool]:
        client = fast(store.StoreSpec(url(redis_server)))
        try:
            first = await store.take(client, zone, "k", 1)
            await client.execute("SCRIPT", "FLUSH")
            second = await store.take(client, zone, "k", 1)       # EVALSHA -> NOSCRIPT -> EVAL
            return first.admitted, second.admitted
        finally:
            await client.aclose()

    assert asyncio.run(go()) == (True, True)


def test_store_stopped_is_unavailable_without_secrets(tmp_path: Path) -> None:
    proc = redis_process(tmp_path).start()
    zone = RateZone("fast-down", rps=1, burst=1)

    async def go() -> list[str]:
        client = fast(store.StoreSpec(url(proc)))
        try:
            assert (await store.take(client, zone, "k", 1)).admitted
            proc.stop()
            out = []
            for _ in range(2):     # the lost connection, then a refused one
                with pytest.raises(StoreUnavailableError) as err:
                    await store.take(client, zone, "k", 1)
                out.append(str(err.value))
            return out
        finally:
            await client.aclose()

    try:
        messages = asyncio.run(go())
    finally:
        proc.stop()
    assert all(m.startswith("shared store unavailable (") and "127.0.0.1" not in m for m in messages)


def test_a_frozen_store_times_out_then_recovers(tmp_path: Path) -> None:
    """Redis stopped with SIGSTOP: every call waiting fails within the timeout (never admitted);
    continued, the next call connects anew and is answered."""
    proc = redis_process(tmp_path).start()
    zone = RateZone("fast-frozen", rps=1000, burst=1000)
    pid = proc._proc.pid if proc._proc else 0

    async def go() -> tuple[int, float, bool]:
        client = fast(store.StoreSpec(url(proc), timeout_s=0.3))
        try:
            assert (await store.take(client, zone, "k", 1)).admitted
            os.kill(pid, signal.SIGSTOP)
            t = time.monotonic()
            try:
                answers = await asyncio.gather(*(store.take(client, zone, "k", 1) for _ in range(5)),
                                               return_exceptions=True)
            finally:
                os.kill(pid, signal.SIGCONT)
            waited = time.monotonic() - t
            failed = sum(isinstance(a, StoreUnavailableError) for a in answers)
            return failed, waited, (await store.take(client, zone, "k", 1)).admitted
        finally:
            await client.aclose()

    try:
        failed, waited, after = asyncio.run(go())
    finally:
        proc.stop()
    assert failed == 5 and waited < 2.0 and after


def test_password_file(tmp_path: Path) -> None:
    proc = redis_process(tmp_path, ("--requirepass", "s3cret-pass")).start()
    (tmp_path / "pw").write_text("s3cret-pass\n")
    (tmp_path / "wrong").write_text("nope\n")

    async def go(pw: str | None) -> None:
        client = fast(store.StoreSpec(url(proc), password_file=tmp_path / pw if pw else None))
        try:
            await store.ping(client)
        finally:
            await client.aclose()

    try:
        asyncio.run(go("pw"))
        for bad in ("wrong", None):
            with pytest.raises(StoreUnavailableError) as err:
                asyncio.run(go(bad))
            assert "nope" not in str(err.value) and "s3cret" not in str(err.value)
    finally:
        proc.stop()


def test_tls_with_a_ca_file(tmp_path: Path) -> None:
    """rediss:// with a CA file: verified against that CA and the host name; without it the
    system CAs do not know the server: unavailable, never an unverified connection."""
    from scanner.net import free_port
    from tests.generate.certs import CertAuthority
    from tests.limiter.harness import redis_binary

    ca = CertAuthority(tmp_path)
    server = ca.issue("redis", dns=("localhost",), ips=("127.0.0.1",))
    port = free_port()
    argv = [redis_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path), "--tls-cert-file", str(server.cert),
            "--tls-key-file", str(server.key), "--tls-ca-cert-file", str(ca.pair.cert), "--tls-auth-clients", "no"]
    proc = ManagedProcess("redis-tls", argv, "127.0.0.1", port, log=tmp_path / "redis.log").start()

    async def go(ca_file: Path | None) -> bool:
        client = fast(store.StoreSpec(f"rediss://localhost:{port}/0", ca_file=ca_file))
        try:
            return (await store.take(client, RateZone("tls", 1, 1), "k", 1)).admitted
        finally:
            await client.aclose()

    try:
        assert asyncio.run(go(ca.pair.cert)) is True
        with pytest.raises(StoreUnavailableError):
            asyncio.run(go(None))
    finally:
        proc.stop()
