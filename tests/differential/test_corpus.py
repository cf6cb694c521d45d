"""One body-rule truth held by a differential corpus (issue 19, item 1): every body of the corpus
(tests/differential/corpus.py, hand-picked and generated) is judged by the Python reference
(scanner.plan.body.judge), by njs inside a real NGINX (static 1.31, Debian 1.22), by Lua inside a
real Envoy (each generated from the bundled policy, in front of the stand-in and its witness), and
what reached the upstream by vLLM 0.29's own request models. A proxy (or the reference) that lets
more reach vLLM than the plan allows fails, and so does any disagreement with the reference (the
verdict, the status, the whole reason token, the body forwarded: its JSON as Python's json reads
it, each number's type and value as sent, harness.same)."""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from scanner.inventory.catalog import load_ref
from scanner.inventory.model import Inventory
from scanner.plan.body import Judgement, judge
from scanner.plan.inputs import load_policy
from scanner.plan.vllm_json import vllm_int
from scanner.policy.model import Policy
from tests.differential import corpus
from tests.differential.harness import (
    Case,
    Stand,
    admitted_more,
    compare,
    run,
    stand,
    vllm_reads,
)
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
CAPPED = corpus.CAPPED

@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return load_ref(CATALOG)


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    out = corpus.cases()
    assert len(out) >= 1000
    return out


def rewriting() -> Policy:
    """The bundled policy with every way a proxy rewrites a body: per-principal cache salt,
    chat_template stripped, unknown fields stripped, priority and service_tier pinned."""
    policy = load_policy(None)
    inference = policy.audiences["inference"]
    named = {k: v for k, v in inference.fields.named.items() if k not in ("priority", "service_tier")}
    fields = replace(inference.fields, named=named, unknown="strip", pins={"priority": 0, "service_tier": "auto"})
    return replace(policy, audiences={**policy.audiences, "inference": replace(inference, fields=fields)},
                   body=replace(policy.body, cache_salt="per-principal", chat_template="strip"))


POLICIES = {"bundled": lambda: load_policy(None), "rewriting": rewriting}


@pytest.fixture(scope="module", params=sorted(POLICIES))
def bench(request: pytest.FixtureRequest, inventory: Inventory,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    yield stand(inventory, POLICIES[request.param](), tmp_path_factory.mktemp("differential"))


def _reference(s: Stand, cases: list[Case]) -> dict[str, Judgement]:
    plan = s.setup.plan
    out = {}
    for case in cases:
        d = plan.decision("POST", case.path)
        assert d is not None and d.allowed, case.path
        out[case.id] = judge(d, case.raw, s.salt(case.role, case.path), case.content_type)
    return out


def test_the_reference_reads_numbers_as_vllm(cases: list[Case], vllm_python: str) -> None:
    """Every capped value of the corpus and 600 more generated ones, each as chat's max_tokens (an
    int field): vllm_int reads what vLLM 0.29's model reads, or refuses what it refuses."""
    values: dict[str, object] = {}
    for text in corpus.draw_many(corpus.value(), 600):
        with contextlib.suppress(ValueError):
            values.setdefault(text, json.loads(text))
    for case in cases:
        try:
            doc = json.loads(case.raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(doc, dict):
            for name in CAPPED:
                if name in doc:
                    values.setdefault(json.dumps(doc[name]), doc[name])
    items = [(str(i), corpus.CHAT, "application/json",
              json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                          "max_tokens": v}).encode(), ("max_tokens",)) for i, v in enumerate(values.values())]
    seen = vllm_reads(vllm_python, items)
    wrong = []
    for i, v in enumerate(values.values()):
        row = seen[str(i)]
        theirs = row["values"].get("max_tokens") if row["valid"] else None
        if v is None:
            continue
        if vllm_int(v) != theirs:
            wrong.append((v, vllm_int(v), theirs))
    assert len(values) > 400 and not wrong, wrong


