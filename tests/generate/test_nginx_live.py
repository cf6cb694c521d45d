"""Generated NGINX configs running in front of the real engine-less vLLM 0.29.0 (and a tiny
echo upstream for header and path assertions), on both NGINX builds."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scanner.inventory.model import load as load_inventory
from scanner.net import free_port, wait_for_port
from scanner.plan.model import DECISION_HEADER, PRINCIPAL_HEADER, REASON_HEADER
from tests.generate.nginx_harness import (
    BUILDS,
    GOLDEN,
    LOOPBACK_NETWORKS,
    Principal,
    RawResponse,
    RunningNginx,
    default_policy_text,
    get_build,
    listen_yaml,
    make_plan,
    make_principals,
    new_port,
    raw_request,
)

pytestmark = [pytest.mark.nginx]
INVENTORY = GOLDEN / "inventory-vllm-0.29.0-everything.json"
BODY_LIMIT = 65536
DECISION = DECISION_HEADER.lower()
REASON = REASON_HEADER.lower()


def live_policy_text(cache_salt: str = "reject") -> str:
    """The default policy, with room for a test run's request rate and a small body limit."""
    text = default_policy_text()
    text = text.replace("rate: {rps: 10, burst: 20}", "rate: {rps: 200, burst: 400}")
    text = text.replace("body_bytes: 1048576", f"body_bytes: {BODY_LIMIT}")
    return text.replace("cache_salt: reject", f"cache_salt: {cache_salt}")


PEOPLE = (("alice", "user"), ("bob", "user"), ("svc", "service"), ("ops", "operator"),
          ("ops2", "operator"))


def start_perimeter(build_name: str, directory: Path, upstream_host: str, upstream_port: int,
                    cache_salt: str = "reject", keepalive: bool = True, listen_tls: str = "",
                    upstream_tls: str = "", extra: str = "") -> tuple[RunningNginx, dict[str, Principal]]:
    build = get_build(build_name)
    directory.mkdir(parents=True, exist_ok=True)
    _, people = make_principals(directory, *PEOPLE)
    plan = make_plan(
        load_inventory(INVENTORY), live_policy_text(cache_salt), directory,
        extra_yaml="principals_file: principals.yaml\n"
        + listen_yaml(new_port(), upstream_host, upstream_port, listen_tls, upstream_tls) + extra,
        overrides=LOOPBACK_NETWORKS,
    )
    options = {} if keepalive else {"upstream_keepalive": "0"}
    return RunningNginx(build, plan, directory / "nginx", options_extra=options).start(), people


def bearer(p: Principal) -> dict[str, str]:
    return {"Authorization": f"Bearer {p.key}"}


def is_proxy_reply(r: RawResponse | httpx.Response) -> bool:
    """The proxy answered itself (its error replacing vLLM's 5xx body is vLLM's answer)."""
    headers = {k.lower(): v for k, v in r.headers.items()}
    return DECISION in headers and headers.get(REASON) != "upstream-error"


def assert_denied(r: RawResponse | httpx.Response, status: int | None = None, reason: str = "") -> None:
    assert is_proxy_reply(r), f"expected a proxy reply, got {r.status if isinstance(r, RawResponse) else r.status_code}"
    headers = {k.lower(): v for k, v in r.headers.items()}
    got = r.status if isinstance(r, RawResponse) else r.status_code
    if status is not None:
        assert got == status, f"status {got} != {status} ({headers.get(REASON)})"
    assert headers[DECISION] == "deny"
    if reason:
        assert headers.get(REASON, "").startswith(reason), headers.get(REASON)


def assert_reached(r: RawResponse | httpx.Response) -> None:
    got = r.status if isinstance(r, RawResponse) else r.status_code
    headers = {k.lower(): v for k, v in r.headers.items()}
    assert not is_proxy_reply(r), f"proxy answered {got} ({headers.get(REASON)}) instead of the upstream"


# --- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=sorted(BUILDS))
def vllm_perimeter(request: pytest.FixtureRequest, real_vllm: Any,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningNginx, dict[str, Principal]]]:
    directory = tmp_path_factory.mktemp(f"nginx-vllm-{request.param}")
    # The engine-less vLLM closes its connection after a handler error (it has no engine):
    # without upstream keep-alive, the next POST cannot land on that closed connection.
    nginx, people = start_perimeter(request.param, directory, real_vllm.host, real_vllm.port,
                                    keepalive=False)
    try:
        yield nginx, people
    finally:
        nginx.stop()


