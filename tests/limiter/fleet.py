"""A fleet in front of the stand-in for tests: two replicas of one proxy, the limiter, one
redis-server (scanner.runtime.fleet), the plan of the bundled policy with small inference limits
(rate 4 r/s burst 5, 2 requests at once, 2000 tokens a minute) shared through the limiter."""

from __future__ import annotations

import http.client
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from redis import Redis

from scanner.errors import PortInUse
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.model import Plan
from scanner.policy.load import loads
from scanner.policy.model import Policy
from scanner.probe.interface import Credential
from scanner.runtime import fleet
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.limiter.harness import redis_binary

CATALOG = "vllm-0.29.0-default"
DEFAULT = Path(__file__).resolve().parents[2] / "policies" / "vllm-default.yaml"
PUBLIC = "127.0.0.12"     # loop.loopback's address of the policy's public network
RPS, BURST, CONCURRENCY, TOKENS = 4, 5, 2, 2000
# the token bucket: the whole minute at once (tokens_burst = TOKENS), as the fleet's tests count
TOKEN_BURST = TOKENS


def fleet_policy(on_unavailable: str = "deny", tokens: bool = True, burst: int | None = TOKEN_BURST,
                 tpm: int = TOKENS) -> Policy:
    """The bundled policy with the fleet's limits and ``shared:`` (``burst`` None: the default bucket)."""
    text = DEFAULT.read_text().replace(
        "      rate: {rps: 10, burst: 20}\n      concurrency: 16\n",
        f"      rate: {{rps: {RPS}, burst: {BURST}}}\n      concurrency: {CONCURRENCY}\n"
        + (f"      tokens_per_minute: {tpm}\n" if tokens else "")
        + (f"      tokens_burst: {burst}\n" if tokens and burst else ""), 1)
    text += f"\nshared:\n  redis: redis://127.0.0.1:6379/0\n  on_unavailable: {on_unavailable}\n"
    return loads(text)


class FleetStack:
    """The stand-in, Redis, the limiter and two replicas of ``proxy``; ``call`` sends through one."""

    def __init__(self, proxy: Proxy, on_unavailable: str = "deny", stream_delay: float = 0.25,
                 tokens: bool = True, local_after_s: dict[str, float] | None = None,
                 policy: Policy | None = None, slot_lease_s: float | None = None) -> None:
        redis_binary()    # skipped (or failed on CI) without redis-server
        self.proxy = proxy.kind
        self.tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
        inventory = load_ref(CATALOG)
        up = free_port()
        self.tokens = tokens
        self.setup = loop.setup(inventory, policy or fleet_policy(on_unavailable, tokens), self.tmp, up)
        self.local_after_s, self.slot_lease_s, self.runtime = local_after_s, slot_lease_s, proxy
        self.fleet = self._fleet()
        self.standin = StandinThread(inventory, "127.0.0.1", up, stream_delay=stream_delay)
        self.user: Credential = next(c for c in self.setup.credentials if c.role == "user")

    def _fleet(self) -> fleet.Fleet:
        """The fleet on fresh ports (Redis, the limiter, each replica), its configs written."""
        self.plan: Plan = fleet.plan_for(self.setup.plan, 2, free_port(), free_port())
        if self.local_after_s:   # a test's shorter outage before the local shares (the plan's otherwise)
            assert self.plan.shared is not None
            after = {**self.plan.shared.local_after_s, **self.local_after_s}
            self.plan = replace_shared(self.plan, local_after_s=after)
        if self.slot_lease_s is not None:   # a test's shorter lease (the limiter's default otherwise)
            assert self.plan.shared is not None
            self.plan = replace_shared(self.plan, slot_lease_s=self.slot_lease_s)
        made = fleet.Fleet(self.plan, self.runtime, self.tmp, (free_port(), free_port()))
        self.written = made.write()
        return made

    def start(self) -> FleetStack:
        """The stand-in and the fleet; a fleet whose port was taken between its pick and its bind
        (PortInUse: another test's process) is started again on fresh ports, at most 3 times."""
        self.standin.__enter__()
        try:
            for attempt in range(3):
                try:
                    self.fleet.start()
                    break
                except PortInUse:
                    if attempt == 2:
                        raise
                    self.fleet = self._fleet()
        except BaseException:
            self.standin.__exit__(None, None, None)
            raise
        return self

    def stop(self) -> None:
        self.fleet.stop()
        self.standin.__exit__(None, None, None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def slots_held(self) -> int:
        """How many concurrency slots the fleet's store holds now (every principal, every zone)."""
        with Redis(host="127.0.0.1", port=self.fleet.redis_port, socket_timeout=2) as redis:
            return sum(int(redis.zcard(k)) for k in redis.scan_iter(match="*:s", count=1000))

    def store_busy(self, seconds: float) -> None:
        """Keep the fleet's Redis busy for ``seconds``: one script spinning on Redis's clock (Redis
        runs one command at a time, so every call waits for it)."""
        spin = ("local s = redis.call('TIME') local stop = s[1] * 1000000 + s[2] + tonumber(ARGV[1]) "
                "while true do local t = redis.call('TIME') "
                "if t[1] * 1000000 + t[2] > stop then break end end return 1")
        with Redis(host="127.0.0.1", port=self.fleet.redis_port, socket_timeout=5) as redis:
            redis.eval(spin, 0, round(seconds * 1e6))

    def bucket_left(self, zone_prefix: str) -> float | None:
        """What the bucket of the zone named ``zone_prefix``... held at its last write (None: no
        such bucket, nothing taken from it yet)."""
        with Redis(host="127.0.0.1", port=self.fleet.redis_port, socket_timeout=2) as redis:
            names = [k for k in redis.scan_iter(match="*:b", count=1000) if f"|{zone_prefix}" in k.decode()]
            assert len(names) <= 1, names
            return float(redis.hget(names[0], "v") or -1) if names else None

    def released(self, timeout_s: float = 3.0) -> None:
        """Wait until no slot is held (at most ``timeout_s``): a slot is released when its stream
        ends, off the client's path (Envoy ``apply_on_stream_done``, NGINX ``post_action``), so a
        client's next request can reach the limiter before its last one's release does (on a
        busy machine, two releases late refuse a sequential third request 429 ``concurrency``
        at a concurrency of 2, and that refusal still counts in the rate zone before it)."""
        end = time.monotonic() + timeout_s
        while self.slots_held() and time.monotonic() < end:
            time.sleep(0.02)
        assert not self.slots_held(), "slots still held after their requests ended"

    def open(self, replica: int, method: str = "GET", path: str = "/v1/models",
             body: dict[str, object] | None = None, who: Credential | None = None) -> http.client.HTTPResponse:
        """One request through ``replica``, its answer's head read (the body left to read)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.fleet.ports[replica], timeout=15,
                                          source_address=(PUBLIC, 0))
        headers = (who or self.user).headers()
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        return conn.getresponse()

    def call(self, replica: int, method: str = "GET", path: str = "/v1/models",
             body: dict[str, object] | None = None, who: Credential | None = None) -> tuple[int, str, str]:
        """(status, X-Perimeter-Reason, Retry-After) of one request through ``replica``."""
        reply = self.open(replica, method, path, body, who)
        reply.read()
        reply.close()
        return reply.status, reply.getheader("x-perimeter-reason") or "", reply.getheader("retry-after") or ""


def chat(max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            **({"stream": True} if stream else {})}


def replace_shared(plan: Plan, **changes: object) -> Plan:
    assert plan.shared is not None
    return replace(plan, shared=replace(plan.shared, **changes))
