"""A body without an output budget, on models of 4096 and 8192 tokens (issue 19, item 4).

vLLM 0.29 refuses prompt + max_tokens > max_model_len, so writing the policy's cap into a body
that had none turns valid long prompts into 400s. The plan reads ``--max-model-len`` and the
``max_new_tokens`` override from the inventory's serve arguments (scanner/plan/output_default.py)
and writes min(cap, max_model_len - body bytes), or nothing where vLLM's own default is within
the cap (Budget.written). Proven here against vLLM's own render path (tests/plan/render_oracle.py:
its length checks and get_max_tokens, engine-less, a tokenizer of one token per byte at worst):
every body whose prompt fits is still accepted after the perimeter's rewrite, and vLLM generates
no more per sequence than the envelope charges. njs and Lua (NGINX 1.31, 1.22, Envoy 1.40, via the
witness) forward the same bodies and charge the same envelope.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.inventory.model import Inventory
from scanner.plan import body as plan_body
from scanner.plan import output_default
from scanner.plan.body import judge
from scanner.plan.budget import Budget
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.plan.model import Decision, Plan
from scanner.plan.output_default import OutputDefault
from scanner.policy.model import Policy
from tests.differential.harness import Case, compare, run, stand
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
ORACLE = Path(__file__).with_name("render_oracle.py")
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def test_serve_arguments_are_read_as_vllm_reads_them() -> None:
    read = output_default.read
    assert read(("--model", "m")) == OutputDefault()
    assert read(("--max-model-len", "4096")).max_model_len == 4096
    assert read(("--max_model_len=8k",)).max_model_len == 8000
    assert read(("--max-model-len", "8K")).max_model_len == 8192
    assert read(("--max-model-len", "25.6k")).max_model_len == 25600
    assert read(("--max-model-len", "1.5K")).max_model_len is None      # vLLM refuses it
    assert read(("--max-model-len", "auto")).max_model_len is None      # fitted to memory: unknown
    assert read(("--max-model-len", "-1")).max_model_len is None
    assert read(("--max-model-len", "4096", "--max-model-len", "2048")).max_model_len == 2048   # the last
    over = read(("--override-generation-config", '{"max_new_tokens": 1000, "temperature": 0.5}'))
    assert over == OutputDefault(max_new_tokens=1000) and over.bound == 1000
    assert read(("--override-generation-config", '{"max_new_tokens": true}')).max_new_tokens is None
    assert read(("--override-generation-config", "{bad")).max_new_tokens is None
    assert OutputDefault(8192, 1000).bound == 1000 and OutputDefault(4096, 8000).bound == 4096


def _budget(window: int | None = None, new: int | None = None, when: str = "inject") -> Budget:
    return Budget(("max_completion_tokens", "max_tokens"), "max_completion_tokens", 4096,
                  when, OutputDefault(window, new))  # type: ignore[arg-type]


def test_what_is_written_and_charged() -> None:
    unknown = _budget()
    assert (unknown.written(100), unknown.output(100), unknown.written(10**6)) == (4096, 4096, 4096)
    small = _budget(4096)                    # vLLM's default (4096 - prompt) is within the cap
    assert small.quiet and small.written(10) is None and small.output(10) == 4096
    assert small.forwarded({"model": "m", "max_tokens": None}, 10) == {"model": "m", "max_tokens": None}
    big = _budget(8192)
    assert [big.written(n) for n in (100, 4096, 4097, 8191, 8192, 20000)] == [4096, 4096, 4095, 1, None, None]
    assert [big.output(n) for n in (100, 8191, 8192)] == [4096, 1, 8192]
    assert big.forwarded({"model": "m", "max_tokens": None}, 5000) == {"model": "m", "max_completion_tokens": 3192}
    assert big.forwarded({"model": "m"}, 9000) == {"model": "m"}
    assert big.forwarded({"max_tokens": 7}, 9000) == {"max_tokens": 7}
    capped = _budget(8192, 1000)             # --override-generation-config max_new_tokens 1000
    assert capped.quiet and capped.written(100) is None and capped.output(100) == 1000
    loose = _budget(8192, 6000)              # an override above the cap: the window rule
    assert loose.written(100) == 4096 and loose.output(9000) == 6000
    assert _budget(8192, when="pass").written(100) is None and _budget(8192, when="pass").output(100) == 8192
    assert _budget(8192, when="reject").forwarded({"model": "m"}, 10) is None


def _inventory(window: int, new: int | None = None) -> Inventory:
    inv = load_ref(CATALOG)
    assert inv.vllm is not None
    extra = ("--override-generation-config", json.dumps({"max_new_tokens": new})) if new else ()
    return replace(inv, vllm=replace(inv.vllm, serve_args=("--model", "m", "--max-model-len", str(window), *extra)))


def _plan(window: int, new: int | None = None) -> Plan:
    return build(_inventory(window, new), load_policy(None))


def test_the_plan_carries_the_default_and_the_default_catalog_plan_is_unchanged() -> None:
    d = _plan(8192).decision("POST", CHAT)
    assert d is not None and d.budget is not None and d.budget.window == 8192
    assert d.to_dict()["budget"]["default"] == {"max_model_len": 8192}
    plain = build(load_ref(CATALOG), load_policy(None)).decision("POST", CHAT)
    assert plain is not None and plain.budget is not None and "default" not in plain.to_dict()["budget"]


def _text(tokens: int, worst: bool) -> str:
    """A prompt of ``tokens`` tokens of the oracle's tokenizer: ``a!`` is 2 tokens in 2 bytes (one
    token per byte, the worst case for a byte bound), ``hello `` 1 token in 6 bytes."""
    return "a!" * (tokens // 2) + "a" * (tokens % 2) if worst else "hello " * tokens


def _bodies() -> list[tuple[str, str, bytes]]:
    out = []
    for tokens in (10, 1000, 2000, 3000, 4000, 4090, 5000, 6000, 8000, 8185):
        for worst in (True, False):
            text = _text(tokens, worst)
            kind = "worst" if worst else "wordy"
            out.append((f"chat-{kind}-{tokens}", CHAT,
                        json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()))
            out.append((f"cmpl-{kind}-{tokens}", COMPLETIONS, json.dumps({"model": "m", "prompt": text}).encode()))
    out.append(("chat-null-budget", CHAT, json.dumps({"model": "m", "max_tokens": None, "messages": [
        {"role": "user", "content": _text(3000, True)}]}).encode()))
    out.append(("cmpl-list", COMPLETIONS, json.dumps({"model": "m", "prompt": [_text(3000, True), "hello"]}).encode()))
    return out


def _render(python: str, window: int, new: int | None, bodies: list[tuple[str, str, bytes]],
            model: Path) -> dict[str, dict]:
    lines = "".join(json.dumps({"id": i, "path": p, "body": b.decode()}) + "\n" for i, p, b in bodies)
    argv = [python, str(ORACLE), str(model), str(window), *([str(new)] if new else [])]
    done = subprocess.run(argv, input=lines, capture_output=True, text=True, timeout=600, check=False,
                          env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    rows = [json.loads(ln[7:]) for ln in done.stdout.splitlines() if ln.startswith("RENDER ")]
    if done.returncode != 0 or len(rows) != len(bodies):
        raise RuntimeError(f"render oracle failed: {done.stderr[-3000:]}")
    return {r["id"]: r for r in rows}


@cache
def _decision(window: int, new: int | None, path: str) -> Decision:
    d = _plan(window, new).decision("POST", path)
    assert d is not None and d.budget is not None
    return d


@pytest.mark.parametrize(("window", "new"), [(4096, None), (8192, None), (8192, 1000)])
def test_vllm_accepts_every_fitting_body_the_perimeter_forwards(vllm_python: str, tmp_path: Path,
                                                                window: int, new: int | None) -> None:
    """Each body as sent, as the perimeter forwards it (the Python reference), and with the cap
    written in (the behaviour before): vLLM's render path decides. Every body whose prompt fits
    (accepted as sent) is accepted as forwarded; vLLM then generates at most the envelope's output
    per sequence, and at most the cap where a budget was written."""
    sent = _bodies()
    asked: list[tuple[str, str, bytes]] = []
    forwarded: dict[str, dict[str, object]] = {}
    for cid, path, raw in sent:
        d = _decision(window, new, path)
        ref = judge(d, raw)
        assert not ref.refused and ref.body is not None, (cid, ref.reason)
        forwarded[cid] = ref.body
        budget = d.budget
        assert budget is not None
        capped = {**{k: v for k, v in json.loads(raw).items() if k not in budget.fields}, budget.field: budget.cap}
        asked += [(f"{cid}/sent", path, raw), (f"{cid}/fwd", path, json.dumps(ref.body).encode()),
                  (f"{cid}/cap", path, json.dumps(capped).encode())]
    got = _render(vllm_python, window, new, asked, tmp_path / "model")
    fits = refused_before = 0
    for cid, path, raw in sent:
        d = _decision(window, new, path)
        budget = d.budget
        assert budget is not None
        if not got[f"{cid}/sent"]["ok"]:
            continue                             # the prompt does not fit: vLLM refuses it anyway
        fits += 1
        refused_before += not got[f"{cid}/cap"]["ok"]
        fwd = got[f"{cid}/fwd"]
        assert fwd["ok"], (cid, len(raw), fwd["error"])
        charged = plan_body.envelope(d, raw).output
        assert max(fwd["max_tokens"]) <= charged, (cid, fwd["max_tokens"], charged)
        written = budget.written(len(raw))
        if written is not None:
            assert forwarded[cid][budget.field] == written and max(fwd["max_tokens"]) <= written <= budget.cap
        else:
            assert budget.field not in forwarded[cid] or forwarded[cid][budget.field] is None
    print(f"\nmax_model_len {window}, max_new_tokens {new}: {fits} of {len(sent)} bodies fit; "
          f"all {fits} accepted as forwarded; {refused_before} refused with the cap written (before)")
    assert fits >= len(sent) // 2
    assert refused_before > 0 if new is None else True     # the case this fixes


def _proxy_policy(limit: int) -> Policy:
    """The bundled policy with max_request_tokens = ``limit`` for every audience: the envelope's
    tokens of a body are then seen through the proxy (admitted at it, refused over it)."""
    policy = load_policy(None)
    return replace(policy, audiences={
        n: replace(a, limits=replace(a.limits, max_request_tokens=limit) if a.limits else a.limits)
        for n, a in policy.audiences.items()})


def _sized(cid: str, path: str, nbytes: int) -> Case:
    """A body of exactly ``nbytes`` bytes with no budget (padded with spaces, which the oracle's
    tokenizer does not count)."""
    key = "messages" if path == CHAT else "prompt"
    def body(text: str) -> bytes:
        return json.dumps({"model": "m", key: [{"role": "user", "content": text}] if key == "messages" else text}).encode()
    base = len(body("a!" * 50))
    raw = body("a!" * 50 + " " * (nbytes - base))
    assert len(raw) == nbytes
    return Case(cid, path, raw)


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_njs_and_lua_write_and_charge_what_the_reference_does(tmp_path: Path, name: str) -> None:
    """On a model of 8192 tokens (cap 4096, max_request_tokens 8192): a small body gets the cap
    (charged 4096 + bytes), a body of 6000 bytes 2192 (charged exactly 8192: admitted), one of 8191
    bytes 1 (8192: admitted), one of 8192 bytes nothing (vLLM's default, charged 8192 + 8192:
    refused envelope-tokens); each forwarded body exactly the reference's (the witness)."""
    window = 8192
    inv = _inventory(window)
    s = stand(inv, _proxy_policy(window), tmp_path)
    cases = [_sized(f"{p[4:8]}-{n}", p, n) for p in (CHAT, COMPLETIONS) for n in (200, 6000, 8191, 8192, 9000)]
    seen = run(s, inv, proxy_named(name), cases)
    plan = s.setup.plan
    outcomes = {}
    for case in cases:
        d = plan.decision("POST", case.path)
        assert d is not None
        ref = judge(d, case.raw)
        assert compare(ref, seen[case.id], case.raw) == "", (case.id, seen[case.id], ref)
        outcomes[case.id] = ref.reason or str((ref.body or {}).get(d.budget.field if d.budget else "", "-"))
    assert outcomes == {f"{k}-{n}": v for k in ("chat", "comp") for n, v in (
        (200, "4096"), (6000, "2192"), (8191, "1"), (8192, "envelope-tokens:over-8192"),
        (9000, "envelope-tokens:over-8192"))}, outcomes


