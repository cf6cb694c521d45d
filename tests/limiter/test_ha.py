"""The limiter on a highly available Redis (issue 27, item 6), with Debian's redis-server started
here on loopback: a Redis Cluster of three masters (redis+cluster://) and Sentinel (one master,
one replica, one sentinel: redis+sentinel://) failed over while traffic flows. Every process is
started on a port from scanner.net (moved when taken) and stopped by its process group."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from scanner.limiter import config as zones_config
from scanner.limiter import decide, keys, store
from scanner.net import free_port
from scanner.runtime.process import ManagedProcess
from tests.limiter.clients import HttpClient
from tests.limiter.harness import ZONES, limiter_process, redis_binary, redis_process

RATE_ZONE = "rate:2/3"      # 2 r/s, burst 3: 4 at once
LEASE_S = 1.5
ZONES_HA = {**ZONES, "slot_lease_s": LEASE_S}


def cli(port: int, *args: str) -> str:
    """redis-cli against a loopback port (bounded)."""
    binary = shutil.which("redis-cli")
    assert binary, "redis-cli comes with redis-server (redis-tools)"
    out = subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True,
                         text=True, timeout=20, check=False)
    return out.stdout.strip()


def wait_for(what: str, check: object, timeout_s: float = 20.0) -> None:
    assert callable(check)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


# --- Redis Cluster -----------------------------------------------------------------------------

def cluster_node(directory: Path) -> ManagedProcess:
    """One cluster-enabled redis-server; its bus port picked beside it (moved with it)."""
    directory.mkdir(parents=True, exist_ok=True)
    proc = redis_process(directory, ("--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                                     "--cluster-config-file", str(directory / "nodes.conf")))
    argv_for = proc.argv_for
    assert argv_for is not None

    def argv(port: int) -> list[str]:
        return [*argv_for(port), "--cluster-port", str(free_port())]

    proc.argv_for = argv
    return proc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ManagedProcess]]:
    """Three masters, the 16384 slots split between them (redis-cli --cluster create)."""
    base = Path(tmp_path_factory.mktemp("cluster"))
    with ExitStack() as stack:
        nodes = [stack.enter_context(cluster_node(base / f"n{i}")) for i in range(3)]
        created = subprocess.run([shutil.which("redis-cli") or "redis-cli", "--cluster", "create",
                                  *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60, check=False)
        assert created.returncode == 0, created.stdout[-500:] + created.stderr[-500:]
        for n in nodes:
            wait_for(f"cluster_state:ok on {n.port}", lambda n=n: "cluster_state:ok" in cli(n.port, "cluster", "info"))
        yield nodes


def test_a_cluster_spreads_the_keys_and_keeps_each_limit_exact(cluster: list[ManagedProcess],
                                                                tmp_path: Path) -> None:
    """The limiter on redis+cluster://: 30 principals' buckets spread over the three masters, each
    principal admitted exactly burst + 1 at once; a reservation over three zones (one request's
    keys share a slot: the hash tag) admitted once; scripts flushed on every node (NOSCRIPT):
    loaded again per node, the counts unchanged."""
    url = f"redis+cluster://127.0.0.1:{cluster[0].port},127.0.0.1:{cluster[1].port}"
    with limiter_process(tmp_path, url, ZONES_HA) as limiter:
        client = HttpClient("127.0.0.1", limiter.port)
        try:
            def burst(key: str) -> int:
                return sum(client.post("/v1/acquire", {"key": key, "zone": RATE_ZONE})[1]["allow"] is True
                           for _ in range(6))
            admitted = [burst(f"cl-{i}") for i in range(30)]
            per_node = [int(cli(n.port, "dbsize") or 0) for n in cluster]
            three = {"key": "cl-three", "zones": [RATE_ZONE, "conc:2", "tokens:600"], "cost": 500, "slot": "a"}
            first = client.post("/v1/acquire", three)[1]["allow"]
            second = client.post("/v1/acquire", {**three, "slot": "b"})[1]        # 500 + 500 > 600
            for n in cluster:
                assert cli(n.port, "script", "flush") == "OK"
            evals = [eval_calls(n.port) for n in cluster]
            after_flush = [burst(f"cl-flushed-{i}") for i in range(30)]
            evals = [eval_calls(n.port) - before for n, before in zip(cluster, evals, strict=True)]
        finally:
            client.close()
    assert admitted == [4] * 30
    assert all(count > 0 for count in per_node) and sum(per_node) >= 30
    assert first is True and second["allow"] is False and second["reason"] == "token-budget"
    assert after_flush == [4] * 30 and all(n >= 1 for n in evals), evals


def test_a_cluster_keeps_the_leases_for_any_limiter(cluster: list[ManagedProcess]) -> None:
    """On a Cluster the owner's index has its own hash slot: INDEX first, then ACQUIRE (one key
    per command); a second limiter (another client, its own session) finds the slot through the
    registry and the index and renews it, without having heard its owner."""
    from scanner.limiter import store
    from scanner.plan.zones import ConcurrencyZone

    url = f"redis+cluster://127.0.0.1:{cluster[0].port},127.0.0.1:{cluster[1].port}"
    zone = ConcurrencyZone("conc:carry", 2, 30.0)

    slots = keys.slots(zone.name, "cl-lease")

    async def go() -> tuple[bool, bool, bool]:
        a = store.connect(store.StoreSpec(url, timeout_s=5.0))
        b = store.connect(store.StoreSpec(url, timeout_s=5.0))
        try:
            taken = await store.reserve(a, [(zone, "cl-lease", 1)], "x1", 1.0, owner="replica:C-1")
            indexed = bool(await b.hexists(keys.leases("replica:C-1"), f"{slots} x1"))
            before = await b.zscore(slots, "x1")
            await asyncio.sleep(0.05)
            await store.renew(b, 1.0)                   # other slots of the module's tests too
            after = await b.zscore(slots, "x1")
            await store.release(a, zone, "cl-lease", "x1")
            return taken.refused is None, indexed, before is not None and after is not None and after > before
        finally:
            await a.aclose()
            await b.aclose()

    assert asyncio.run(go()) == (True, True, True)


def eval_calls(port: int) -> int:
    """How many EVAL a node ran (its command statistics): the NOSCRIPT fallback."""
    line = next((x for x in cli(port, "info", "commandstats").splitlines() if x.startswith("cmdstat_eval:")), "")
    return int(line.split("calls=", 1)[1].split(",", 1)[0]) if line else 0


def test_one_requests_keys_share_a_cluster_slot() -> None:
    from redis.crc import key_slot

    names = [keys.bucket(RATE_ZONE, "p"), keys.slots("conc:2", "p"), keys.bucket("tokens:600", "p")]
    assert len({key_slot(n.encode()) for n in names}) == 1


# --- Sentinel ------------------------------------------------------------------------------------

def sentinel_process(directory: Path, master_port: int) -> ManagedProcess:
    """``redis-server --sentinel`` watching ``mymaster`` (quorum 1) on a free port."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "sentinel.conf"

    def argv(port: int) -> list[str]:
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                        f"sentinel monitor mymaster 127.0.0.1 {master_port} 1\n"
                        "sentinel down-after-milliseconds mymaster 2000\n"
                        "sentinel failover-timeout mymaster 10000\n")
        return [redis_binary(), str(conf), "--sentinel"]

    return ManagedProcess("redis-sentinel", argv(0), "127.0.0.1", free_port(), log=directory / "sentinel.log",
                          argv_for=argv)