def test_the_reference_forwards_nothing_beyond_the_plan(bench: Stand, cases: list[Case], vllm_python: str) -> None:
    plan = bench.setup.plan
    ref = _reference(bench, cases)
    sent = {c.id: (c, c.raw if ref[c.id].body is None else json.dumps(ref[c.id].body).encode())
            for c in cases if not ref[c.id].refused}
    oracle = vllm_reads(vllm_python, [(cid, c.path, c.content_type, raw, corpus.READ)
                                      for cid, (c, raw) in sent.items()])
    bad = {}
    for cid, (case, raw) in sent.items():
        d = plan.decision("POST", case.path)
        assert d is not None
        more = admitted_more(d, case.content_type, raw, oracle.get(cid), bench.salt(case.role, case.path))
        if more:
            bad[cid] = (case.note, case.raw[:160], more)
    assert not bad, bad
    assert sum(1 for j in ref.values() if j.refused) > 100 and len(sent) > 100


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_the_proxy_agrees_with_the_reference(bench: Stand, inventory: Inventory, cases: list[Case],
                                             vllm_python: str, name: str) -> None:
    proxy = proxy_named(name)
    plan = bench.setup.plan
    ref = _reference(bench, cases)
    t0 = time.monotonic()
    seen = run(bench, inventory, proxy, cases)
    took = time.monotonic() - t0
    forwarded = [(c.id, c.path, c.content_type, seen[c.id].forwarded or b"", corpus.READ)
                 for c in cases if seen[c.id].forwarded]
    oracle = vllm_reads(vllm_python, forwarded)
    classes: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    more = {}
    for case in cases:
        d = plan.decision("POST", case.path)
        assert d is not None
        s = seen[case.id]
        why = admitted_more(d, case.content_type, s.forwarded, oracle.get(case.id), bench.salt(case.role, case.path))
        if why:
            more[case.id] = (case.path, case.note, case.raw[:200], case.content_type, why)
        cls = compare(ref[case.id], s, case.raw)
        if cls:
            classes[cls] += 1
            if len(examples[cls]) < 6:
                examples[cls].append(f"{case.id} {case.path} {case.raw[:90]!r} ref={ref[case.id].reason or 'forward'} "
                                     f"{name}={s.status} {s.reason or 'forward'}")
    print(f"\n{name} ({bench.setup.plan.policy_name}{', rewriting' if bench.setup.plan.body.salted else ''}): "
          f"{len(cases)} bodies in {took:.1f} s; disagreements: {dict(classes) or 'none'}")
    for cls, lines in examples.items():
        for line in lines:
            print(f"  [{cls}] {line}")
    for cid, (path, note, raw, ct, why) in more.items():
        print(f"  [ADMITS MORE] {cid} {path} {note} {ct} {raw[:120]!r}: {'; '.join(why)}")
    assert not more, f"{len(more)} bodies reached vLLM beyond the plan through {name}"
    assert not [c for c in cases if seen[c.id].status == 0], "a body was never answered"
    failed = [f"{c.id} {c.note} {c.raw[:90]!r}: {seen[c.id].status} {seen[c.id].reason}"
              for c in cases if seen[c.id].status >= 500]
    assert not failed, f"{name} failed on {len(failed)} bodies (an interpreter error, no verdict):\n" + "\n".join(failed)
    assert not classes, f"{name} disagrees with the reference: {dict(classes)} (examples printed with -s)"
    assert took < 120


def test_the_corpus_is_deterministic() -> None:
    assert [c.raw for c in corpus.cases(40)] == [c.raw for c in corpus.cases(40)]


def test_bodies_span_the_classes(cases: list[Case], bench: Stand) -> None:
    """The corpus exercises every check: refusals of each kind and forwarded bodies, on every route."""
    ref = _reference(bench, cases)
    kinds = collections.Counter(j.kind[0] or "forward" for j in ref.values())
    unknown = {"unknown-field"} if bench.setup.plan.decision("POST", corpus.CHAT).fields.unknown == "reject" else set()
    assert {"json-cap", "forbidden-field", "bad-json", "media-url", "media-items", "forward", *unknown} <= set(kinds), kinds
    assert {c.path for c in cases} == set(corpus.ROUTES)
