"""Access-log lines of the real proxies (issue 19, item 5): NGINX 1.31 and 1.22 (log_format with
escape=json, variables njs sets) and Envoy 1.40 (json_format, dynamic metadata Lua sets) record
for each request the principal, route, model, status, latency, request id, the admitted envelope
(sequences, output budget per sequence and whether it was sent or written, tokens charged) and a
usage field (INPUT+OUTPUT once an answer settles a token budget's charge, tests/generate/
test_nginx_settle.py; empty otherwise); scanner.audit.access_log reads both. No key, nor
any part of one beyond what the plan publishes, is ever in a line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scanner.audit import access_log
from scanner.inventory.catalog import load_ref
from scanner.plan import body as plan_body
from scanner.plan.body import judge
from scanner.plan.inputs import load_policy
from tests.differential.harness import Case, run, stand
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES = [{"role": "user", "content": "hello"}]


def _cases() -> list[Case]:
    def c(cid: str, path: str, body: dict[str, object]) -> Case:
        return Case(cid, path, json.dumps(body).encode())
    return [
        c("n2-written", CHAT, {"model": "m", "n": 2, "messages": MESSAGES}),
        c("sent", CHAT, {"model": "m", "max_tokens": 7, "messages": MESSAGES}),
        c("prompts", COMPLETIONS, {"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 5}),
        c("odd-model", CHAT, {"model": 'm"x\ny\\z', "max_completion_tokens": 3, "messages": MESSAGES}),
        c("over-cap", CHAT, {"model": "m", "max_tokens": 999999, "messages": MESSAGES}),
    ]


def test_the_reader_takes_both_shapes() -> None:
    got, bad = access_log.entries([
        '{"time":"t","principal":"alice","route":"/v1/models","method":"GET","path":"/v1/models",'
        '"status":200,"latency_s":0.012,"decision":"allow","reason":"","request_id":"abc",'
        '"model":"","sequences":"","output":"","output_from":"","tokens_charged":"","usage":""}',
        # a settled answer (token budgets; tests/generate/test_nginx_settle.py): INPUT+OUTPUT
        '{"time":"t","principal":"bob","route":"/v1/completions","method":"POST","path":"/v1/completions",'
        '"status":200,"latency_s":0.2,"decision":"allow","reason":"","request_id":"def","model":"m",'
        '"sequences":"4","output":"147","output_from":"sent","tokens_charged":"666","usage":"40+40"}',
        '{"time":"t","principal":null,"route":"allow:GET /v1/models","method":"GET","path":"/v1/models",'
        '"status":"200","latency_ms":"3","decision":null,"reason":null,"request_id":"u-1","model":"m",'
        '"sequences":2,"output":4096,"output_from":"written","tokens_charged":8200,"usage":null}',
        "not json", "",
    ])
    assert bad == 1 and [e.proxy for e in got] == ["nginx", "nginx", "envoy"]
    settled, got = got[1], (got[0], got[2])
    assert (settled.tokens_charged, settled.usage, settled.sequences) == (666, "40+40", 4)
    assert got[0].latency_ms == 12.0 and got[0].sequences is None and got[0].principal == "alice"
    assert (got[1].sequences, got[1].output, got[1].output_from, got[1].tokens_charged) == (2, 4096, "written", 8200)
    assert got[1].principal == "" and got[1].usage == ""


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_every_line_carries_the_request_and_its_envelope(tmp_path: Path, name: str) -> None:
    inventory = load_ref(CATALOG)
    s = stand(inventory, load_policy(None), tmp_path)
    cases = _cases()
    seen = run(s, inventory, proxy_named(name), cases)
    logs = list((tmp_path / name).rglob("access.log"))
    assert len(logs) == 1, logs
    text = logs[0].read_text(encoding="utf-8")
    for cred in s.setup.credentials:
        assert not cred.secret or cred.secret not in text       # never a key
    got, bad = access_log.read(logs[0])
    assert bad == 0
    # (a request the harness sent again on a fresh connection leaves a 499/408 line behind)
    mine = [e for e in got if e.path in (CHAT, COMPLETIONS) and e.status not in (408, 499)]
    assert len(mine) == len(cases), [(e.path, e.status) for e in got]
    plan = s.setup.plan
    ids = set()
    for case, e in zip(cases, mine, strict=True):
        d = plan.decision("POST", case.path)
        assert d is not None and d.budget is not None
        ref = judge(d, case.raw, s.salt(case.role, case.path))
        env = plan_body.envelope(d, case.raw)
        assert e.status == seen[case.id].status and e.method == "POST" and e.latency_ms >= 0
        assert e.principal == next(p.name for p in plan.principals if p.role == case.role)
        assert e.route and e.request_id and e.request_id not in ids
        ids.add(e.request_id)
        assert e.model == json.loads(case.raw)["model"][:128]
        assert e.sequences == env.sequences
        assert e.usage == ""
        if ref.refused:
            assert e.decision == "deny" and e.reason.startswith(ref.reason)
            continue
        assert e.decision in ("allow", "")   # Envoy: no decision on vLLM's own answers
        assert (e.output, e.output_from) == (env.output, "written" if case.id == "n2-written" else "sent")
        assert e.tokens_charged == (min(plan_body.token_cost(d, case.raw), d.token_capacity + 1)
                                    if d.token_zone else None)


def test_the_reader_takes_an_envoy_settled_answer() -> None:
    # Envoy's line of a settled answer (tests/generate/test_envoy_settle.py): the reservation in
    # tokens_charged, the usage as INPUT+OUTPUT, the refund beside it
    got, bad = access_log.entries([
        '{"time":"t","principal":"verify-user-1","route":"allow:POST /v1/chat/completions","method":"POST",'
        '"path":"/v1/chat/completions","status":"200","latency_ms":"4","decision":null,"reason":null,'
        '"request_id":"r","model":"m","sequences":1,"output":400,"output_from":"sent","tokens_charged":232,'
        '"usage":"20+10","tokens_refunded":202}'])
    assert bad == 0 and got[0].proxy == "envoy"
    assert (got[0].tokens_charged, got[0].usage, got[0].sequences) == (232, "20+10", 1)
