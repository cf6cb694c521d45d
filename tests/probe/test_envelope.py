"""The admitted envelope (issue 19, items 2, 3 and 6): what one body makes vLLM do, decided once in
the plan (scanner/plan/envelope.py, Decision.envelope), capped per request (limits.max_sequences,
limits.max_request_tokens) and charged against token budgets, on NGINX 1.31 (njs) and Envoy (Lua)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scanner.errors import PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan import body as plan_body
from scanner.plan.model import Decision
from scanner.policy.load import loads
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.verify import loop
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-everything"
POLICY = """
schema_version: 1
name: envelope
networks: {local: [127.0.0.0/8]}
audiences:
  inference:
    kind: end-user
    networks: [local]
    roles: [user]
    limits:
      json_caps: {max_tokens: 100, max_completion_tokens: 100, n: 8, best_of: 8}
      tokens_per_minute: TPM
      tokens_burst: TPM           # the whole minute at once: these tests count multipliers, not the bucket
      max_sequences: 6
      max_request_tokens: 1000
routes:
  - {path: /v1/chat/completions, methods: [POST], audience: inference}
  - {path: /v1/completions, methods: [POST], audience: inference}
  - {path: /v1/chat/completions/batch, methods: [POST], audience: inference}
  - {path: /v1/embeddings, methods: [POST], audience: inference}
  - {path: /v1/rerank, methods: [POST], audience: inference}
  - {path: /v2/embed, methods: [POST], audience: inference}
