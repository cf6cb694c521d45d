"""The generated Envoy in front of an echo upstream (starlette under uvicorn on loopback).

The echo app answers every path with what it received (method, path, headers, body) and
forges ``X-Perimeter-Decision``/``X-Perimeter-Reason`` on its replies, so the tests see
exactly what reaches the upstream and that upstream replies are never marked.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scanner.net import free_port
from scanner.policy import keys
from tests.generate.test_envoy_harness import (
    EchoServer,
    Reply,
    RunningEnvoy,
    envoy_binary,
    inventory_of,
    make_plan,
    make_principals,
    raw,
)

pytestmark = pytest.mark.envoy

INVENTORY = inventory_of(
    ("/v1/chat/completions", ("POST",)),
    ("/v1/completions", ("POST",)),
    ("/v1/responses/{response_id}", ("GET",)),
    ("/v1/audio/transcriptions", ("POST",)),
    ("/v1/models", ("GET", "HEAD")),
    ("/slow", ("POST",)),
    ("/health", ("GET",)),
    ("/metrics", ("GET",)),
    ("/pause", ("POST",)),
    ("/invocations", ("POST",)),
    ("/docs", ("GET", "HEAD")),
)

POLICY = """
schema_version: 1
name: echo-test
networks:
  users: [127.0.0.1/32, 127.0.0.2/32]
  admin: [127.0.0.3/32]
principals_file: principals.yaml
listen: {{address: 127.0.0.1, port: {port}}}
upstream: {{host: 127.0.0.1, port: {upstream}}}
{extra}
audiences:
  inference:
    kind: end-user
    networks: [users]
    roles: [user]
    limits: {{body_bytes: 4096, json_caps: {{max_tokens: 100, n: 2, logprobs: 0}},
              rate: {{rps: 500, burst: 1000}}, timeout_s: 30, when_absent: {when_absent}}}
  slow:
    kind: end-user
    networks: [users]
    roles: [user]
    limits: {{concurrency: 2, timeout_s: 30}}
  limited:
    kind: end-user
    networks: [users]
    roles: [user]
    limits: {{rate: {{rps: 0.2, burst: 3}}}}
  monitoring:
    kind: monitoring
    networks: [users, admin]
    auth: none
  scrapers:
    kind: monitoring
    networks: [users]
    auth: none
    limits: {{rate: {{rps: 0.2, burst: 2}}}}
  operator:
    kind: operator
    networks: [admin]
    roles: [operator]
  none: {{kind: none}}
body: {{cache_salt: {body}, chat_template: {body}}}
routes:
  - {{path: /v1/chat/completions, methods: [POST], audience: inference}}
  - {{path: /v1/completions, methods: [POST], audience: inference, limits: {{body_bytes: 3000000}}}}
  - {{path: "/v1/responses/{{response_id}}", methods: [GET], audience: inference}}
  - {{path: /v1/audio/transcriptions, methods: [POST], audience: inference}}
  - {{path: /slow, methods: [POST], audience: slow}}
  - {{path: /v1/models, methods: [GET], audience: limited}}
  - {{path: /health, methods: [GET], audience: monitoring}}
  - {{path: /metrics, methods: [GET], audience: scrapers}}
  - {{path: /pause, methods: [POST], audience: operator}}
  - {{path: /invocations, audience: none}}
