"""Benchmark (not a test): a full proof of a catalog under the default policy's real rate limits.

verify's loop (stand-in with witness, generated proxy, every check, state changes allowed on the
stand-in) with N keys per role, 4 loopback vantages; reports the wall time of the probe, how many
cases stayed inconclusive, and the slowest pacing lanes (a lane = one rate-limit bucket:
zone and principal or address). Target (issue 8): <= 30 s and 0 inconclusive for the 0.29.0
"everything" profile with one key per role.

    python examples/bench_proof.py [--catalog vllm-0.29.0-everything] [--proxy nginx] [--keys 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime.proxy import get
from scanner.verify import loop

TARGET_S = 30.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", default="vllm-0.29.0-everything")
    ap.add_argument("--proxy", default="nginx")
    ap.add_argument("--keys", type=int, default=1, help="keys per role")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    inventory, policy = load_ref(args.catalog), load_policy(None)
    options = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300)
    walls, stuck = [], []
    last = None
    for _ in range(args.runs):
        run = loop.run(inventory, policy, [get(args.proxy)], options, args.keys)[0]
        res = run.result
        walls.append(res.elapsed_s)
        stuck.append(sum(1 for c in res.coverage if c.status == "not-proven"))
        print(f"run: {res.elapsed_s:.1f} s probe ({run.seconds:.1f} s with proxy start), {len(res.attempts)} "
              f"attempts, {len(res.findings)} findings, {stuck[-1]} subjects not proven, retries "
              f"{sum(1 for a in res.attempts if a.tries > 1)}")
        last = res
    assert last is not None
    print(f"\n{args.catalog} via {args.proxy}, {args.keys} key(s) per role, {args.runs} runs: median "
          f"{statistics.median(walls):.1f} s (min {min(walls):.1f}, max {max(walls):.1f}); target <= "
          f"{TARGET_S:.0f} s: {'met' if statistics.median(walls) <= TARGET_S else 'NOT met'}; "
          f"inconclusive left: {max(stuck)} (target 0)")
    _lanes(last)
    return 0


def _lanes(res: ProbeResult) -> None:
    """Where the time goes in the last run: per credential and per check, attempts and when the
    last one was sent (a principal's rate-limited cases are paced: the slowest decides)."""
    t0 = min(a.sent_at for a in res.attempts if a.sent_at)
    for title, key in (("credential", lambda a: a.credential), ("check", lambda a: a.check)):
        spans: dict[str, list[float]] = defaultdict(list)
        for a in res.attempts:
            if a.sent_at:
                spans[key(a)].append(a.sent_at)
        print(f"\nper {title}: attempts, last sent (s after the first request)")
        for name, times in sorted(spans.items(), key=lambda kv: -max(kv[1])):
            print(f"  {name:24s} {len(times):6d}  {max(times) - t0:6.1f}")


if __name__ == "__main__":
    sys.exit(main())
