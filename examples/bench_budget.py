"""Benchmark (not a test): a token budget against the real output potential of a mixed load (issue 19).

"Done when: under a token budget, no mix of requests within the caps gets more than 1.25x the
budget of real output potential (sequences x output budget) to vLLM in a minute, on NGINX 1.31 and
Envoy; NGINX 1.22 exits 2 as today."

Per proxy: the bundled policy with ``tokens_per_minute`` (default 60,000) on the inference and the
service audiences, generated and started in front of the stand-in and its upstream witness; a few
concurrent clients of ONE principal (role service: both audiences) fire a random mix of bodies
within every cap for a window W (chat n=4 max_tokens 4096; completions with prompt lists and
token-id lists; n with best_of on chat batches; embeddings input lists; Responses; Anthropic
messages; bodies without an output budget so the proxy writes one; random sizes). Afterwards the
bodies that REACHED the upstream (the witness's records, byte for byte) are counted as vLLM runs
them: sequences (prompts, conversations x max(n, best_of)) x output budget per sequence, by
:func:`vllm_potential` (vLLM 0.29's request semantics, written out here independently of the plan)
and by the plan's reference, ``Decision.envelope``; per token zone the sum is compared with what
the budget may let through in W (``budget_capacity(limit, W)``: the full bucket plus its refill).
Target: ratio <= 1.25.

By default the stand-in generates each sequence's whole output budget (its usage then reports all of
it: the worst case for a budget that settles on usage, nothing is refunded but the input estimate);
``--natural`` keeps its 10 tokens per choice (usage small: the settlement refunds the rest, so the
potential passed is larger while the usage charged stays within the budget; both are printed).

Beside it: what the old per-request charge (output budget + bytes / 4, no multiplier) would have
let through from the same requests (those that got past the rate limiter, in the order sent, a
bucket of the same limit), and the issue's own figures for it.

    python examples/bench_budget.py [--proxy nginx] [--proxy envoy] [--window 60] [--clients 4]
                                    [--tpm 60000] [--seed 1] [--natural]

``--saturate`` (issue 27, item 4: bounded token windows): per proxy, ``--clients`` threads of one
principal send requests of one cost (``--tpm`` / 100) to /v1/chat/completions back to back for
``--window`` seconds (default 60), each answered 400 by the witness itself (no usage: nothing
refunded), after the bucket has sat full. Printed: the tokens admitted in the window against the
minute's N (target <= 1.25 N over 60 s) and the bound C + N x W / 60 (C the plan's bucket,
``--burst`` sets tokens_burst: N gives the old capacity, about 2 N).

    python examples/bench_budget.py --saturate [--proxy nginx] [--window 60] [--tpm 60000] [--burst N]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from scanner import mutate
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import body as plan_body
from scanner.plan.model import REASON_HEADER, Decision
from scanner.plan.vllm_json import vllm_int
from scanner.policy.load import loads
from scanner.probe.checks.tokens import budget_capacity
from scanner.runtime.proxy import Proxy, get
from scanner.standin import openai_answers
from scanner.standin.serve import StandinThread
from scanner.verify import loop

TARGET = 1.25
# The issue's figures for the old per-request charge (output budget + bytes / 4): a realistic mix
# of n / prompt lists 3.8x the budget, prompt lists of 16 x n 4 61x.
ISSUE_OLD = "3.8x (a mix) / 61x (prompt lists x n)"
CATALOG = "vllm-0.29.0-default"
POLICY = Path(__file__).resolve().parents[1] / "policies" / "vllm-default.yaml"
MAX_BODY = 60_000          # the witness keeps a JSON body's whole text up to 64 KiB
PREFIX = "bench-"


def budget_policy_text(tpm: int, burst: int | None = None) -> str:
    """The bundled policy with ``tokens_per_minute: tpm`` (and ``tokens_burst``, None: the
    default) on the inference and service audiences."""
    text = POLICY.read_text()
    for anchor in ("      concurrency: 16\n", "      concurrency: 64\n"):
        assert anchor in text, anchor
        text = text.replace(anchor, f"{anchor}      tokens_per_minute: {tpm}\n"
                            + (f"      tokens_burst: {burst}\n" if burst else ""), 1)
    return text


# --- the mix: bodies within every cap of the bundled policy ---------------------------------------

def _pad(rng: random.Random, most: int) -> str:
    return "w " * rng.randint(0, most // 2)


def _budget(rng: random.Random, field_name: str, cap: int) -> dict[str, object]:
    """An output budget of 1..cap, the cap itself, or none (the proxy writes one in)."""
    pick = rng.random()
    if pick < 0.3:
        return {}
    return {field_name: cap if pick < 0.6 else rng.randint(1, cap)}


KINDS: Mapping[str, str] = {
    "chat-n4": "/v1/chat/completions", "chat": "/v1/chat/completions",
    "completions-list": "/v1/completions", "completions-ids": "/v1/completions",
    "batch": "/v1/chat/completions/batch", "embeddings": "/v1/embeddings",
    "responses": "/v1/responses", "messages": "/v1/messages", "messages-tiny": "/v1/messages",
    "generate": "/inference/v1/generate",
}
# Not in the default mix (--kind generate): vLLM's token-in/token-out API reads n and max_tokens
# inside sampling_params, which neither the JSON caps (top-level fields) nor the envelope count yet.
EXTRA_KINDS: tuple[str, ...] = ("generate",)


def mix(rng: random.Random, kinds: tuple[str, ...] = ()) -> tuple[str, str, dict[str, object]]:
    """(kind, path, body) of one request within the bundled policy's caps: inference (n, best_of
    <= 4, max_tokens <= 4096, 16 sequences) and service (8, 8192, 256) audiences."""
    kind = rng.choice(kinds or tuple(k for k in KINDS if k not in EXTRA_KINDS))
    msg = {"role": "user", "content": _pad(rng, 8000) or "hi"}
    if kind == "chat-n4":
        return kind, "/v1/chat/completions", {"model": "m", "messages": [msg], "n": 4, "max_tokens": 4096}
    if kind == "chat":
        n, name = rng.randint(1, 4), rng.choice(("max_tokens", "max_completion_tokens"))
        return kind, "/v1/chat/completions", {"model": "m", "messages": [msg] * rng.randint(1, 3), "n": n,
                                              **_budget(rng, name, 4096)}
    if kind == "completions-list":
        n = rng.randint(1, 4)
        k = rng.randint(1, 16 // n)
        prompts = [_pad(rng, 3000) or "p" for _ in range(k)]
        return kind, "/v1/completions", {"model": "m", "prompt": prompts, "n": n,
                                         **_budget(rng, "max_tokens", 4096)}
    if kind == "completions-ids":
        k = rng.randint(1, 16)
        ids = [[rng.randint(1, 1000) for _ in range(rng.randint(1, 200))] for _ in range(k)]
        return kind, "/v1/completions", {"model": "m", "prompt": ids, **_budget(rng, "max_tokens", 4096)}
    if kind == "batch":   # service audience: n, best_of <= 8, max_tokens <= 8192, 256 sequences
        best = rng.randint(1, 8)
        n = rng.randint(1, best)
        convs = [[{"role": "user", "content": _pad(rng, 2000) or "c"}] for _ in range(rng.randint(1, 4))]
        return kind, "/v1/chat/completions/batch", {"model": "m", "messages": convs, "n": n, "best_of": best,
                                                    **_budget(rng, "max_tokens", rng.choice((1024, 8192)))}
    if kind == "embeddings":
        return kind, "/v1/embeddings", {"model": "m", "input": [_pad(rng, 2000) or "e"
                                                                for _ in range(rng.randint(1, 16))]}
    if kind == "responses":
        return kind, "/v1/responses", {"model": "m", "input": _pad(rng, 8000) or "r",
                                       **_budget(rng, "max_output_tokens", 4096)}
    if kind == "generate":   # service audience; sampling_params as vLLM's GenerateRequest reads it
        return kind, "/inference/v1/generate", {"token_ids": [1, 2, 3],
                                                "sampling_params": {"n": 8, "max_tokens": 8192}}
    if kind == "messages-tiny":   # the most output per byte: what a budget counting bytes only misses
        return kind, "/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 4096}
    return kind, "/v1/messages", {"model": "m", "messages": [msg],
                                  "max_tokens": rng.choice((4096, rng.randint(1, 4096)))}


# --- what vLLM runs for a forwarded body (vLLM 0.29, written out apart from the plan) -----------

BUDGETS: Mapping[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/chat/completions/batch": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),       # required by vLLM's AnthropicMessagesRequest
}


def vllm_potential(path: str, body: Mapping[str, Any]) -> tuple[int, int] | None:
    """(sequences, output budget per sequence) vLLM 0.29 runs for ``body`` on ``path``: n and
    best_of (the larger, beam search included) per prompt; a completions prompt list of strings or
    token-id lists is one prompt each (a flat token-id list one); a batch one request per
    conversation; embeddings generate nothing. None: a body without an output budget (vLLM would
    run max_model_len - prompt, not known here)."""
    if path == "/inference/v1/generate":    # GenerateRequest: sampling_params.n, .max_tokens (16)
        raw_params = body.get("sampling_params")
        params: Mapping[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        return vllm_int(params.get("n", 1)) or 1, vllm_int(params.get("max_tokens", 16)) or 0
    if path not in BUDGETS:
        return len(body["input"]) if isinstance(body.get("input"), list) else 1, 0
    per = max([1, *(vllm_int(body[f]) or 1 for f in ("n", "best_of") if body.get(f) is not None)])
    if path == "/v1/responses" or path == "/v1/messages":
        per = 1
    items = 1
    prompt = body.get("prompt") if path == "/v1/completions" else body.get("messages")
    if path in ("/v1/completions", "/v1/chat/completions/batch") and isinstance(prompt, list):
        items = max(1, sum(1 for p in prompt if isinstance(p, str | list)))
    budget = next((vllm_int(body[f]) for f in BUDGETS[path] if body.get(f) is not None), None)
    return None if budget is None else (items * per, budget)


# --- one run --------------------------------------------------------------------------------------

@dataclass
class Sent:
    id: str
    kind: str
    path: str
    body: bytes
    t: float
    status: int = 0
    reason: str = ""


@dataclass
class ZoneFigures:
    zone: str
    limit: int
    window: float
    capacity: float
    reached: int = 0
    potential: int = 0            # sequences x output budget, as vLLM runs them (vllm_potential)
    potential_plan: int = 0       # the same by the plan's Decision.envelope
    late: int = 0                 # potential of the bodies sent in the second half of the window
    usage: int = 0                # completion tokens the stand-in reported (its answers' usage)
    unbounded: int = 0            # forwarded without an output budget (vLLM's default applies)
    old_potential: int = 0        # what the old per-request charge would have let through
    by_kind: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.potential / self.capacity

    @property
    def ratio_plan(self) -> float:
        return self.potential_plan / self.capacity

    @property
    def steady(self) -> float:
        """The second half of the window (the full bucket long spent) against the limit's rate:
        tokens of potential per minute / limit."""
        return self.late / (self.limit * self.window / 2 / 60)

    @property
    def ratio_old(self) -> float:
        return self.old_potential / self.capacity


@dataclass
class RunFigures:
    proxy: str
    sent: int
    statuses: Counter[str]
    zones: list[ZoneFigures]
    kinds: tuple[str, ...] = ()


@contextmanager
def full_generation(on: bool) -> Iterator[None]:
    """The stand-in generating every sequence's whole output budget (usage = the potential)."""
    old = openai_answers.NATURAL_TOKENS
    if on:
        openai_answers.NATURAL_TOKENS = 1 << 30
    try:
        yield
    finally:
        openai_answers.NATURAL_TOKENS = old