"""

# Keys around the SHA-256 padding boundaries (55/56/64 bytes) and longer than one block.
ODD_KEYS = {f"len{n}": ("k" * n)[:n] for n in (1, 55, 56, 63, 64, 65, 119, 120, 300)}


@dataclass
class Setup:
    envoy: RunningEnvoy
    echo: EchoServer
    keys: dict[str, str]

    @property
    def port(self) -> int:
        return self.envoy.port

    def auth(self, who: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}", "Content-Type": "application/json"}

    def post(self, path: str, body: bytes, who: str = "alice", source: str = "127.0.0.1",
             **kw: object) -> Reply:
        return raw(self.port, "POST", path, headers=self.auth(who), body=body, source=source,
                   **kw)  # type: ignore[arg-type]


def _start(directory: Path, body_policy: str = "reject", extra: str = "",
           when_absent: str = "pass") -> Iterator[Setup]:
    envoy_binary()
    directory.mkdir(parents=True, exist_ok=True)
    _, ks = make_principals(directory, ("alice", "user"), ("bob", "user"), ("carol", "user"),
                            ("dave", "user"), ("ops", "operator"))
    for name, key in ODD_KEYS.items():
        keys.append_principal(directory / "principals.yaml", name, "user", key)
        ks[name] = key
    with EchoServer() as echo:
        policy = POLICY.format(port=free_port(), upstream=echo.port, body=body_policy, extra=extra,
                               when_absent=when_absent)
        envoy = RunningEnvoy(make_plan(INVENTORY, policy, directory), directory / "envoy")
        with envoy:
            yield Setup(envoy, echo, ks)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield from _start(tmp_path_factory.mktemp("envoy-echo"))


def seen(reply: Reply) -> dict[str, object]:
    """What the echo upstream received (and check the reply came from it, unmarked)."""
    assert reply.status == 200, (reply.status, reply.headers, reply.body[:300])
    assert "x-perimeter-decision" not in reply.headers and "x-perimeter-reason" not in reply.headers
    got: dict[str, object] = reply.json()
    return got


def headers_of(got: dict[str, object]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in got["headers"]:  # type: ignore[attr-defined]
        out.setdefault(k, []).append(v)
    return out


def assert_denied(reply: Reply, status: int, reason: str | None = None) -> None:
    assert reply.status == status, (reply.status, reply.headers, reply.body[:300])
    assert reply.denied, reply.headers
    if reason is not None:
        assert reply.headers.get("x-perimeter-reason") == reason, reply.headers


# --- reaching the upstream, and what it sees ------------------------------------------------


def test_allowed_request_reaches_upstream_with_principal_only(setup: Setup) -> None:
    spoof = {"X-Perimeter-Principal": "root", "X-Forwarded-For": "6.6.6.6", "X-Real-IP": "6.6.6.6",
             "Forwarded": "for=6.6.6.6", "X-Original-URL": "/invocations", "X-Rewrite-URL": "/x",
             "X-HTTP-Method-Override": "DELETE", "X-Forwarded-Host": "evil", "X-Forwarded-Prefix": "/x",
             "X-Perimeter-Upstream": "vllm", "x_perimeter_principal": "root"}
    reply = raw(setup.port, "POST", "/v1/chat/completions?stream=false",
                headers={**setup.auth(), **spoof}, body=b'{"max_tokens": 10}')
    got = seen(reply)
    assert got["path"] == "/v1/chat/completions" and got["query"] == "stream=false"
    h = headers_of(got)
    assert h["x-perimeter-principal"] == ["alice"]
    assert "authorization" not in h
    for name in ("x-real-ip", "forwarded", "x-original-url", "x-rewrite-url", "x-http-method-override",
                 "x-forwarded-host", "x-forwarded-prefix", "x-perimeter-upstream",
                 "x_perimeter_principal"):
        assert name not in h, name
    assert h["x-forwarded-for"] == ["127.0.0.1"] and h["x-forwarded-proto"] == ["http"]
    assert got["body"] == '{"max_tokens": 10}'


def test_auth_none_route_forwards_no_principal_and_no_authorization(setup: Setup) -> None:
    reply = raw(setup.port, "GET", "/health",
                headers={"X-Perimeter-Principal": "root", "Authorization": "Bearer x"})
    h = headers_of(seen(reply))
    assert "x-perimeter-principal" not in h and "authorization" not in h


@pytest.mark.parametrize("name", sorted(ODD_KEYS))
def test_keys_of_every_length_hash_right(setup: Setup, name: str) -> None:
    reply = setup.post("/v1/chat/completions", b"{}", who=name)
    assert headers_of(seen(reply))["x-perimeter-principal"] == [name]


def test_template_route(setup: Setup) -> None:
    reply = raw(setup.port, "GET", "/v1/responses/resp_123-abc.d", headers=setup.auth())
    assert seen(reply)["path"] == "/v1/responses/resp_123-abc.d"
    for target in ("/v1/responses/", "/v1/responses/a/b", "/v1/responses/..", "/v1/responses/%2e%2e",
                   "/v1/responses/a%20b"):
        r = raw(setup.port, "GET", target, headers=setup.auth())
        assert r.denied and r.status in (400, 404), (target, r.status)


# --- keys and roles -----------------------------------------------------------------------------


@pytest.mark.parametrize("auth", [None, "", "Bearer", "Bearer ", "Bearer vp_not-a-key", "Basic YTpi",
                                  "bearer-x", "Token {alice}", "Bearer {alice}x", "Bearer  {alice} x"])
def test_missing_or_bad_key_is_401(setup: Setup, auth: str | None) -> None:
    headers = {} if auth is None else {"Authorization": auth.format(alice=setup.keys["alice"])}
    reply = raw(setup.port, "POST", "/v1/chat/completions", headers=headers, body=b"{}")
    assert_denied(reply, 401)
    assert reply.headers["x-perimeter-reason"] in ("missing-key", "unknown-key")
    assert reply.headers["www-authenticate"].startswith("Bearer")
    assert reply.json()["error"]["type"] == "vllm_perimeter"


def test_lowercase_scheme_is_accepted(setup: Setup) -> None:
    reply = raw(setup.port, "POST", "/v1/chat/completions",
                headers={"Authorization": "bearer " + setup.keys["bob"]}, body=b"{}")
    assert headers_of(seen(reply))["x-perimeter-principal"] == ["bob"]


def test_two_authorization_headers_are_refused(setup: Setup) -> None:
    data = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Authorization: Bearer {setup.keys['alice']}\r\nAuthorization: Bearer {setup.keys['bob']}\r\n"
            f"Content-Length: 2\r\n\r\n{{}}").encode()
    import socket

    with socket.create_connection(("127.0.0.1", setup.port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    assert out.startswith(b"HTTP/1.1 401")


def test_wrong_role_is_403(setup: Setup) -> None:
    reply = setup.post("/pause", b"", who="alice", source="127.0.0.3")
    assert_denied(reply, 403, "role")
    seen(setup.post("/pause", b"", who="ops", source="127.0.0.3"))


# --- networks -------------------------------------------------------------------------------------


def test_source_outside_the_audience_networks_is_403(setup: Setup) -> None:
    assert_denied(setup.post("/v1/chat/completions", b"{}", source="127.0.0.66"), 403, "network")
    assert_denied(setup.post("/pause", b"", who="ops", source="127.0.0.1"), 403, "network")
    assert_denied(raw(setup.port, "GET", "/health", source="127.0.0.66"), 403, "network")
    seen(setup.post("/v1/chat/completions", b"{}", source="127.0.0.2"))


# --- JSON caps ---------------------------------------------------------------------------------------

OVER_CAP = [
    b'{"max_tokens": 101}', b'{"max_tokens": "101"}', b'{"max_tokens": "5000"}', b'{"max_tokens": 1e9}',
    b'{"max_tokens": 1E3}', b'{"max_tokens": 100.5}', b'{"max_tokens": " 101 "}', b'{"max_tokens": "1_000"}',
    b'{"max_tokens": "0x65"}', b'{"max_tokens": "1e9"}', b'{"max_tokens": [1]}', b'{"max_tokens": {}}',
    b'{"max_tokens": "\\u0031\\u0030\\u0031"}', b'{"max\\u005ftokens": 500}', b'{"\\u006dax_tokens": 500}',
    b'{"max_tokens": 1, "max_tokens": 500}',
    b'{"max_tokens": "abc"}', b'{"max_tokens": 1e999}', b'{"n": 3}', b'{"n": "3"}', b'{"logprobs": true}',
    b'{"logprobs": 1}', b'{"max_tokens": "\xef\xbc\x95"}', b'{"max_tokens": 12345678901234567890}',
    b'  {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4096}  ',
]
WITHIN_CAP = [
    b'{"max_tokens": 100}', b'{"max_tokens": "100"}', b'{"max_tokens": 1e2}', b'{"max_tokens": 100.0}',
    b'{"max_tokens": null}', b'{"max_tokens": -1}', b'{"n": true}', b'{"n": false}', b'{"logprobs": false}',
    b'{"logprobs": 0}', b'{"x": {"max_tokens": 500}}', b'{"messages": "\\"max_tokens\\": 500"}',
    b'{"max_tokens_x": 500}', b'{}', b'\r\n {"max_tokens" :\t2 } \n',
    b'{"max_tokens": 500, "max_tokens": 1}',   # Python (and vLLM) keep the last copy
    '{"content": "h\u00e9llo \\ud83d\\ude00 \\"q\\" \\\\", "max_tokens": 3}'.encode(),
]


@pytest.mark.parametrize("body", OVER_CAP, ids=lambda b: b.decode("utf-8", "replace")[:40])
def test_over_cap_is_400(setup: Setup, body: bytes) -> None:
    reply = setup.post("/v1/chat/completions", body)
    assert_denied(reply, 400)
    assert reply.headers["x-perimeter-reason"].startswith("json-cap:")


@pytest.mark.parametrize("body", WITHIN_CAP, ids=lambda b: b.decode("utf-8", "replace")[:40])
def test_within_cap_passes_unchanged(setup: Setup, body: bytes) -> None:
    got = seen(setup.post("/v1/chat/completions", body))
    assert got["body"] == body.decode("utf-8")


INVALID = [b"{", b'{"a":1,}', b'{"a" 1}', b"{'a': 1}", b'{"a":1} x',
           b'{"a":01}', b'{"a": tru}', b'{"a": [1,]}', b'{"a": NaN}', b'{"a": Infinity}', b'{"a": .5}',
           b'{"a": 1.}', b'{"a": -}', b'{"a\x01": 1}', b'{"a\\x": 1}', b'{"a\\u12": 1}', b'{"a": "x}',
           b'\xef\xbb\xbf{"a": 1}', b'{"a": [' * 15 + b']' * 15 + b'}']
# valid JSON that is no object; nested deeper than the plan's 31 levels (scanner/rules.py BODY_DEPTH)
NOT_OBJECTS = [b"[]", b"[1]", b'"x"', b"1", b" [[1], {}] "]
DEEP = [b'{"a": [' * 200 + b']' * 200 + b'}', b'{"a": [' * 16 + b']' * 16 + b'}', b'{"a": [' * 200]


@pytest.mark.parametrize(("body", "reason"), [*((b, "bad-json") for b in INVALID),
                                              *((b, "bad-json:not-an-object") for b in NOT_OBJECTS),
                                              *((b, "bad-json:depth-over-31") for b in DEEP)],
                         ids=lambda b: b.decode("utf-8", "replace")[:30] if isinstance(b, bytes) else b)
def test_invalid_json_is_400(setup: Setup, body: bytes, reason: str) -> None:
    assert_denied(setup.post("/v1/chat/completions", body), 400, reason)


def test_empty_body_is_not_checked(setup: Setup) -> None:
    assert seen(setup.post("/v1/chat/completions", b""))["body"] == ""


@pytest.mark.parametrize("field", ["cache_salt", "chat_template", "chat_template_kwargs",
                                   "cache\\u005fsalt"])
def test_forbidden_fields_are_400(setup: Setup, field: str) -> None:
    reply = setup.post("/v1/chat/completions", f'{{"model": "m", "{field}": null}}'.encode())
    assert_denied(reply, 400)
    assert reply.headers["x-perimeter-reason"] == "forbidden-field:" + field.replace("\\u005f", "_")


def test_form_bodies_are_not_parsed_but_still_limited(setup: Setup) -> None:
    form = (b'--b\r\nContent-Disposition: form-data; name="max_tokens"\r\n\r\n99999\r\n--b--\r\n')
    headers = {**setup.auth(), "Content-Type": "multipart/form-data; boundary=b"}
    got = seen(raw(setup.port, "POST", "/v1/audio/transcriptions", headers=headers, body=form))
    assert got["body"] == form.decode()
    big = b"--b\r\n" + b"x" * 5000 + b"\r\n--b--\r\n"
    for chunked in (False, True):
        reply = raw(setup.port, "POST", "/v1/audio/transcriptions", headers=headers, body=big,
                    chunked=chunked)
        assert_denied(reply, 413, "body-too-large")


# --- body size ----------------------------------------------------------------------------------


def _json_of_size(n: int) -> bytes:
    head, tail = b'{"pad": "', b'"}'
    return head + b"a" * (n - len(head) - len(tail)) + tail


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_limit_is_413(setup: Setup, chunked: bool) -> None:
    assert_denied(setup.post("/v1/chat/completions", _json_of_size(4097), chunked=chunked),
                  413, "body-too-large")
    assert_denied(setup.post("/v1/chat/completions", _json_of_size(200_000), chunked=chunked),
                  413, "body-too-large")
    assert seen(setup.post("/v1/chat/completions", _json_of_size(4096), chunked=chunked))["body"]


@pytest.mark.parametrize("chunked", [False, True])
def test_checked_bodies_above_envoys_default_buffer(setup: Setup, chunked: bool) -> None:
    # 1.5 MB is over Envoy's 1 MiB default stream buffer: the route raises it for the JSON check
    body = b'{"max_tokens": 5, "prompt": "' + b"a" * 1_500_000 + b'"}'
    got = seen(setup.post("/v1/completions", body, chunked=chunked, timeout=30))
    assert len(got["body"]) == len(body)  # type: ignore[arg-type]
    over = b'{"max_tokens": 500, "prompt": "' + b"a" * 1_500_000 + b'"}'
    assert_denied(setup.post("/v1/completions", over, chunked=chunked, timeout=30), 400, "json-cap:max_tokens")
    too_big = b'{"prompt": "' + b"a" * 3_000_000 + b'"}'
    assert_denied(setup.post("/v1/completions", too_big, chunked=chunked, timeout=30), 413)


# --- routes, methods, paths ------------------------------------------------------------------------


def test_unknown_path_and_wrong_method(setup: Setup) -> None:
    assert_denied(raw(setup.port, "GET", "/nope"), 404, "not-allowlisted")
    reply = raw(setup.port, "GET", "/v1/chat/completions", headers=setup.auth())
    assert_denied(reply, 405, "method-not-allowed")
    assert reply.headers["allow"] == "POST"
    assert_denied(raw(setup.port, "HEAD", "/v1/models", headers=setup.auth("dave")), 405)
    assert_denied(raw(setup.port, "POST", "/docs"), 404, "not-allowlisted")


BYPASS = ["/invocations", "//invocations", "/v1/../invocations", "/INVOCATIONS", "/invocations/",
          "/invocations;x", "/%2finvocations", "/%2Finvocations", "/%2e%2e/invocations",
          "/v1/%2e%2e/invocations", "/./invocations", "/invocations%00", "/invocations%20",
          "/invocations?x=1", "/invocations#x", "/v1/chat/completions/../../invocations",
          "/%69nvocations", "/invocations/.", "\\invocations", "/invocations\\",
          "http://perimeter.test/invocations"]


@pytest.mark.parametrize("target", BYPASS)
def test_bypass_attempts_are_denied(setup: Setup, target: str) -> None:
    reply = setup.post(target, b"{}")
    assert reply.denied and reply.status in (400, 404), (target, reply.status, reply.headers)


@pytest.mark.parametrize("target", ["/v1//chat/completions", "/v1/./chat/completions",
                                    "/v1/x/../chat/completions", "/v1/chat/%63ompletions"])
def test_normalised_paths_reach_the_upstream_normalised(setup: Setup, target: str) -> None:
    got = seen(setup.post(target, b"{}"))
    assert got["path"] == got["raw_path"] == "/v1/chat/completions"


# --- rate and concurrency -----------------------------------------------------------------------------


def test_rate_per_principal(setup: Setup) -> None:
    statuses = [raw(setup.port, "GET", "/v1/models", headers=setup.auth("carol")).status
                for _ in range(5)]
    assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429], statuses
    reply = raw(setup.port, "GET", "/v1/models", headers=setup.auth("carol"))
    assert_denied(reply, 429, "rate")
    seen(raw(setup.port, "GET", "/v1/models", headers=setup.auth("dave")))  # another principal


def test_rate_per_client_address_without_keys(setup: Setup) -> None:
    statuses = [raw(setup.port, "GET", "/metrics", source="127.0.0.1").status for _ in range(3)]
    assert statuses == [200, 200, 429], statuses
    seen(raw(setup.port, "GET", "/metrics", source="127.0.0.2"))  # another address, another bucket


def test_concurrency_per_principal(setup: Setup) -> None:
    replies: list[Reply] = []
    lock = threading.Lock()

    def one(who: str) -> None:
        r = raw(setup.port, "POST", "/slow?test_sleep=1.5", headers=setup.auth(who), body=b"{}", timeout=20)
        with lock:
            replies.append(r)

    threads = [threading.Thread(target=one, args=("alice",)) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    started = time.monotonic()
    other = raw(setup.port, "POST", "/slow", headers=setup.auth("bob"), body=b"{}", timeout=20)
    assert other.status == 200 and time.monotonic() - started < 1.4  # bob is not queued behind alice
    for t in threads:
        t.join(timeout=30)
    statuses = sorted(r.status for r in replies)
    assert statuses.count(429) >= 2 and statuses.count(200) >= 2, statuses
    assert all(r.denied and r.headers["x-perimeter-reason"] == "concurrency"
               for r in replies if r.status == 429)


# --- the access log ------------------------------------------------------------------------------------


def test_access_log_lines(setup: Setup) -> None:
    raw(setup.port, "POST", "/v1/chat/completions", headers=setup.auth("dave"), body=b'{"n": 1}')
    raw(setup.port, "POST", "/v1/chat/completions", headers=setup.auth("dave"), body=b'{"n": 9}')
    raw(setup.port, "POST", "/invocations?log=1", body=b"{}")
    deadline = time.monotonic() + 15
    lines = setup.envoy.log_lines()
    while time.monotonic() < deadline and sum(
            1 for ln in lines if ln["principal"] == "dave" and ln["method"] == "POST") < 2:
        time.sleep(0.1)
        lines = setup.envoy.log_lines()
    dave = [ln for ln in lines if ln["principal"] == "dave" and ln["method"] == "POST"]
    ok = next(ln for ln in dave if ln["status"] == 200)
    assert ok["decision"] is None and ok["details"] == "via_upstream"
    assert ok["route"] == "allow:POST /v1/chat/completions"
    assert ok["rule"].startswith("rule at line") and ok["path"] == "/v1/chat/completions"
    assert isinstance(ok["latency_ms"], int) and ok["time"].endswith("Z")
    capped = next(ln for ln in dave if ln["status"] == 400)
    assert capped["decision"] == "deny" and capped["reason"] == "json-cap:n"
    inv = next(ln for ln in lines if ln["path"] == "/invocations" and ln["status"] == 404)
    assert inv["decision"] == "deny" and inv["reason"] == "not-allowlisted" and inv["status"] == 404
    assert inv["principal"] is None
    text = setup.envoy.access_log.read_text(encoding="utf-8")
    for key in setup.keys.values():
        if len(key) > 8:
            assert key not in text
    envoy_log = (setup.envoy.directory / "envoy.log").read_text(encoding="utf-8", errors="replace")
    assert setup.keys["alice"] not in envoy_log


# --- other policies -------------------------------------------------------------------------------------


# The output budget of this policy's chat route (it reads max_completion_tokens, then
# max_tokens; the cap is max_tokens's, written into max_completion_tokens) by Lua's JSON rebuild.
BUDGET_WRITTEN = [
    (b'{}', {"max_completion_tokens": 100}),
    (b'{"max_tokens": null}', {"max_completion_tokens": 100}),
    (b'{"max_tokens": null, "max_completion_tokens": null}', {"max_completion_tokens": 100}),
    (b'{"max_tokens": 5, "max_tokens": null}', {"max_completion_tokens": 100}),   # Python keeps the last
    (b' {"a" : [1, {"max_tokens": 9}] ,"b":"x\\"y"} ',
     {"a": [1, {"max_tokens": 9}], "b": 'x"y', "max_completion_tokens": 100}),
    (b'{"cache_salt": "x", "n": 2}', {"n": 2, "max_completion_tokens": 100}),   # stripped, written in
]
BUDGET_KEPT = [b'{"max_tokens": 7}', b'{"max_completion_tokens": 7}', b'{"max_tokens": null, "max_tokens": 3}',
               b'{"max_completion_tokens": 8, "max_tokens": null}']


def test_the_output_budget_is_written_in_when_absent(tmp_path: Path) -> None:
    for s in _start(tmp_path, body_policy="strip", when_absent="inject"):
        for body, want in BUDGET_WRITTEN:
            got = seen(s.post("/v1/chat/completions", body))
            assert json.loads(got["body"]) == want, body  # type: ignore[arg-type]
            assert headers_of(got)["content-length"] == [str(len(got["body"]))]  # type: ignore[arg-type]
        for body in BUDGET_KEPT:
            assert seen(s.post("/v1/chat/completions", body))["body"] == body.decode(), body
        # a body exactly at body_bytes still fits once the budget is written in
        got = seen(s.post("/v1/chat/completions", _json_of_size(4096)))
        assert json.loads(got["body"])["max_completion_tokens"] == 100  # type: ignore[arg-type]
        assert_denied(s.post("/v1/chat/completions", _json_of_size(4097)), 413, "body-too-large")


def test_a_body_without_its_budget_is_refused_with_reject(tmp_path: Path) -> None:
    for s in _start(tmp_path, when_absent="reject"):
        reply = s.post("/v1/chat/completions", b'{"max_tokens": null}')
        assert_denied(reply, 400, "json-cap:max_completion_tokens:absent")
        assert seen(s.post("/v1/chat/completions", b'{"max_tokens": 1}'))["body"] == '{"max_tokens": 1}'


def test_strip_removes_forbidden_fields(tmp_path: Path) -> None:
    for s in _start(tmp_path, body_policy="strip"):
        body = b'{"a": 1, "cache_salt": "x", "chat_template": "{{ 1 }}", "b": [1, {"c": 2}],' \
               b' "chat_template_kwargs": {"k": 1}, "cache_salt": null}'
        got = seen(s.post("/v1/chat/completions", body))
        assert json.loads(got["body"]) == {"a": 1, "b": [1, {"c": 2}]}  # type: ignore[arg-type]
        assert headers_of(got)["content-length"] == [str(len(got["body"]))]  # type: ignore[arg-type]
        only = seen(s.post("/v1/chat/completions", b'{"cache_salt": "x"}'))
        assert only["body"] == "{}"
        kept = b'{"a": 1, "max_tokens": 5}'
        assert seen(s.post("/v1/chat/completions", kept))["body"] == kept.decode()
        assert_denied(s.post("/v1/chat/completions", b'{"cache_salt": "x", "max_tokens": 500}'), 400)


def test_trusted_proxy_forwarded_for(tmp_path: Path) -> None:
    for s in _start(tmp_path, extra="trusted_proxies: [127.0.0.2/32]"):
        ops = {**s.auth("ops"), "X-Forwarded-For": "127.0.0.3"}
        got = seen(raw(s.port, "POST", "/pause", headers=ops, body=b"", source="127.0.0.2"))
        assert headers_of(got)["x-forwarded-for"] == ["127.0.0.3"]
        # the same header from an untrusted peer is not believed
        assert_denied(raw(s.port, "POST", "/pause", headers=ops, body=b"", source="127.0.0.1"), 403)


def test_missing_key_file_refuses_every_key(tmp_path: Path) -> None:
    _, ks = make_principals(tmp_path, ("alice", "user"), ("ops", "operator"))
    with EchoServer() as echo:
        policy = POLICY.format(port=free_port(), upstream=echo.port, body="reject", extra="",
                               when_absent="pass")
        envoy = RunningEnvoy(make_plan(INVENTORY, policy, tmp_path), tmp_path / "envoy",
                             extra={"config_dir": str(tmp_path / "nowhere")})
        with envoy:
            reply = raw(envoy.port, "POST", "/v1/chat/completions", body=b"{}",
                        headers={"Authorization": f"Bearer {ks['alice']}"})
            assert_denied(reply, 401, "unknown-key")
            seen(raw(envoy.port, "GET", "/health"))  # routes without keys still work
        log = (tmp_path / "envoy" / "envoy.log").read_text(encoding="utf-8", errors="replace")
        assert "could not be read" in log and ks["alice"] not in log