class EchoServer:
    """A tiny upstream that answers with what it received (and a spoofed marker header)."""

    def __init__(self) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def echo(request: Request) -> JSONResponse:
            body = await request.body()
            return JSONResponse(
                {"method": request.method, "path": request.scope["path"],
                 "raw_path": request.scope["raw_path"].decode("latin-1"),
                 "query": request.scope["query_string"].decode("latin-1"),
                 "headers": [[k.decode("latin-1"), v.decode("latin-1")]
                             for k, v in request.scope["headers"]],
                 "body": body.decode("utf-8", errors="replace")},
                headers={DECISION_HEADER: "deny", REASON_HEADER: "spoofed-by-upstream"})

        app = Starlette(routes=[Route("/{path:path}", echo, methods=[
            "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])])
        self.port = free_port("127.0.0.1")
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> EchoServer:
        self.thread.start()
        if not wait_for_port("127.0.0.1", self.port, 15):
            raise RuntimeError("echo upstream did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def echo_upstream() -> Iterator[EchoServer]:
    with EchoServer() as server:
        yield server


@pytest.fixture(scope="module", params=sorted(BUILDS))
def echo_perimeter(request: pytest.FixtureRequest, echo_upstream: EchoServer,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningNginx, dict[str, Principal]]]:
    directory = tmp_path_factory.mktemp(f"nginx-echo-{request.param}")
    nginx, people = start_perimeter(request.param, directory, "127.0.0.1", echo_upstream.port,
                                    cache_salt="strip", extra="trusted_proxies: [127.0.0.2/32]\n")
    try:
        yield nginx, people
    finally:
        nginx.stop()


def echoed(r: RawResponse) -> dict[str, Any]:
    assert r.status == 200, (r.status, r.headers, r.body[:300])
    assert not is_proxy_reply(r), "the upstream's spoofed marker must be hidden"
    data: dict[str, Any] = json.loads(r.body)
    return data


def headers_of(data: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in data["headers"]:
        out.setdefault(k.lower(), []).append(v)
    return out


# --- vLLM behind the perimeter ---------------------------------------------------------------

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})


@pytest.mark.vllm
def test_allowed_routes_reach_vllm(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = vllm_perimeter
    alice = people["alice"]
    r = raw_request(nginx.port, "/v1/models", headers=bearer(alice))
    assert_reached(r)
    r = raw_request(nginx.port, "/v1/chat/completions", "POST", body=CHAT.encode(),
                    headers={**bearer(alice), "Content-Type": "application/json"})
    assert_reached(r)
    r = raw_request(nginx.port, "/v1/responses/resp_abc", headers=bearer(alice))
    assert_reached(r)
    # monitoring: no key needed, from the monitoring network only
    assert_reached(raw_request(nginx.port, "/health"))
    assert_denied(raw_request(nginx.port, "/health", source="127.0.0.2"), 403, "network")
    # operator from the admin network with the operator role
    assert_reached(raw_request(nginx.port, "/is_paused", headers=bearer(people["ops"]), source="127.0.0.3"))


@pytest.mark.vllm
def test_keys_and_roles(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = vllm_perimeter
    port = nginx.port
    assert_denied(raw_request(port, "/v1/models"), 401, "missing-key")
    assert_denied(raw_request(port, "/v1/models", headers={"Authorization": "Bearer vp_nope"}), 401,
                  "unknown-key")
    assert_denied(raw_request(port, "/v1/models", headers={"Authorization": people["alice"].key}), 401)
    assert_denied(raw_request(port, "/v1/models", headers={"Authorization": "Basic YTpi"}), 401)
    # a user key on an operator route, from the admin network: wrong role
    assert_denied(raw_request(port, "/pause", "POST", headers=bearer(people["alice"]), source="127.0.0.3"),
                  403, "role")
    # a service-only route with a user key
    assert_denied(raw_request(port, "/tokenize", "POST", body=b"{}", headers=bearer(people["alice"])),
                  403, "role")
    # the operator's key from an end-user address: wrong network
    assert_denied(raw_request(port, "/pause", "POST", headers=bearer(people["ops"])), 403, "network")


@pytest.mark.vllm
@pytest.mark.parametrize("method,target", [
    ("POST", "/invocations"), ("POST", "/pause"), ("POST", "/collective_rpc"), ("POST", "/adapters"),
    ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/tokenizer_info"), ("POST", "/sleep"),
    ("GET", "/metrics/"), ("POST", "/v1/load_lora_adapter"), ("HEAD", "/v1/models"),
    ("DELETE", "/v1/models"), ("POST", "/ping"),
])
def test_denied_routes(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]],
                       method: str, target: str) -> None:
    nginx, people = vllm_perimeter
    r = raw_request(nginx.port, target, method, headers=bearer(people["alice"]), body=b"{}"
                    if method == "POST" else b"")
    assert_denied(r)
    assert r.status in (403, 404, 405, 413)  # 413: POST /ping has a 1-byte body limit (GET only)


BYPASS = [
    "/%2e%2e/invocations", "/v1/%2e%2e/invocations", "//invocations", "/v1/../invocations",
    "/INVOCATIONS", "/invocations/", "/invocations;x", "/%2finvocations", "/./invocations",
    "/v1/models/../../invocations", "/invocations%20", "/invocation%73", "/Invocations",
    "/v1/responses/..%2f..%2finvocations", "/v1/responses/a%2f..%2f..%2finvocations",
    "/v1/chat/completions/../../../invocations", "/collective_rpc%3f", "/docs#", "/v1/responses/%2e%2e",
]


@pytest.mark.vllm
@pytest.mark.parametrize("target", BYPASS)
def test_bypass_attempts_denied(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]],
                                target: str) -> None:
    nginx, people = vllm_perimeter
    r = raw_request(nginx.port, target, "POST", headers={**bearer(people["alice"]),
                    "Content-Type": "application/json"}, body=CHAT.encode())
    assert_denied(r)


@pytest.mark.vllm
def test_lowercase_method_and_wrong_source(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = vllm_perimeter
    r = raw_request(nginx.port, "/v1/models", "get", headers=bearer(people["alice"]))
    assert r.status in (400, 405) and is_proxy_reply(r)
    r = raw_request(nginx.port, "/v1/models", "TRACE", headers=bearer(people["alice"]))
    assert r.status in (400, 405) and is_proxy_reply(r)
    r = raw_request(nginx.port, "/v1/models", headers=bearer(people["alice"]), source="127.0.0.66")
    assert_denied(r, 403, "network")
    transport = httpx.HTTPTransport(local_address="127.0.0.66")
    with httpx.Client(transport=transport, timeout=10) as client:
        resp = client.get(nginx.url + "/v1/models", headers=bearer(people["alice"]))
    assert_denied(resp, 403, "network")


@pytest.mark.vllm
def test_body_size_limits(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = vllm_perimeter
    big = json.dumps({"model": "m", "prompt": "x" * (BODY_LIMIT + 100), "max_tokens": 5}).encode()
    hdrs = {**bearer(people["alice"]), "Content-Type": "application/json"}
    assert_denied(raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=big), 413)
    assert_denied(raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=big,
                              chunked=True), 413)
    ok = json.dumps({"model": "m", "prompt": "x" * (BODY_LIMIT - 200), "max_tokens": 5}).encode()
    assert_reached(raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=ok, chunked=True))


