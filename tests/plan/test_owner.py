"""Ownership of stored responses: the MAC scheme (scanner/plan/owner.py), the policy switch and
the plan's owned routes, decided from the inventory."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

import pytest

from scanner import reasons
from scanner.errors import ConfigError, PlanError
from scanner.plan import body, owner
from scanner.plan.inputs import make_plan

REPO = Path(__file__).resolve().parents[2]
SECRET = b"s" * 40
RID = "resp_0123456789abcdef"


def owned_policy(tmp_path: Path, extra: str = "", secret: bool = True) -> Path:
    """The bundled policy with responses: owned (its secret file at tmp_path)."""
    text = (REPO / "policies" / "vllm-default.yaml").read_text()
    lines = "\n  responses: owned" + (f"\n  responses_secret_file: {tmp_path / 'rs'}" if secret else "")
    text = text.replace("\nbody:\n", "\nbody:" + lines + "\n", 1) + extra
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_the_tag_is_128_bits_of_hmac_sha256_over_principal_and_id() -> None:
    mac = hmac.new(SECRET, b"response:alice\n" + RID.encode(), hashlib.sha256).digest()[:16]
    want = base64.urlsafe_b64encode(mac).decode().rstrip("=")
    assert owner.tag(SECRET, "alice", RID) == want and len(want) == owner.TAG_CHARS
    assert owner.seal(SECRET, "alice", RID) == f"{RID}~{want}"


def test_unseal_admits_only_the_principals_own_seal() -> None:
    sealed = owner.seal(SECRET, "alice", RID)
    assert owner.unseal(SECRET, "alice", sealed) == RID
    assert owner.unseal(SECRET, "bob", sealed) is None                       # another principal
    assert owner.unseal(b"t" * 40, "alice", sealed) is None                  # another secret
    assert owner.unseal(SECRET, "alice", RID) is None                        # the raw id
    forged = sealed[:-1] + ("A" if sealed[-1] != "A" else "B")
    assert owner.unseal(SECRET, "alice", forged) is None                     # a forged tag
    assert owner.unseal(SECRET, "alice", sealed + "A") is None               # too long
    assert owner.unseal(SECRET, "alice", "x~" + sealed) is None              # two separators
    assert owner.unseal(SECRET, "alice", 7) is None and owner.unseal(SECRET, "alice", None) is None
    # the principal and the id are not one string: "al" + "ice..." is not "ali" + "ce..."
    assert owner.tag(SECRET, "al", "iceresp_1") != owner.tag(SECRET, "ali", "ceresp_1")


def test_answers_are_sealed_where_vllm_writes_ids_and_nowhere_else() -> None:
    doc = {"id": RID, "object": "response", "previous_response_id": "resp_00000000000000aa",
           "output": [{"id": "msg_1", "content": [{"text": f'"{RID}" said'}]}]}
    text = json.dumps(doc, separators=(",", ":"))
    out = json.loads(owner.seal_answer(text, SECRET, "alice"))
    assert out["id"] == owner.seal(SECRET, "alice", RID)
    assert out["previous_response_id"] == owner.seal(SECRET, "alice", "resp_00000000000000aa")
    assert out["output"] == doc["output"]                # text quoting the id: untouched
    event = json.dumps({"type": "response.created", "response": {"id": RID, "object": "response"}})
    line = owner.seal_line("data: " + event + "\r", SECRET, "alice")
    assert line.startswith("data: ") and line.endswith("\r")
    assert json.loads(line[6:-1])["response"]["id"] == owner.seal(SECRET, "alice", RID)
    assert owner.seal_line("event: response.created", SECRET, "alice") == "event: response.created"
    assert owner.seal_answer("not json", SECRET, "alice") == "not json"
    # an object that is not a response keeps its id (a chat completion's, an error's)
    chat = json.dumps({"id": "chatcmpl-1", "object": "chat.completion"})
    assert owner.seal_answer(chat, SECRET, "alice") == chat


def test_the_separator_is_one_the_route_regex_admits_and_vllm_ids_lack() -> None:
    import re

    from scanner import patterns
    sealed = owner.seal(SECRET, "alice", RID)
    assert re.fullmatch(patterns.PARAM_REGEX, sealed)
    assert owner.SEPARATOR not in RID and owner.SEPARATOR not in "ABCxyz019-_"


def test_the_plan_owns_what_the_inventory_names(tmp_path: Path) -> None:
    for catalog in ("vllm-0.29.0-everything", "vllm-0.33.0-everything"):
        plan = make_plan(catalog, str(owned_policy(tmp_path)))
        owned = {(d.method, d.path): (d.owner_param, d.owner_fields) for d in plan.allowed if d.owned}
        assert owned[("POST", "/v1/responses")] == ("", ("previous_response_id",))
        assert owned[("GET", "/v1/responses/{response_id}")] == ("response_id", ())
        assert owned[("POST", "/v1/responses/{response_id}/cancel")] == ("response_id", ())
        assert all("/responses" in p for _m, p in owned)
        assert json.loads(plan.to_json())["body"]["responses"] == "owned"
    shared = make_plan("vllm-0.29.0-everything", None)
    assert not any(d.owned for d in shared.decisions)
    assert "owner" not in json.dumps(json.loads(shared.to_json())["decisions"])


def test_shared_responses_on_end_users_routes_are_reported(tmp_path: Path) -> None:
    shared = make_plan("vllm-0.29.0-default", None)
    assert shared.responses_shared == ("GET /v1/responses/{response_id}", "POST /v1/responses",
                                       "POST /v1/responses/{response_id}/cancel")
    assert json.loads(shared.to_json())["responses_shared"] == list(shared.responses_shared)
    from scanner.report.plan import render
    assert "stored responses shared among end users' principals" in render(shared, "table")
    owned = make_plan("vllm-0.29.0-default", str(owned_policy(tmp_path)))
    assert owned.responses_shared == () and "responses_shared" not in json.loads(owned.to_json())


def test_owned_needs_its_secret_file_and_keys_and_no_client_chosen_id(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="responses_secret_file"):
        make_plan("vllm-0.29.0-everything", str(owned_policy(tmp_path, secret=False)))
    none_auth = owned_policy(tmp_path).read_text().replace(
        '{path: "/v1/responses/{response_id}", methods: [GET], audience: inference}',
        '{path: "/v1/responses/{response_id}", methods: [GET], audience: monitoring}')
    (tmp_path / "n.yaml").write_text(none_auth)
    with pytest.raises(PlanError, match="auth: none"):
        make_plan("vllm-0.29.0-everything", str(tmp_path / "n.yaml"))
    chosen = owned_policy(tmp_path).read_text().replace("        - request_id ", "        # - request_id ")
    chosen = chosen.replace("allow: [add_generation_prompt,", "allow: [request_id, add_generation_prompt,")
    (tmp_path / "c.yaml").write_text(chosen)
    with pytest.raises(PlanError, match="request_id"):
        make_plan("vllm-0.29.0-everything", str(tmp_path / "c.yaml"))


def test_the_body_judge_unseals_previous_response_id_for_its_owner_only(tmp_path: Path) -> None:
    plan = make_plan("vllm-0.29.0-everything", str(owned_policy(tmp_path)))
    d = plan.decision("POST", "/v1/responses")
    assert d is not None and body.inspects(d)
    sealed = owner.seal(SECRET, "alice", RID)
    raw = json.dumps({"model": "m", "input": "hi", "max_output_tokens": 5,
                      "previous_response_id": sealed}).encode()
    ok = body.judge(d, raw, owner_key=(SECRET, "alice"))
    assert not ok.refused and ok.body is not None and ok.body["previous_response_id"] == RID
    for key in ((SECRET, "bob"), None):
        no = body.judge(d, raw, owner_key=key)
        assert no.reason == "not-owner:previous_response_id"
        assert reasons.proves("not-owner:previous_response_id", 403, no.reason)
    raw_id = raw.replace(sealed.encode(), RID.encode())
    assert body.judge(d, raw_id, owner_key=(SECRET, "alice")).reason == "not-owner:previous_response_id"
    absent = json.dumps({"model": "m", "input": "hi", "max_output_tokens": 5,
                         "previous_response_id": None}).encode()
    assert not body.judge(d, absent, owner_key=None).refused
