"""Ownership of stored responses through the real proxies (NGINX 1.31 and 1.22 with njs, Envoy
1.40 with Lua) in front of the stand-in, which stores responses as vLLM does: every id handed out
is sealed to its principal with the MAC scanner/plan/owner.py defines (njs and Lua compute it, the
Python reference verifies it: the differential test), another principal's GET, cancel and
previous_response_id are refused (403 not-owner), so are a raw id and a forged seal, and the
witness shows vLLM received its own id only. One proxy per module and kind, started once."""

from __future__ import annotations

import json
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan import owner
from scanner.policy.load import loads
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named, unpaced

REPO = Path(__file__).resolve().parents[2]
BODY = {"model": "m", "input": "hi", "max_output_tokens": 3}
SEALED = re.compile(r"resp_[0-9a-f]{16}~[A-Za-z0-9_-]{22}")
DELAY = 0.05            # between a stream's steps at the stand-in


def owned_policy_text() -> str:
    text = (REPO / "policies" / "vllm-default.yaml").read_text()
    return text.replace("\nbody:\n", "\nbody:\n  responses: owned\n  responses_secret_file: /unused/x\n", 1)


@dataclass
class Front:
    """A running proxy with two principals of the end-user audience (A: role user, B: service)."""

    a: httpx.Client
    b: httpx.Client
    names: tuple[str, str]
    secret: bytes
    standin: str

    def seen(self, probe: str) -> dict[str, Any]:
        got = httpx.get(f"{self.standin}/__standin__/witness", params={"id": probe}, timeout=5).json()
        return got["records"][0] if "records" in got else got

    def create(self, client: httpx.Client, **extra: Any) -> str:
        r = client.post("/v1/responses", json={**BODY, **extra})
        assert r.status_code == 200, r.text
        return str(r.json()["id"])


@pytest.fixture(scope="module", params=["nginx", "nginx-debian", "envoy"])
def front(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    proxy = proxy_named(request.param)
    tmp = tmp_path_factory.mktemp(f"own-{request.param}")
    policy = loads(owned_policy_text(), source="p.yaml", base_dir=REPO / "policies")
    inventory = load_ref("vllm-0.29.0-everything")
    port = free_port()
    s = loop.setup(inventory, unpaced(policy), tmp, port)
    # a secret longer than HMAC-SHA256's 64-byte block: the key is hashed first (njs's crypto,
    # Lua's own HMAC and Python's must agree on that too)
    secret = secrets.token_urlsafe(75)
    assert s.plan.body.responses_secret_file and len(secret) > 64
    Path(s.plan.body.responses_secret_file).write_text(secret + "\n")
    s = replace(s, owner_secret=secret)
    creds = {c.label: c for c in s.credentials}
    names = tuple(p.name for p in s.plan.principals if p.role in ("user", "service"))
    directory = tmp / "proxy"
    proxy.write(s.plan, directory)
    source = s.networks["public"][0].split("/")[0]
    with StandinThread(inventory, "127.0.0.1", port, stream_delay=DELAY) as standin, ExitStack() as stack:
        loop.start_checked(proxy, s.plan, directory, stack)
        base = f"http://127.0.0.1:{s.plan.listen.port}"

        def client(label: str) -> httpx.Client:
            return stack.enter_context(httpx.Client(
                base_url=base, timeout=10, headers=creds[label].headers(),
                transport=httpx.HTTPTransport(local_address=source)))
        by_role = {p.role: p.name for p in s.plan.principals}
        yield Front(client("role:user"), client("role:service"), (by_role["user"], by_role["service"]),
                    s.owner_secret.encode(), standin.url)
    assert len(names) == 2


def test_ids_leave_sealed_to_their_principal(front: Front) -> None:
    sid = front.create(front.a)
    assert SEALED.fullmatch(sid)
    rid = owner.unseal(front.secret, front.names[0], sid)        # njs / Lua's MAC = Python's
    assert rid is not None and sid == owner.seal(front.secret, front.names[0], rid)
    assert owner.unseal(front.secret, front.names[1], sid) is None
    got = front.a.get(f"/v1/responses/{sid}")
    assert got.status_code == 200 and got.json()["id"] == sid
    cont = front.a.post("/v1/responses", json={**BODY, "previous_response_id": sid})
    assert cont.status_code == 200 and cont.json()["previous_response_id"] == sid
    assert SEALED.fullmatch(cont.json()["id"]) and cont.json()["id"] != sid


def test_a_stream_is_sealed_event_by_event(front: Front) -> None:
    arrived: list[float] = []
    with front.a.stream("POST", "/v1/responses", json={**BODY, "stream": True}) as r:
        assert r.status_code == 200
        parts = []
        for part in r.iter_text():
            arrived.append(time.monotonic())
            parts.append(part)
        text = "".join(parts)
    # the stream keeps its timing: its first events came well before its last (4 steps apart at
    # the stand-in; on a busy machine two may arrive in one read: at least one step apart here,
    # where a stream held until its end arrives at once)
    assert arrived[-1] - arrived[0] >= DELAY, arrived
    events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]
    ids = {e["response"]["id"] for e in events if "response" in e}
    assert len(ids) == 1 and SEALED.fullmatch(ids.pop() or "")
    assert "resp_" not in re.sub(SEALED, "", text)      # no raw id anywhere
    assert events[-1]["type"] == "response.completed"
    sid = events[-1]["response"]["id"]
    assert front.a.get(f"/v1/responses/{sid}").status_code == 200