def fire(url: str, key_headers: dict[str, str], address: str | None, seed: int, clients: int,
         window: float, pause: float, kinds: tuple[str, ...]) -> list[Sent]:
    """``clients`` threads of one principal sending the mix for ``window`` seconds."""
    out: list[Sent] = []
    lock = threading.Lock()
    deadline = time.monotonic() + window

    def client(c: int) -> None:
        rng = random.Random(seed * 1000 + c)
        transport = httpx.HTTPTransport(local_address=address) if address else None
        with httpx.Client(base_url=url, transport=transport, timeout=60, trust_env=False) as http:
            i = 0
            while time.monotonic() < deadline:
                kind, path, obj = mix(rng, kinds)
                raw = json.dumps(obj).encode()
                if len(raw) > MAX_BODY:
                    continue
                s = Sent(f"{PREFIX}{c}-{i}", kind, path, raw, time.monotonic())
                i += 1
                try:
                    r = http.post(path, params={"vp_probe": s.id}, content=raw,
                                  headers={**key_headers, "Content-Type": "application/json"})
                    s.status, s.reason = r.status_code, r.headers.get(REASON_HEADER, "")
                except httpx.HTTPError as exc:
                    s.reason = f"error {type(exc).__name__}"
                with lock:
                    out.append(s)
                time.sleep(pause)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def witness_records(url: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(url + "/__standin__/witness", params={"prefix": PREFIX}, timeout=60, trust_env=False)
    r.raise_for_status()
    return {str(rec["id"]): rec for rec in r.json()["records"]}


def old_charge_admits(sent: list[Sent], d_of: Mapping[str, Decision], limit: int, zone: str) -> int:
    """The output potential the old per-request charge (output budget per sequence + bytes / 4)
    would have let through from ``sent``'s requests of ``zone`` that passed the rate limiter, in
    the order sent, with a bucket of ``limit`` per minute refilled continuously."""
    tokens, last, potential = float(limit), None, 0
    for s in sorted(sent, key=lambda s: s.t):
        route = d_of.get(s.path)
        if route is None or route.token_zone != zone or s.reason in ("rate", "concurrency") or s.status == 0:
            continue
        if s.reason and s.reason != "token-budget":
            continue    # refused for the body itself (a cap): the old perimeter refused it too
        if last is not None:
            tokens = min(float(limit), tokens + (s.t - last) * limit / 60)
        last = s.t
        env = plan_body.envelope(route, s.body)
        cost = env.output + len(s.body) / 4
        if cost <= tokens:
            tokens -= cost
            forwarded = json.loads(s.body)
            budget = route.budget
            if budget is not None and budget.absent(forwarded):
                forwarded = budget.forwarded(forwarded, len(s.body)) or forwarded
            got = vllm_potential(s.path, forwarded)
            potential += got[0] * got[1] if got else 0
    return potential


def run(proxy: Proxy, tpm: int, window: float, clients: int, seed: int, natural: bool = False,
        pause: float = 0.01, kinds: tuple[str, ...] = (), mutant: str = "",
        catalog: str = CATALOG) -> RunFigures:
    """One proxy (weakened by mutation operator ``mutant``) under the mix (``kinds`` of it; every
    kind whose route the plan allows by default) for ``window`` seconds: the figures per zone."""
    inventory = load_ref(catalog)
    policy = loads(budget_policy_text(tpm))
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp, ExitStack() as stack:
        work, port = Path(tmp), free_port()
        s = loop.setup(inventory, policy, work, port, keys_per_role=1)
        directory = work / proxy.name
        written = proxy.write(s.plan, directory)
        if mutant:
            mutate.OPERATORS[f"{proxy.kind}.{mutant}"].apply(written, s.plan)
        allowed = {d.path for d in s.plan.allowed if d.method == "POST"}
        kinds = tuple(k for k in (kinds or tuple(k for k in KINDS if k not in EXTRA_KINDS))
                      if KINDS[k] in allowed)
        stack.enter_context(full_generation(not natural))
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", port))
        loop.start_checked(proxy, s.plan, directory, stack)
        cred = next(c for c in s.credentials if c.role == "service")
        public = next(v for v in s.vantages if v.name == "public")
        url = f"http://127.0.0.1:{s.plan.listen.port}"
        t0 = time.monotonic()
        sent = fire(url, cred.headers(), public.address, seed, clients, window, pause, kinds)
        took = time.monotonic() - t0
        seen = witness_records(standin.url)
    d_of = {d.path: d for d in s.plan.allowed if d.method == "POST" and d.kind == "http"}
    zones: dict[str, ZoneFigures] = {}
    for route in d_of.values():
        if route.token_zone and route.token_zone not in zones:
            limit = route.limits.tokens_per_minute or 0
            zones[route.token_zone] = ZoneFigures(route.token_zone, limit, took,
                                                  budget_capacity(route.token_capacity, limit, took))
    by_id = {x.id: x for x in sent}
    for pid, rec in seen.items():
        x = by_id.get(pid)
        d = d_of.get(x.path) if x else None
        if x is None or d is None or not d.token_zone:
            continue
        z = zones[d.token_zone]
        raw = (rec.get("body") or "").encode()
        if len(raw) != int(rec.get("body_bytes", -1)):
            z.mismatches.append(f"{pid}: the witness kept no whole body ({rec.get('body_bytes')} bytes)")
            continue
        obj = json.loads(raw)
        z.reached += 1
        z.by_kind[x.kind] += 1
        got = vllm_potential(x.path, obj)
        env = plan_body.envelope(d, raw)
        if got is None:
            z.unbounded += 1
        else:
            z.potential += got[0] * got[1]
            z.late += got[0] * got[1] if x.t - t0 >= took / 2 else 0
            z.usage += got[0] * min(got[1], openai_answers.NATURAL_TOKENS if natural else got[1]) \
                if x.path in ("/v1/chat/completions", "/v1/completions", "/v1/responses") else got[0] * got[1]
            if (env.sequences * env.output) != got[0] * got[1]:
                z.mismatches.append(f"{x.kind} {x.path}: vLLM runs {got[0]} x {got[1]}, the plan counts "
                                    f"{env.sequences} x {env.output}")
        z.potential_plan += env.sequences * env.output
    for z in zones.values():
        z.old_potential = old_charge_admits(sent, d_of, z.limit, z.zone)
    statuses = Counter(f"{x.status} {x.reason}".strip() for x in sent)
    return RunFigures(proxy.name, len(sent), statuses, sorted(zones.values(), key=lambda z: z.zone), kinds)


@dataclass
class Saturation:
    proxy: str
    limit: int            # N, tokens per minute
    capacity: int         # C, the plan's bucket
    cost: int
    window: float
    admitted: int = 0     # requests the upstream answered (witness 400)
    refused: int = 0      # 429 token-budget
    other: Counter[str] = field(default_factory=Counter)   # anything else (rate: not charged)

    @property
    def tokens(self) -> int:
        return self.admitted * self.cost

    @property
    def bound(self) -> float:
        return self.capacity + self.limit * self.window / 60


def saturate(proxy: Proxy, tpm: int, window: float, clients: int, burst: int | None = None) -> Saturation:
    """``clients`` threads of one principal (role user) sending requests of cost tpm // 100 back
    to back for ``window`` seconds, answered 400 by the witness (no refund)."""
    from scanner.probe.checks.tokens import body_of_cost
    from scanner.witness_asgi import ANSWER_PARAM, PROBE_PARAM

    inventory = load_ref(CATALOG)
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp, ExitStack() as stack:
        work, port = Path(tmp), free_port()
        s = loop.setup(inventory, loads(budget_policy_text(tpm, burst)), work, port, keys_per_role=1)
        d = s.plan.decision("POST", "/v1/chat/completions")
        assert d is not None and d.token_zone
        cost = max(1, tpm // 100)
        body = body_of_cost(d, cost, {}, 1 << 20)
        assert body is not None and plan_body.token_cost(d, body) == cost
        directory = work / proxy.name
        proxy.write(s.plan, directory)
        stack.enter_context(StandinThread(inventory, "127.0.0.1", port))
        loop.start_checked(proxy, s.plan, directory, stack)
        cred = next(c for c in s.credentials if c.role == "user")
        public = next(v for v in s.vantages if v.name == "public")
        url = f"http://127.0.0.1:{s.plan.listen.port}"
        out = Saturation(proxy.name, tpm, d.token_capacity, cost, window)
        lock = threading.Lock()
        time.sleep(1.0)                       # the rate bucket full too
        t0 = time.monotonic()
        deadline = t0 + window

        def client(c: int) -> None:
            transport = httpx.HTTPTransport(local_address=public.address) if public.address else None
            with httpx.Client(base_url=url, transport=transport, timeout=30, trust_env=False) as http:
                for i in range(10 ** 7):
                    if time.monotonic() >= deadline:
                        return
                    r = http.post("/v1/chat/completions", content=body,
                                  params={PROBE_PARAM: f"{PREFIX}sat{c}-{i}", ANSWER_PARAM: "400"},
                                  headers={**cred.headers(), "Content-Type": "application/json"})
                    reason = r.headers.get(REASON_HEADER, "")
                    with lock:
                        if r.status_code == 400 and not reason:
                            out.admitted += 1
                        elif (r.status_code, reason) == (429, "token-budget"):
                            out.refused += 1
                        else:
                            out.other[f"{r.status_code} {reason}"] += 1

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out.window = time.monotonic() - t0
    return out


def report_saturation(f: Saturation) -> None:
    print(f"\n{f.proxy}: {f.limit} tokens a minute, bucket {f.capacity}; requests of cost {f.cost} for "
          f"{f.window:.1f} s: {f.admitted} admitted, {f.refused} refused token-budget"
          + (", " + ", ".join(f"{k} x{v}" for k, v in f.other.most_common()) if f.other else ""))
    ratio = f.tokens / f.limit
    within = "within" if f.tokens <= f.bound + f.cost else "OVER"
    target = (f"target <= {TARGET} N in 60 s: {'met' if ratio <= TARGET else 'NOT met'}"
              if abs(f.window - 60) < 1 else "the target is over 60 s")
    print(f"  admitted {f.tokens} tokens = {ratio:.3f} N in {f.window:.1f} s ({target}); "
          f"the bound C + N t / 60 = {f.bound:.0f}: {within}")


def debian_refusal(tpm: int) -> tuple[int, str]:
    """``generate nginx`` for Debian's NGINX 1.22 (njs 0.7.9) with a token budget: (exit, stderr)."""
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(budget_policy_text(tpm))
        cli = str(Path(sys.executable).parent / "vllm-perimeter")
        done = subprocess.run([cli, "generate", "nginx", "--inventory", CATALOG,
                               "--policy", str(policy), "-o", str(Path(tmp) / "out"),
                               "--set", "njs_module=/usr/lib/nginx/modules/ngx_http_js_module.so"],
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stderr.strip()


def report(f: RunFigures, natural: bool) -> None:
    print(f"\n{f.proxy}: {f.sent} requests sent ({', '.join(f.kinds)}); answers: "
          + ", ".join(f"{k or 'no answer'} x{v}" for k, v in f.statuses.most_common()))
    for z in f.zones:
        verdict = "met" if z.ratio <= TARGET else "NOT met"
        print(f"  {z.zone}: {z.reached} bodies reached vLLM in {z.window:.1f} s ({dict(z.by_kind)})")
        print(f"    real output potential {z.potential} tokens (the plan's envelope: {z.potential_plan}) vs "
              f"the budget's capacity {z.capacity:.0f} (limit {z.limit}/min + refill over {z.window:.1f} s)")
        print(f"    ratio {z.ratio:.3f} (plan {z.ratio_plan:.3f}); target <= {TARGET}: {verdict}; in "
              f"{z.window:.0f} s from a full bucket: {z.potential / z.limit:.2f} x the limit; "
              f"the second half of W: {z.steady:.2f} x the limit's rate")
        if natural:
            print(f"    output the stand-in reported (usage, settled): {z.usage} tokens, "
                  f"ratio {z.usage / z.capacity:.3f}")
        print(f"    the old per-request charge (output + bytes/4) would have let through {z.old_potential} "
              f"tokens of potential: ratio {z.ratio_old:.2f} (the issue: {ISSUE_OLD})")
        if z.unbounded:
            print(f"    {z.unbounded} bodies reached vLLM without an output budget")
        for m in sorted(set(z.mismatches))[:8]:
            print(f"    MISMATCH {m}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", action="append", choices=("nginx", "envoy"))
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--catalog", default=CATALOG, help="e.g. vllm-0.29.0-everything (embeddings too)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tpm", type=int, default=60_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pause", type=float, default=0.01, help="seconds between one client's requests")
    ap.add_argument("--kind", action="append", choices=tuple(KINDS),
                    help="only these bodies (default: all but generate)")
    ap.add_argument("--mutant", default="", help="a mutation operator applied first (multiplier-ignored)")
    ap.add_argument("--natural", action="store_true",
                    help="the stand-in's 10 tokens per choice (usage settles the rest), not the whole budget")
    ap.add_argument("--saturate", action="store_true",
                    help="one principal's saturating sender of requests of one cost (bounded token windows)")
    ap.add_argument("--burst", type=int, default=None,
                    help="--saturate: tokens_burst (default: the policy's)")
    args = ap.parse_args()
    if args.saturate:
        for name in args.proxy or ["nginx", "envoy"]:
            report_saturation(saturate(get(name), args.tpm, args.window, args.clients, args.burst))
        return 0
    worst = 0.0
    for name in args.proxy or ["nginx", "envoy"]:
        f = run(get(name), args.tpm, args.window, args.clients, args.seed, args.natural, args.pause,
                tuple(args.kind or ()), args.mutant, args.catalog)
        report(f, args.natural)
        worst = max([worst, *(z.ratio for z in f.zones)])
    code, err = debian_refusal(args.tpm)
    print(f"\nNGINX 1.22 (Debian, njs 0.7.9) generate with a token budget: exit {code}: {err}")
    print(f"\nworst ratio {worst:.3f}; target <= {TARGET}: {'met' if worst <= TARGET else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