# the master refuses writes without a replica in sync: a write the failover would lose (sent to
# the old master after its replica was promoted) is refused instead (NOREPLICAS: 503)
SAFE_WRITES = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")


def test_a_sentinel_failover_under_traffic_admits_at_most_the_policy(tmp_path: Path) -> None:
    """Through the limiter on redis+sentinel://, 20 acquires a second for one principal on a rate
    zone (2 r/s, burst 3) and a concurrency zone (limit 2, each slot released at once) while
    ``SENTINEL FAILOVER`` promotes the replica: what is admitted stays within the policy (burst + 1
    + rate x window), the answers during the switch are 503 (never an admission without Redis),
    the limiter follows the new master, and afterwards the principal gets its slots back."""
    with ExitStack() as stack:
        master = stack.enter_context(redis_process(tmp_path / "master", SAFE_WRITES))
        # (the replica, once promoted, has no replica of its own until sentinel turns the old
        # master into one: it takes writes meanwhile)
        replica = stack.enter_context(redis_process(
            tmp_path / "replica", ("--replicaof", "127.0.0.1", str(master.port))))
        wait_for("the replica in sync", lambda: "master_link_status:up" in cli(replica.port, "info", "replication"))
        sentinel = stack.enter_context(sentinel_process(tmp_path / "sentinel", master.port))
        wait_for("the sentinel knows the replica",
                 lambda: str(replica.port) in cli(sentinel.port, "sentinel", "replicas", "mymaster"))
        url = f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster"
        limiter = stack.enter_context(limiter_process(tmp_path, url, ZONES_HA))

        answers: list[tuple[float, int, bool]] = []

        def traffic(seconds: float) -> None:
            client = HttpClient("127.0.0.1", limiter.port)
            try:
                end = time.monotonic() + seconds
                i = 0
                while time.monotonic() < end:
                    i += 1
                    call = {"key": "sp", "zones": [RATE_ZONE, "conc:2"], "slot": f"s{i}"}
                    status, body = client.post("/v1/acquire", call)
                    answers.append((time.monotonic(), status, body.get("allow") is True))
                    if body.get("allow") is True:
                        client.post("/v1/release", {"key": "sp", "zones": ["conc:2"], "slot": f"s{i}"})
                    time.sleep(0.05)
            finally:
                client.close()

        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            running = pool.submit(traffic, 8.0)
            time.sleep(1.5)
            assert cli(sentinel.port, "sentinel", "failover", "mymaster") == "OK"
            wait_for("the replica promoted",
                     lambda: cli(sentinel.port, "sentinel", "get-master-addr-by-name", "mymaster").split()[-1:]
                     == [str(replica.port)])
            running.result(timeout=30)
        window = answers[-1][0] - started
        admitted = sum(a for _t, _s, a in answers)
        after_switch = [a for t, s, a in answers if t > started + 6.0]
        # the principal is not locked out: past the lease, both slots can be held at once
        time.sleep(LEASE_S + 0.5)
        client = HttpClient("127.0.0.1", limiter.port)
        try:
            held = [client.post("/v1/acquire", {"key": "sp", "zones": ["conc:2"], "slot": f"end{i}"})[1]["allow"]
                    for i in range(3)]
            # the limiter writes to the new master (with the old one a write there would be lost)
            fresh = client.post("/v1/acquire", {"key": "sp-new", "zone": RATE_ZONE})[1]["allow"]
        finally:
            client.close()
        on_new = cli(replica.port, "exists", keys.bucket(RATE_ZONE, "sp-new"))
        role = cli(replica.port, "role").split()[:1]
    policy = 3 + 1 + 2 * window
    statuses = {s for _t, s, _a in answers}
    assert admitted <= policy, (admitted, policy)
    assert statuses <= {200, 503}
    assert role == ["master"] and any(after_switch) and fresh is True
    assert on_new == "1", "the limiter did not follow the new master"
    assert held == [True, True, False]
    print(f"sentinel failover: {admitted} admitted in {window:.2f} s (policy {policy:.1f}), "
          f"{sum(s == 503 for _t, s, _a in answers)} of {len(answers)} answered 503")