def _probe_budget(tmp_path: Path, name: str, edit: tuple[str, str, str] | None) -> tuple[int, set[str]]:
    """The limits check through ``name`` generated for a model of 8192 tokens (hand-edited by
    ``edit``: file, old, new): its exit code and the rules of its findings."""
    from scanner.net import free_port
    from scanner.probe.interface import ProbeOptions
    from scanner.standin.serve import StandinThread
    from scanner.verify import loop
    from tests.probe.realproxy import unpaced

    inv = _inventory(8192)
    port = free_port()
    s = loop.setup(inv, unpaced(load_policy(None)), tmp_path, port)
    proxy = proxy_named(name)
    written = proxy.write(s.plan, tmp_path / "proxy")
    if edit is not None:
        f = written / edit[0]
        text = f.read_text()
        assert edit[1] in text
        f.write_text(text.replace(edit[1], edit[2]))
    options = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300, checks=("limits",))
    with StandinThread(inv, "127.0.0.1", port) as st:
        res = loop.proxy_run(s, proxy, tmp_path / "proxy", options, st.url).result
    budgets = [c for c in res.coverage if c.subject.startswith("budget ")]
    assert budgets and (edit is not None or {c.status for c in budgets} == {"proved"}), budgets
    return res.exit_code(), {f.rule for f in res.findings}


@pytest.mark.parametrize(("name", "edit"), [
    ("nginx", None), ("envoy", None),
    # the budget no longer fitted into the context length: the cap written into a long body
    ("nginx", ("perimeter-rules.json", '"op":"budget","window":8192}', '"op":"budget","window":0}')),
    ("envoy", ("envoy.yaml", '["cap"] = 4096, ["window"] = 8192}', '["cap"] = 4096, ["window"] = 0}')),
])
def test_the_probe_proves_the_fitted_budget(tmp_path: Path, name: str, edit: tuple[str, str, str] | None) -> None:
    code, rules = _probe_budget(tmp_path, name, edit)
    if edit is None:
        assert code == 0 and rules <= {"VP011"}, rules
    else:
        assert code == 1 and "VP015" in rules, rules