def test_another_principal_is_refused_everywhere(front: Front) -> None:
    sid = front.create(front.a, background=True)
    rid = sid.split("~")[0]
    forged = rid + "~" + ("A" * 22)
    for who, value in ((front.b, sid), (front.b, rid), (front.b, forged), (front.a, rid), (front.a, forged),
                       (front.a, sid + "A"), (front.a, sid + "~" + sid.split("~")[1])):
        for r in (who.get(f"/v1/responses/{value}"), who.post(f"/v1/responses/{value}/cancel")):
            assert (r.status_code, r.headers.get("x-perimeter-reason")) == (403, "not-owner"), (value, r.text)
        r = who.post("/v1/responses", json={**BODY, "previous_response_id": value})
        assert (r.status_code, r.headers.get("x-perimeter-reason")) == (403, "not-owner:previous_response_id")
    r = front.a.post("/v1/responses", json={**BODY, "previous_response_id": 7})
    assert r.status_code == 403
    cancel = front.a.post(f"/v1/responses/{sid}/cancel")
    assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled" and cancel.json()["id"] == sid


def test_the_upstream_sees_vllms_own_id_only(front: Front) -> None:
    sid = front.create(front.a)
    rid = sid.split("~")[0]
    p1, p2 = uuid.uuid4().hex, uuid.uuid4().hex
    assert front.a.get(f"/v1/responses/{sid}", params={"vp_probe": p1}).status_code == 200
    assert front.a.post("/v1/responses", params={"vp_probe": p2},
                        json={**BODY, "previous_response_id": sid}).status_code == 200
    assert front.seen(p1)["path"] == f"/v1/responses/{rid}"
    body = front.seen(p2)["body"]
    assert json.loads(body)["previous_response_id"] == rid and "~" not in body


@pytest.mark.parametrize(("kind", "holder", "line"), [
    ("nginx", "perimeter-principals.conf", 'js_var $perimeter_owner_secret "{}";'),
    ("envoy", "envoy-principals.tsv", "owner\t{}")])
def test_the_secret_is_in_the_generated_principals_file_never_read_by_a_worker(
        tmp_path: Path, kind: str, holder: str, line: str) -> None:
    """NGINX's workers run as another user than its master (nobody under root): the secret reaches
    njs through the 0600 principals include the master reads at load, so a 0600 secret file of
    root's works (the live tests above run so); Envoy's Lua reads it from its principals file with
    the key hashes. A secret generate cannot read is one line, exit 2, nothing written."""
    from scanner.generate.interface import GenerateOptions, get
    from scanner.plan.build import build
    from tests.cli.test_plan_cli import run

    secret = secrets.token_urlsafe(40)
    (tmp_path / "responses.secret").write_text(secret + "\n")
    (tmp_path / "responses.secret").chmod(0o600)
    text = owned_policy_text().replace("/unused/x", str(tmp_path / "responses.secret"))
    plan = build(load_ref("vllm-0.29.0-default"), loads(text, source="p.yaml", base_dir=REPO / "policies"))
    options = GenerateOptions(output_dir=str(tmp_path / "out"))
    config = get(kind).render(plan, options)
    files = {f.name: f for f in config.files}
    assert [rf.holds for rf in config.runtime_files if rf.generated == holder] == \
        ["key hashes and the responses secret (responses: owned)"]
    holders = [name for name, f in files.items() if secret in f.content]
    assert holders == [holder] and files[holder].mode == 0o600
    assert line.format(secret) in files[holder].content.splitlines()
    assert kind != "nginx" or not re.search(r"^\s*user\s", files["nginx.conf"].content, re.M)
    (tmp_path / "policy.yaml").write_text(text.replace(str(tmp_path / "responses.secret"), str(tmp_path / "gone")))
    res = run("generate", kind, "--inventory", "vllm-0.29.0-default", "--policy", str(tmp_path / "policy.yaml"),
              "-o", str(tmp_path / "out"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "responses_secret_file" in errors[0] and "vllm-perimeter init" in errors[0]
    assert not (tmp_path / "out").exists()