"""
LIMITS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=180, checks=("limits",))
TOKENS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=180, checks=("token-budget",))


def policy_text(tpm: int = 3000) -> str:
    return POLICY.replace("TPM", str(tpm))


def decisions(tmp_path: Path, text: str) -> dict[str, Decision]:
    plan = loop.setup(load_ref(CATALOG), loads(text), tmp_path, 9).plan
    return {d.path: d for d in plan.decisions if d.method == "POST"}


def env(d: Decision, body: object) -> tuple[int, int, int]:
    raw = json.dumps(body).encode()
    e = plan_body.envelope(d, raw)
    assert e.input == len(raw)
    return e.sequences, e.output, e.tokens


# --- the envelope in the plan (vLLM's semantics) ---------------------------------------------------

def test_the_envelope_counts_what_vllm_runs(tmp_path: Path) -> None:
    ds = decisions(tmp_path, policy_text())
    comp, chat, batch = ds["/v1/completions"], ds["/v1/chat/completions"], ds["/v1/chat/completions/batch"]
    assert env(comp, {"prompt": "hi", "n": 4, "max_tokens": 100})[:2] == (4, 100)
    assert env(comp, {"prompt": ["a"] * 64, "max_tokens": 100})[:2] == (64, 100)      # one per prompt
    assert env(comp, {"prompt": [1, 2, 3]})[:2] == (1, 100)                           # token ids: one
    assert env(comp, {"prompt": [[1, 2], [3]], "n": "2"})[:2] == (4, 100)             # ids lists x n
    assert env(chat, {"messages": [{"role": "user", "content": "x"}] * 9, "n": 3})[:2] == (3, 100)
    assert env(batch, {"messages": [[{"role": "user", "content": "x"}]] * 5, "n": 2, "best_of": 3})[0] == 15
    assert env(ds["/v1/embeddings"], {"input": ["a", "b", "c"]})[:2] == (3, 0)
    assert env(ds["/v1/embeddings"], {"input": [[1], [2]]})[0] == 2
    assert env(ds["/v1/rerank"], {"query": "q", "documents": ["a", "b", "c"]})[0] == 3
    assert env(ds["/v2/embed"], {"texts": ["a", "b"], "images": ["x"]})[0] == 3
    e = plan_body.envelope(comp, b'{"prompt": ["a", "b"], "n": 3, "max_tokens": 7, "model": "m"}')
    assert (e.sequences, e.output, e.model, e.tokens) == (6, 7, "m", 6 * 7 + e.input)
    assert plan_body.envelope(comp, b"not json").sequences == 1 and plan_body.envelope(comp, b"not json").output == 0
    # the charge is the envelope, at least 1
    assert plan_body.token_cost(comp, b'{"prompt": ["a", "b"], "max_tokens": 10}') == 2 * 10 + 40
    assert plan_body.token_cost(comp, b"") == 1


def test_the_caps_refuse_with_their_own_reasons(tmp_path: Path) -> None:
    comp = decisions(tmp_path, policy_text())["/v1/completions"]
    assert comp.envelope_capped
    assert plan_body.envelope_refusal(comp, b'{"n": 7}') == "envelope-sequences:over-6"
    assert plan_body.envelope_refusal(comp, b'{"n": 6}') == ""
    assert plan_body.envelope_refusal(comp, b'{"n": 6, "max_tokens": 100, "pad": "' + b"a" * 400 + b'"}') \
        == "envelope-tokens:over-1000"
    doc = comp.to_dict()
    assert doc["limits"]["max_sequences"] == 6 and doc["envelope"]["per_item"] == ["n"]


@pytest.mark.parametrize("value", ["0", "-1", "2147483648", "1.5", "many"])
def test_caps_a_proxy_cannot_take_are_policy_errors(value: str) -> None:
    with pytest.raises(PolicyError, match=r":\d+: .*max_sequences"):
        loads(policy_text().replace("max_sequences: 6", f"max_sequences: {value}"))


# --- on the real proxies ---------------------------------------------------------------------------

def _static_nginx(proxy: str) -> None:
    p = proxy_named(proxy)
    if proxy == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")


def _cov(result: ProbeResult, prefix: str) -> dict[str, str]:
    return {c.subject: c.status for c in result.coverage if c.subject.startswith(prefix)}


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_every_envelope_cap_is_proven_on_every_route(tmp_path: Path, proxy: str) -> None:
    _static_nginx(proxy)
    result = probe_through(tmp_path, proxy_named(proxy), loads(policy_text(10 ** 6)), CATALOG, LIMITS)
    assert not result.findings, result.findings
    seqs, toks = _cov(result, "envelope-sequences"), _cov(result, "envelope-tokens")
    assert len(seqs) == len(toks) == 6 and set(seqs.values()) == set(toks.values()) == {"proved"}, (seqs, toks)
    over = [a for a in result.attempts if a.reason.startswith("envelope-") and a.status == 400]
    assert {a.path for a in over} == {"/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch",
                                      "/v1/embeddings", "/v1/rerank", "/v2/embed"}


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_the_budget_charges_every_multiplier(tmp_path: Path, proxy: str) -> None:
    _static_nginx(proxy)
    result = probe_through(tmp_path, proxy_named(proxy), loads(policy_text(3000)), CATALOG, TOKENS, paced=True,
                           keys_per_role=2)
    assert not result.findings, result.findings
    zone = "token-budget inference:key:3000t/m/3000"
    assert _cov(result, zone)[zone] == "proved"
    sent = [a for a in result.attempts if a.subject == zone]
    shapes = {a.note.split("; ")[1].split(":")[0] for a in sent if "; " in a.note and "sequences" in a.note}
    assert {"n", "prompt list", "messages list"} <= shapes, shapes
    settled = [a for a in sent if "settled by its answer's usage" in a.note]
    cost = int(sent[0].note.split()[1])
    assert len(settled) == 3000 // cost and cost < 1000, (cost, len(settled))   # one per multiplier fits


# --- hand weakenings: the probe must fail them ------------------------------------------------------

def _weakened(tmp_path: Path, proxy: str, tpm: int, options: ProbeOptions, edits: dict[str, tuple[str, str]],
              keys_per_role: int = 1) -> ProbeResult:
    """The policy's config for ``proxy`` with ``edits`` (file name -> (old, new) text) made by
    hand, probed in front of the stand-in."""
    from scanner.net import free_port
    from scanner.standin.serve import StandinThread
    from tests.probe.realproxy import unpaced

    tmp_path.mkdir(parents=True, exist_ok=True)
    inventory, port, p = load_ref(CATALOG), free_port(), proxy_named(proxy)
    s = loop.setup(inventory, unpaced(loads(policy_text(tpm))), tmp_path, port, keys_per_role=keys_per_role)
    directory = tmp_path / "proxy"
    p.write(s.plan, directory)
    for name, (old, new) in edits.items():
        path = next(directory.rglob(name))
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new))
    with StandinThread(inventory, "127.0.0.1", port) as standin:
        return loop.proxy_run(s, p, directory, options, standin.url).result


IGNORED = {   # the prompt-list / batch multiplier ignored: only n / best_of counted
    "nginx": {"perimeter.js": ("s.seq = Math.max(1, items) * per;", "s.seq = per;")},
    "envoy": {"envoy.yaml": ("r.seq, r.out, r.from = math.max(1, items) * per,", "r.seq, r.out, r.from = per,")},
}
RAISED = {    # max_sequences 6 -> 60
    "nginx": {"perimeter-rules.json": ('"max_sequences":6,', '"max_sequences":60,')},
    "envoy": {"envoy.yaml": ('["max_sequences"] = 6,', '["max_sequences"] = 60,')},
}


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_a_multiplier_ignored_by_hand_fails_the_probe(tmp_path: Path, proxy: str) -> None:
    _static_nginx(proxy)
    tokens = _weakened(tmp_path / "t", proxy, 3000, TOKENS, IGNORED[proxy], keys_per_role=2)
    assert tokens.exit_code() == 1 and any(f.rule == "VP005" for f in tokens.findings), tokens.findings
    caps = _weakened(tmp_path / "c", proxy, 10 ** 6, LIMITS, IGNORED[proxy])
    assert caps.exit_code() == 1 and any("max_sequences" in repr(f)
                                         for f in caps.findings), caps.findings


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_a_raised_cap_fails_the_probe(tmp_path: Path, proxy: str) -> None:
    _static_nginx(proxy)
    result = _weakened(tmp_path, proxy, 10 ** 6, LIMITS, RAISED[proxy])
    assert result.exit_code() == 1 and any("max_sequences" in repr(f)
                                           for f in result.findings), result.findings


# --- the mutation operators (scanner/mutate/core.py): multiplier-ignored, envelope-cap-raised -------

BUNDLED = "vllm-0.29.0-default"
DEFAULT = Path(__file__).parents[2] / "policies" / "vllm-default.yaml"


def _bundled_with_budget(tpm: int) -> str:
    return DEFAULT.read_text().replace("      concurrency: 16\n",
                                       f"      concurrency: 16\n      tokens_per_minute: {tpm}\n", 1)


def test_the_operators_weaken_the_rendered_envelope_only(tmp_path: Path) -> None:
    from scanner.mutate import core

    plan = loop.setup(load_ref(BUNDLED), loads(DEFAULT.read_text()), tmp_path, 9).plan
    weak, what = core.weakening("multiplier-ignored")(plan)
    chat = next(d for d in plan.decisions if (d.method, d.path) == ("POST", "/v1/chat/completions"))
    mutant = next(d for d in weak.decisions if (d.method, d.path) == ("POST", "/v1/chat/completions"))
    assert what.startswith("POST /v1/chat/completions: envelope ignores n"), what
    body = json.dumps({"messages": [[{"role": "user", "content": "x"}]] * 5, "n": 4}).encode()
    assert plan_body.envelope(chat, body).sequences == 20 and plan_body.envelope(mutant, body).sequences == 5
    assert plan_body.envelope_refusal(chat, body) and not plan_body.envelope_refusal(mutant, body)
    weak, what = core.weakening("envelope-cap-raised")(plan)
    assert what == "POST /v1/responses: max_sequences 16 -> 160, max_request_tokens 1114112 -> 11141120"
    assert [(d.limits.max_sequences, d.limits.max_request_tokens) for d in weak.decisions
            if (d.method, d.path) == ("POST", "/v1/responses")] == [(160, 11141120)]
    # the plan the probe reads is untouched
    assert chat.envelope_spec.per_item == ("n",) and chat.limits.max_sequences == 16


@pytest.mark.parametrize("proxy", ["nginx", "nginx-lua", "envoy"])
def test_an_ignored_n_capped_under_max_sequences_is_caught_by_the_limits_check(tmp_path: Path, proxy: str) -> None:
    # the bundled policy caps n at 4 under max_sequences 16: n alone never exceeds the cap, so the
    # probe proves it times another multiplier (n 4 x a list of 5 conversations: 20 sequences)
    p = proxy_named(proxy)
    for sub in ("clean", "weak", "raised"):
        (tmp_path / sub).mkdir()
    clean = probe_through(tmp_path / "clean", p, loads(DEFAULT.read_text()), BUNDLED, LIMITS)
    assert not clean.findings, clean.findings
    partnered = [a for a in clean.attempts if a.path == "/v1/chat/completions" and a.note.startswith("n 4 x ")]
    assert len(partnered) == 2 and {(a.status, a.reason.partition(":")[0]) for a in partnered} == \
        {(400, "envelope-sequences"), (200, "")}, [(a.note, a.status, a.reason) for a in partnered]
    weak = probe_through(tmp_path / "weak", p, loads(DEFAULT.read_text()), BUNDLED, LIMITS,
                         mutant="multiplier-ignored")
    assert weak.exit_code() == 1, weak.findings
    over = [a for a in weak.attempts if a.path == "/v1/chat/completions" and a.note.startswith("n 4 x ")
            and a.verdict == "failed"]
    assert over and all(a.outcome == "reached" for a in over), [(a.note, a.status) for a in over]
    raised = probe_through(tmp_path / "raised", p, loads(DEFAULT.read_text()), BUNDLED, LIMITS,
                           mutant="envelope-cap-raised")
    assert raised.exit_code() == 1 and any("max_sequences" in repr(f) and "/v1/responses" in repr(f)
                                           for f in raised.findings), raised.findings


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_an_ignored_n_is_caught_by_the_token_budget(tmp_path: Path, proxy: str) -> None:
    _static_nginx(proxy)
    result = probe_through(tmp_path, proxy_named(proxy), loads(_bundled_with_budget(60000)), BUNDLED, TOKENS,
                           mutant="multiplier-ignored", paced=True, keys_per_role=2)
    assert result.exit_code() == 1 and any(f.rule == "VP005" and "token budget" in f.title
                                           for f in result.findings), result.findings