def test_the_sentinel_url_reaches_the_master(tmp_path: Path) -> None:
    """store.connect on redis+sentinel://: the decision is taken on the master the sentinel names."""
    with ExitStack() as stack:
        master = stack.enter_context(redis_process(tmp_path / "m"))
        sentinel = stack.enter_context(sentinel_process(tmp_path / "s", master.port))
        config = zones_config.parse(ZONES)

        async def go() -> bool:
            client = store.connect(store.StoreSpec(f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster"))
            try:
                verdict = await decide.acquire(client, config, [decide.Call(RATE_ZONE, "via-sentinel")], "")
                return verdict.admitted
            finally:
                await client.aclose()

        assert asyncio.run(go()) is True
        assert cli(master.port, "exists", keys.bucket(RATE_ZONE, "via-sentinel")) == "1"


# --- two limiters behind Envoy -------------------------------------------------------------------

# the ratelimit filter's gRPC service on a cluster of two limiters: a call whose limiter is gone
# (refused, reset) is sent again to the other one (previous_hosts), once or twice
RETRY = """grpc_service:
                  envoy_grpc: {cluster_name: limiter}
                  retry_policy:
                    num_retries: 2
                    retry_on: connect-failure,refused-stream,reset
                    retry_back_off: {base_interval: 0.005s, max_interval: 0.25s}
                    host_selection_retry_max_attempts: 3
                    retry_host_predicate:
                    - name: envoy.retry_host_predicates.previous_hosts
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"""


@pytest.mark.envoy
@pytest.mark.parametrize("retry", [True, False])
def test_two_limiters_behind_envoy_one_killed_without_503(tmp_path: Path, retry: bool) -> None:
    """Envoy 1.40's limiter cluster with two endpoints (two ``vllm-perimeter limiter`` on one
    Redis) and a retry policy on its gRPC service: one limiter SIGKILLed while 50 requests a second
    flow through Envoy: no 503, and the limit still one limit (a principal's burst + 1 at once).
    Without the retry policy the calls sent to the dead limiter are 503 (what the policy fixes)."""
    import os
    import signal

    from scanner.runtime import envoy
    from tests.limiter.harness import get, url
    from tests.limiter.test_envoy import CONFIG

    with ExitStack() as stack:
        redis = stack.enter_context(redis_process(tmp_path / "redis"))
        for i in range(2):
            (tmp_path / f"limiter{i}").mkdir()
        limiters = [stack.enter_context(limiter_process(tmp_path / f"limiter{i}", url(redis))) for i in range(2)]
        front, back = free_port(), free_port()
        endpoints = ", ".join(f"{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, "
                              f"port_value: {lim.port}}}}}}}}}" for lim in limiters)
        text = (CONFIG.replace("FRONT", str(front)).replace("BACK", str(back))
                .replace("grpc_service: {envoy_grpc: {cluster_name: limiter}}",
                         RETRY if retry else "grpc_service: {envoy_grpc: {cluster_name: limiter}}")
                .replace("endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: "
                         "{address: 127.0.0.1, port_value: LIMITER}}}}]}]", f"endpoints: [{{lb_endpoints: [{endpoints}]}}]"))
        assert (RETRY in text) == retry and str(limiters[1].port) in text
        (tmp_path / "envoy.yaml").write_text(text)
        argv = [envoy.binary(), "-c", str(tmp_path / "envoy.yaml"), "--concurrency", "1",
                "--disable-hot-restart", "--log-level", "warning", "--base-id", str(front)]
        stack.enter_context(ManagedProcess("envoy", argv, "127.0.0.1", front, log=tmp_path / "envoy.log"))
        burst = [get(front, "/rate", {"x-principal": "two"})[0] for _ in range(6)]
        statuses: list[int] = []
        end = time.monotonic() + 3.0
        killed = False
        while time.monotonic() < end:
            if not killed and time.monotonic() > end - 2.0:
                proc = limiters[1]._proc
                assert proc is not None
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
            statuses.append(get(front, "/wide", {"x-principal": f"w{len(statuses) % 7}"})[0])
            time.sleep(0.02)
        after = [get(front, "/rate", {"x-principal": "two-after"})[0] for _ in range(6)]
    assert burst == [200] * 4 + [429] * 2
    assert killed and len(statuses) > 50
    print(f"two limiters, one killed, retry {retry}: {statuses.count(503)} of {len(statuses)} answered 503")
    if retry:
        assert set(statuses) == {200}, sorted(set(statuses))
        assert after == [200] * 4 + [429] * 2
    else:
        assert statuses.count(503) >= 5 and set(statuses) == {200, 503}