OVER_CAP = [
    '{"model":"m","prompt":"x","max_tokens":5000}',
    '{"model":"m","prompt":"x","max_tokens":"5000"}',
    '{"model":"m","prompt":"x","max_tokens":" 5000 "}',
    '{"model":"m","prompt":"x","max_tokens":"5_000"}',
    '{"model":"m","prompt":"x","max_tokens":5000.0}',
    '{"model":"m","prompt":"x","max_tokens":1e9}',
    '{"model":"m","prompt":"x","max_tokens":4096.5}',
    '{"model":"m","prompt":"x","m\\u0061x_tokens":5000}',
    '{"model":"m","prompt":"x","\\u006d\\u0061\\u0078\\u005F\\u0074\\u006f\\u006b\\u0065\\u006e\\u0073":9999}',
    '{"model":"m","prompt":"x","max_tokens":1,"max_tokens":5000}',
    '{"model":"m","prompt":"x","max_tokens":1,"m\\u0061x_tokens":5000}',
    '{"model":"m","prompt":"x","n":5}',
    '{"model":"m","prompt":"x","n":"5"}',
    '{"model":"m","prompt":"x","logprobs":21}',
    '{"model":"m","prompt":"x","max_tokens":[1]}',
    '{"model":"m","prompt":"x","max_tokens":{"v":1}}',
    '{"model":"m","prompt":"x","max_tokens":"lots"}',
    '{"model":"m","prompt":"x","max_tokens":99999999999999999999999}',
]


