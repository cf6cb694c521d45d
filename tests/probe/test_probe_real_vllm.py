"""The prober against the real engine-less vLLM 0.29.0 app, no proxy: the "vLLM alone" case,
and the safe-probe claim verified route by route."""

from __future__ import annotations

import json

import httpx
import pytest
from click.testing import CliRunner

from scanner.inventory.model import Inventory
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy.load import load
from scanner.probe import safe
from scanner.probe.checks.limits import padded_json
from scanner.probe.config import credentials
from scanner.probe.interface import ProbeOptions, Target, Vantage
from scanner.probe.runner import probe
from scanner.resources import data_file

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def default_plan(everything_inventory: Inventory) -> Plan:
    return build(everything_inventory, load(data_file("policies", "vllm-default.yaml")))


def _state_changing_paths(plan: Plan) -> dict[str, tuple[str, ...]]:
    out: dict[str, set[str]] = {}
    for d in plan.decisions:
        if d.kind != "mount" and d.state_changing:
            out.setdefault(d.path, set()).add(d.method)
    return {p: tuple(sorted(m)) for p, m in out.items()}


def test_vllm_alone_has_critical_findings(real_vllm, default_plan: Plan) -> None:  # type: ignore[no-untyped-def]
    opts = ProbeOptions(rate=0, concurrency=8, checks=("matrix", "bypass", "sweep"))
    r = probe(default_plan, Target(real_vllm.url), credentials([]), [Vantage()], opts)
    assert not r.unreachable, r.reason
    critical = {f.path for f in r.findings if f.severity == "critical"}
    for path in ("/invocations", "/pause", "/sleep", "/collective_rpc", "/update_weights",
                 "/v1/load_lora_adapter", "/tokenizer_info", "/openapi.json"):
        assert path in critical, path
    assert any(f.rule == "VP003" and f.path == "/metrics" for f in r.findings)  # monitoring from loopback
    assert r.exit_code("high") == 1
    # Safe by default: no request to a state-changing route reached a handler (the engine-less
    # app answers 500 when a handler acts, because it has no engine).
    sc = _state_changing_paths(default_plan)
    hits = [a for a in r.attempts if a.path in sc and a.outcome != "skipped" and a.check != "sweep"]
    assert hits and all(a.status != 500 for a in hits), [a.request_line for a in hits if a.status == 500]


def test_pipelining_gives_the_same_answers(real_vllm, default_plan: Plan) -> None:  # type: ignore[no-untyped-def]
    def outcomes(pipeline: int) -> dict[tuple[str, str, str], tuple[int | None, str]]:
        opts = ProbeOptions(rate=0, concurrency=4, pipeline=pipeline, checks=("matrix",))
        r = probe(default_plan, Target(real_vllm.url), credentials([]), [Vantage()], opts)
        return {(a.request_line, a.credential, a.vantage): (a.status, a.outcome) for a in r.attempts}

    plain, piped = outcomes(1), outcomes(8)
    assert plain.keys() == piped.keys()
    diff = {k: (plain[k], piped[k]) for k in plain if plain[k] != piped[k]}
    assert not diff, diff


def test_safe_probes_are_rejected_before_the_handler(real_vllm, default_plan: Plan) -> None:  # type: ignore[no-untyped-def]
    sc = _state_changing_paths(default_plan)
    assert {"/pause", "/sleep", "/collective_rpc", "/update_weights", "/v1/load_lora_adapter",
            "/reset_prefix_cache", "/abort_requests", "/adapters"} <= set(sc)
    verified: list[str] = []
    problems: list[str] = []
    with httpx.Client(base_url=real_vllm.url, timeout=10) as client:
        for path, declared in sorted(sc.items()):
            concrete = path.replace("{adapter_name}", "probe-x1")
            wrong = safe.wrong_method(declared)
            resp = client.request(wrong, concrete)
            if resp.status_code != 405 or "Method Not Allowed" not in resp.text:
                problems.append(f"{wrong} {path}: {resp.status_code} {resp.text[:80]}")
            for method in declared:
                probe_req = safe.declared_probe(method, path)
                if probe_req is None:
                    continue
                url = f"{concrete}?{probe_req.query}" if probe_req.query else concrete
                headers = {"Content-Type": probe_req.content_type} if probe_req.content_type else {}
                resp = client.request(method, url, content=probe_req.body, headers=headers)
                ok = resp.status_code in (400, 422) and "validation error" in resp.text
                (verified if ok else problems).append(f"{method} {url}: {resp.status_code} {resp.text[:80]}")
                # the limits check builds its bodies on the same request: still refused first
                _query, fields = safe.carrier(method, path) or ("", {})
                for body in (padded_json(65537, fields), json.dumps({**fields, "max_tokens": 10**9}).encode(),
                             json.dumps({**fields, "cache_salt": "x"}).encode()):
                    resp = client.request(method, url, content=body, headers={"Content-Type": "application/json"})
                    ok = resp.status_code in (400, 422) and "validation error" in resp.text
                    (verified if ok else problems).append(f"{method} {url} (limit body): {resp.status_code}")
    assert not problems, problems
    assert len(verified) == 6 * 4, verified  # every declared-method probe in the table was exercised


def test_cli_against_real_vllm(real_vllm, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scanner.cli.probe import command

    key = "vp_cli-secret-value-never-printed-42"
    monkeypatch.setenv("SVC_KEY", key)
    out = tmp_path / "r.sarif"
    res = CliRunner().invoke(command, [
        real_vllm.url, "--inventory", "vllm-0.29.0-everything",
        "--policy", str(data_file("policies", "vllm-default.yaml")), "--key", "service=env:SVC_KEY",
        "--rate", "0", "--check", "matrix", "--format", "sarif", "-o", str(out), "-q"],
        standalone_mode=False)
    assert res.exception is None, res.output
    assert res.return_value == 1
    text = out.read_text()
    assert '"version": "2.1.0"' in text and key not in text and key not in res.output