@pytest.mark.vllm
@pytest.mark.parametrize("body", OVER_CAP)
def test_json_caps(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]], body: str) -> None:
    nginx, people = vllm_perimeter
    hdrs = {**bearer(people["alice"]), "Content-Type": "application/json"}
    r = raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=body.encode())
    assert_denied(r, 400, "json-cap")


UNDER_CAP = [
    '{"model":"m","prompt":"x","max_tokens":4096}',
    '{"model":"m","prompt":"x","max_tokens":"4096"}',
    '{"model":"m","prompt":"x","max_tokens":4096.0}',
    '{"model":"m","prompt":"x","max_tokens":null,"n":true}',
    '{"model":"m","prompt":"x","max_tokens":9999,"max_tokens":10}',
    '{"model":"m","prompt":"x","messages":[{"max_tokens":99999}],"user":"\\"max_tokens\\": 99999"}',
]


@pytest.mark.vllm
@pytest.mark.parametrize("body", UNDER_CAP)
def test_json_within_caps_reaches_vllm(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]],
                                       body: str) -> None:
    nginx, people = vllm_perimeter
    hdrs = {**bearer(people["alice"]), "Content-Type": "application/json"}
    assert_reached(raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=body.encode()))


@pytest.mark.vllm
@pytest.mark.parametrize("body,reason", [
    ('{"model":"m","prompt":"x","cache_salt":"probe"}', "forbidden-field:cache_salt"),
    ('{"model":"m","messages":[],"chat_template":"{{ x }}"}', "forbidden-field:chat_template"),
    ('{"model":"m","messages":[],"chat_template_kwargs":{}}', "forbidden-field:chat_template_kwargs"),
    ('{"model":"m","prompt":"x","c\\u0061che_salt":"probe"}', "forbidden-field:cache_salt"),
    ('{"model":"m","prompt":"x","max_tokens":50', "bad-json"),
    ('{"model":"m","prompt":"x","max_tokens":5000', "bad-json"),
    ('[{"max_tokens":5000}]', "bad-json"),
    ('{"max_tokens":NaN}', "bad-json"),
])
def test_forbidden_fields_and_bad_json(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]],
                                       body: str, reason: str) -> None:
    nginx, people = vllm_perimeter
    hdrs = {**bearer(people["alice"]), "Content-Type": "application/json"}
    assert_denied(raw_request(nginx.port, "/v1/chat/completions", "POST", headers=hdrs, body=body.encode()),
                  400, reason)


@pytest.mark.vllm
def test_large_multibyte_bodies(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    """A body near the limit made of multi-byte characters runs NGINX's native UTF-8 regex
    ($perimeter_plain) over tens of thousands of them without failing it (a PCRE error would
    answer 500 or skip the check): valid, it reaches vLLM; one invalid byte at its end, 400
    bad-json; and more brackets than the plan's depth, the exact checks decide as before."""
    nginx, people = vllm_perimeter
    hdrs = {**bearer(people["alice"]), "Content-Type": "application/json"}
    text = "\u6f22\u00e9\U0001f600" * ((BODY_LIMIT - 400) // 9)     # 3, 2 and 4 bytes each
    ok = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]},
                    ensure_ascii=False).encode()
    assert len(ok) > BODY_LIMIT - 500
    assert_reached(raw_request(nginx.port, "/v1/chat/completions", "POST", headers=hdrs, body=ok))
    assert_denied(raw_request(nginx.port, "/v1/chat/completions", "POST", headers=hdrs,
                              body=ok[:-2] + b'\xff"}'), 400, "bad-json")
    many = json.dumps({"model": "m", "messages": [{"role": "user", "content": text[:40]}] * 40},
                      ensure_ascii=False).encode()
    assert_reached(raw_request(nginx.port, "/v1/chat/completions", "POST", headers=hdrs, body=many))
    assert_denied(raw_request(nginx.port, "/v1/chat/completions", "POST", headers=hdrs,
                              body=many[:-2] + b'\xed\xa0\x80"}'), 400, "bad-json")
    log = nginx.error_log.read_text(errors="replace") if nginx.error_log.exists() else ""
    assert "pcre" not in log.lower() and "regex" not in log.lower(), log[-2000:]


@pytest.mark.vllm
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_utf16_and_utf32_bodies_do_not_hide_keys(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]],
                                                 encoding: str) -> None:
    # Python's json.loads(bytes) (Starlette's request.json()) decodes these; a byte-level
    # scan would not see the key.
    nginx, people = vllm_perimeter
    body = '{"model":"m","prompt":"x","max_tokens":99999}'.encode(encoding)
    assert json.loads(body)["max_tokens"] == 99999
    hdrs = {**bearer(people["alice"]), "Content-Type": "application/json"}
    assert_denied(raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=body), 400)


@pytest.mark.vllm
def test_rate_limit_per_principal(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = vllm_perimeter
    # operator audience: 2 r/s, burst 5
    statuses = []
    for _ in range(15):
        r = raw_request(nginx.port, "/is_paused", headers=bearer(people["ops"]), source="127.0.0.3")
        statuses.append(r.status)
        if r.status == 429:
            assert_denied(r, 429, "rate")
    assert 429 in statuses, statuses
    assert_reached(raw_request(nginx.port, "/is_paused", headers=bearer(people["ops2"]), source="127.0.0.3"))
    time.sleep(1.0)


@pytest.mark.vllm
def test_access_log_is_json_without_keys(vllm_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = vllm_perimeter
    raw_request(nginx.port, "/v1/models", headers=bearer(people["bob"]))
    raw_request(nginx.port, "/invocations", "POST", headers=bearer(people["bob"]), body=b"{}")
    # a body the native fast path cannot clear goes to njs through an internal location: the
    # log still shows the path the client asked for
    raw_request(nginx.port, "/v1/chat/completions", "POST", body=b'{"model":"m","cache_salt":"s"}',
                headers={**bearer(people["bob"]), "Content-Type": "application/json"})
    deadline = time.monotonic() + 5
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in nginx.access_log.read_text().splitlines() if x.strip()]
        if any(x["principal"] == "bob" and x["reason"] == "forbidden-field:cache_salt" for x in lines):
            break
        time.sleep(0.1)
    text = nginx.access_log.read_text()
    for p in people.values():
        assert p.key not in text
    bob = [x for x in lines if x["principal"] == "bob"]
    assert bob[-2]["route"] == "/v1/models" and bob[-2]["decision"] == "allow"
    for key in ("time", "principal", "route", "method", "status", "latency_s", "decision", "reason"):
        assert key in bob[-2]
    assert bob[-1]["path"] == "/v1/chat/completions" and bob[-1]["status"] == 400, bob[-1]
    assert bob[-1]["reason"] == "forbidden-field:cache_salt" and bob[-1]["decision"] == "deny"
    denied = [x for x in lines if x["path"] == "/invocations"]
    assert denied and denied[-1]["decision"] == "deny" and denied[-1]["status"] == 404
    assert denied[-1]["reason"] == "not-allowlisted"


# --- the echo upstream: what exactly reaches the backend -----------------------------------------

def test_headers_forwarded_upstream(echo_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = echo_perimeter
    spoof = {
        **bearer(people["alice"]), PRINCIPAL_HEADER: "ops", "X-Forwarded-For": "10.30.0.1",
        "X-Real-IP": "10.30.0.1", "X-Original-URL": "/invocations", "X-HTTP-Method-Override": "DELETE",
        "Forwarded": "for=10.30.0.1", "X-Forwarded-Host": "evil", DECISION_HEADER: "allow",
    }
    data = echoed(raw_request(nginx.port, "/v1/models", headers=spoof))
    h = headers_of(data)
    assert "authorization" not in h
    assert h[PRINCIPAL_HEADER.lower()] == ["alice"]
    assert h["x-forwarded-for"] == ["127.0.0.1"] and h["x-real-ip"] == ["127.0.0.1"]
    for gone in ("x-original-url", "x-http-method-override", "forwarded", "x-forwarded-host",
                 DECISION.lower()):
        assert gone not in h, gone
    # auth "none" route: no principal header at all, even when the client sends one
    data = echoed(raw_request(nginx.port, "/health", headers={PRINCIPAL_HEADER: "ops"}))
    assert PRINCIPAL_HEADER.lower() not in headers_of(data)


def test_forwarded_headers_only_from_trusted_proxies(
        echo_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = echo_perimeter
    key = bearer(people["alice"])
    # 127.0.0.2 is a trusted proxy: the client address comes from its X-Forwarded-For
    data = echoed(raw_request(nginx.port, "/v1/models", source="127.0.0.2", headers={
        **key, "X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "api"}))
    h = headers_of(data)
    assert h["x-forwarded-for"] == ["127.0.0.1, 127.0.0.2"] and h["x-real-ip"] == ["127.0.0.1"]
    assert h["x-forwarded-proto"] == ["https"] and h["x-forwarded-host"] == ["api"]
    # ... so network rules apply to that client
    assert_denied(raw_request(nginx.port, "/v1/models", source="127.0.0.2",
                              headers={**key, "X-Forwarded-For": "127.0.0.66"}), 403, "network")
    # 127.0.0.1 is not trusted: its X-Forwarded-* are replaced
    data = echoed(raw_request(nginx.port, "/v1/models", headers={
        **key, "X-Forwarded-For": "127.0.0.2", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "api"}))
    h = headers_of(data)
    assert h["x-forwarded-for"] == ["127.0.0.1"] and h["x-forwarded-proto"] == ["http"]
    assert "x-forwarded-host" not in h


@pytest.mark.parametrize("target,path,query", [
    ("/v1/./models", "/v1/models", ""),
    ("/v1//models", "/v1/models", ""),
    ("/v1/%6dodels?x=1", "/v1/models", "x=1"),
    ("/v1/responses/%61bc?stream=true", "/v1/responses/abc", "stream=true"),
    ("/v1/x/../responses/r_1", "/v1/responses/r_1", ""),
])
def test_upstream_gets_the_normalised_path(echo_perimeter: tuple[RunningNginx, dict[str, Principal]],
                                           target: str, path: str, query: str) -> None:
    nginx, people = echo_perimeter
    data = echoed(raw_request(nginx.port, target, headers=bearer(people["alice"])))
    assert data["raw_path"] == path and data["path"] == path
    assert data["query"] == query


def test_cache_salt_strip_and_body_passthrough(echo_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    nginx, people = echo_perimeter
    hdrs = {**bearer(people["alice"]), "Content-Type": "application/json"}
    body = '{"model":"m","prompt":"x","cache_salt":"probe","max_tokens":5}'
    data = echoed(raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=body.encode()))
    assert json.loads(data["body"]) == {"model": "m", "prompt": "x", "max_tokens": 5}
    plain = '{"model": "m",  "prompt": "x", "max_tokens": 5}'
    data = echoed(raw_request(nginx.port, "/v1/completions", "POST", headers=hdrs, body=plain.encode()))
    assert data["body"] == plain  # untouched, byte for byte
    form = b"--b\r\nContent-Disposition: form-data; name=\"max_tokens\"\r\n\r\n99999\r\n--b--\r\n"
    data = echoed(raw_request(nginx.port, "/v1/audio/transcriptions", "POST", body=form, headers={
        **bearer(people["alice"]), "Content-Type": "multipart/form-data; boundary=b"}))
    assert data["method"] == "POST"


def test_the_fast_path_forwards_only_what_the_reference_would(
        echo_perimeter: tuple[RunningNginx, dict[str, Principal]]) -> None:
    """A route whose bodies are not all parsed (the operator's /pause: only cache_salt and
    chat_template are governed) forwards unparsed only a body the native checks clear; one nested
    past BODY_DEPTH, not UTF-8, or with a number Python's json refuses (njs 0.9 reads -Infinity)
    goes to njs and is refused as the reference refuses it (the differential campaign found them
    forwarded)."""
    nginx, people = echo_perimeter
    conf = (nginx.directory / "conf" / "perimeter-http.conf").read_text()
    pause = conf[conf.index("location = /pause {"):]
    assert "js_content perimeter.read;" in pause[:pause.index("\n    }")]   # the fast path's route
    hdrs = {**bearer(people["ops"]), "Content-Type": "application/json"}
    refused = {
        b'{"a":' + b"[" * 40 + b"]" * 40 + b"}": "bad-json:depth-over-31",
        b'{"a":"\xff"}': "bad-json",
        b'{"a":-Infinity}': "bad-json",
        b'{"a":010}': "bad-json",
        b'{"a":[.5]}': "bad-json",
    }
    for i, (body, reason) in enumerate(refused.items()):
        if i:
            time.sleep(0.5)   # the operator's rate: 2 a second, burst 5
        r = raw_request(nginx.port, "/pause", "POST", headers=hdrs, body=body, source="127.0.0.3")
        assert_denied(r, 400, reason)
        got = {k.lower(): v for k, v in r.headers.items()}.get(REASON, "")
        assert got == reason, (body[:20], got)
    time.sleep(0.5)
    plain = b'{"a": [1, 2.5, "x"]}'
    data = echoed(raw_request(nginx.port, "/pause", "POST", headers=hdrs, body=plain, source="127.0.0.3"))
    assert data["body"] == plain.decode()   # cleared natively: forwarded byte for byte


# --- one path, different audiences per method (internal dispatch), HEAD listed explicitly ------

SPLIT_POLICY = """schema_version: 1
name: split
networks:
  users: [127.0.0.1/32, 127.0.0.2/32]
  admin: [127.0.0.3/32]
audiences:
  users: {kind: end-user, networks: [users], roles: [user], limits: {body_bytes: 4096}}
  operator: {kind: operator, networks: [admin], roles: [operator], limits: {body_bytes: 4096,
             json_caps: {n: 2}}}
  monitoring: {kind: monitoring, networks: [users], auth: none}
routes:
  - {path: /thing, methods: [GET], audience: monitoring}
  - {path: /thing, methods: [POST], audience: operator}
  - {path: /v1/models, methods: [GET, HEAD], audience: users}
  - {path: "/items/{item_id}", methods: [GET], audience: users}
  - {path: "/items/{item_id}", methods: [DELETE], audience: operator}
principals_file: principals.yaml
"""


def _split_inventory() -> Any:
    from scanner.inventory.model import Inventory, Route, Source

    return Inventory(source=Source("asgi", "test"), routes=(
        Route("/thing", ("GET", "POST", "PUT")), Route("/v1/models", ("GET", "HEAD")),
        Route("/items/{item_id}", ("DELETE", "GET"))))


@pytest.mark.parametrize("build_name", sorted(BUILDS))
def test_methods_with_different_audiences(build_name: str, echo_upstream: EchoServer, tmp_path: Path) -> None:
    build = get_build(build_name)
    _, people = make_principals(tmp_path, ("alice", "user"), ("ops", "operator"))
    plan = make_plan(_split_inventory(), SPLIT_POLICY, tmp_path,
                     extra_yaml=listen_yaml(new_port(), "127.0.0.1", echo_upstream.port))
    with RunningNginx(build, plan, tmp_path / "nginx") as nginx:
        port = nginx.port
        assert echoed(raw_request(port, "/thing"))["method"] == "GET"
        assert_denied(raw_request(port, "/thing", source="127.0.0.3"), 403, "network")
        data = echoed(raw_request(port, "/thing", "POST", body=b'{"n":2}', source="127.0.0.3",
                                  headers=bearer(people["ops"])))
        assert data["method"] == "POST" and data["path"] == "/thing"
        assert headers_of(data)[PRINCIPAL_HEADER.lower()] == ["ops"]
        assert_denied(raw_request(port, "/thing", "POST", body=b'{"n":3}', source="127.0.0.3",
                                  headers=bearer(people["ops"])), 400, "json-cap:n")
        assert_denied(raw_request(port, "/thing", "POST", body=b"{}", headers=bearer(people["ops"])),
                      403, "network")
        assert_denied(raw_request(port, "/thing", "PUT", body=b"{}", source="127.0.0.3"), 405)
        r = raw_request(port, "/v1/models", "HEAD", headers=bearer(people["alice"]))
        assert r.status == 200 and not is_proxy_reply(r)
        assert echoed(raw_request(port, "/items/a1?x=2", headers=bearer(people["alice"])))["query"] == "x=2"
        data = echoed(raw_request(port, "/items/a%31", "DELETE", source="127.0.0.3",
                                  headers=bearer(people["ops"])))
        assert data["method"] == "DELETE" and data["raw_path"] == "/items/a1"
        assert_denied(raw_request(port, "/items/a1", "DELETE", headers=bearer(people["alice"])), 403)
        for internal in ("/@perimeter/1/0", "/@perimeter/1/1", "/@perimeter/deny/400"):
            assert_denied(raw_request(port, internal, headers=bearer(people["alice"])), 404)
