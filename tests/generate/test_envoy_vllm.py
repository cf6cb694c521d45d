"""The generated Envoy in front of the real, engine-less vLLM 0.29.0 ("everything" surface).

vLLM runs without --api-key: the proxy is the auth. A reply without the perimeter's marker
came from vLLM (500 where a handler needs the engine, 4xx for a bad body): the request
reached it. Loopback vantages: users 127.0.0.1/.2, admin 127.0.0.3, outsider 127.0.0.66.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scanner.inventory.model import Inventory
from scanner.inventory.model import load as load_inventory
from scanner.net import free_port
from scanner.resources import data_file
from tests.generate.test_envoy_harness import (
    Reply,
    RunningEnvoy,
    envoy_binary,
    make_plan,
    make_principals,
    raw,
)

pytestmark = [pytest.mark.envoy, pytest.mark.vllm]

POLICY = """
schema_version: 1
name: vllm-envoy-test
networks:
  users: [127.0.0.1/32, 127.0.0.2/32]
  admin: [127.0.0.3/32]
  monitoring: [127.0.0.1/32]
principals_file: principals.yaml
listen: {{address: 127.0.0.1, port: {port}}}
upstream: {{host: 127.0.0.1, port: {upstream}}}
audiences:
  inference:
    kind: end-user
    networks: [users]
    roles: [user, service]
    limits: {{body_bytes: 8192, json_caps: {{max_tokens: 256, max_completion_tokens: 256, n: 2}},
              rate: {{rps: 200, burst: 400}}, concurrency: 16, timeout_s: 60}}
  limited:
    kind: end-user
    networks: [users]
    roles: [user]
    limits: {{rate: {{rps: 0.2, burst: 3}}, timeout_s: 30}}
  service:
    kind: service
    networks: [users]
    roles: [service]
    limits: {{body_bytes: 65536, json_caps: {{max_tokens: 256}}, timeout_s: 60}}
  operator:
    kind: operator
    networks: [admin]
    roles: [operator]
    limits: {{body_bytes: 65536, timeout_s: 30}}
  monitoring:
    kind: monitoring
    networks: [monitoring]
    auth: none
    limits: {{timeout_s: 10}}
  none: {{kind: none}}
body: {{cache_salt: reject, chat_template: reject}}
routes:
  - {{path: /v1/chat/completions, methods: [POST], audience: inference}}
  - {{path: /v1/completions, methods: [POST], audience: inference}}
  - {{path: /v1/responses, methods: [POST], audience: inference}}
  - {{path: "/v1/responses/{{response_id}}", methods: [GET], audience: inference}}
  - {{path: /v1/models, methods: [GET], audience: limited}}
  - {{path: /tokenize, methods: [POST], audience: service}}
  - {{path: /health, methods: [GET], audience: monitoring}}
  - {{path: /version, methods: [GET], audience: monitoring}}
  - {{path: /pause, methods: [POST], audience: operator}}
  - {{path: /is_paused, methods: [GET], audience: operator}}
  - {{path: /invocations, audience: none}}
  - {{path: /collective_rpc, audience: none}}
  - {{path: /adapters, audience: none}}
  - {{path: "/adapters/{{adapter_name}}", audience: none}}
  - {{path: /docs, audience: none}}
  - {{path: /openapi.json, audience: none}}
"""

CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'


@dataclass
class Setup:
    envoy: RunningEnvoy
    keys: dict[str, str]

    @property
    def port(self) -> int:
        return self.envoy.port

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}", "Content-Type": "application/json"}

    def post(self, path: str, body: bytes, who: str = "alice", source: str = "127.0.0.1",
             chunked: bool = False) -> Reply:
        return raw(self.port, "POST", path, headers=self.auth(who), body=body, source=source,
                   chunked=chunked, timeout=30)


def _inventory(request: pytest.FixtureRequest) -> Inventory:
    catalog = data_file("policies", "catalog", "vllm-0.29.0-everything.json")
    if catalog.exists():
        return load_inventory(catalog)
    inv: Inventory = request.getfixturevalue("everything_inventory")
    return inv


@pytest.fixture(scope="module")
def setup(real_vllm: Any, request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    envoy_binary()
    d: Path = tmp_path_factory.mktemp("envoy-vllm")
    _, keys = make_principals(d, ("alice", "user"), ("bob", "user"), ("svc", "service"),
                              ("ops", "operator"))
    policy = POLICY.format(port=free_port(), upstream=real_vllm.port)
    with RunningEnvoy(make_plan(_inventory(request), policy, d), d / "envoy") as envoy:
        yield Setup(envoy, keys)


def reached(reply: Reply) -> None:
    """vLLM answered (any status), not the proxy (its 5xx: the perimeter's error replaces the body)."""
    assert not reply.denied, (reply.status, reply.headers, reply.body[:300])
    assert reply.headers.get("x-perimeter-reason", "upstream-error") == "upstream-error"
    assert "x-perimeter-reason" not in reply.headers or reply.status >= 500
    assert reply.headers.get("server") != "envoy" or reply.status not in (401, 403, 404, 405, 413, 429)


def denied(reply: Reply, *statuses: int) -> None:
    assert reply.denied, (reply.status, reply.headers, reply.body[:300])
    assert reply.status in statuses, (reply.status, reply.headers, reply.body[:300])


def test_allowed_routes_reach_vllm(setup: Setup) -> None:
    chat = setup.post("/v1/chat/completions", CHAT)
    reached(chat)
    assert chat.status >= 400  # no engine: vLLM answers an error, which proves the request got there
    reached(setup.post("/v1/completions", b'{"model": "m", "prompt": "hi", "max_tokens": 5}'))
    reached(raw(setup.port, "GET", "/v1/responses/resp_1", headers=setup.auth("bob")))
    reached(setup.post("/tokenize", b'{"model": "m", "prompt": "hi"}', who="svc"))
    reached(raw(setup.port, "GET", "/health"))
    version = raw(setup.port, "GET", "/version")
    reached(version)
    assert version.status == 200 and "version" in version.json()
    reached(setup.post("/pause", b"", who="ops", source="127.0.0.3"))


def test_a_bad_body_is_vllms_to_refuse(setup: Setup) -> None:
    reply = setup.post("/v1/chat/completions", b'{"model": "m"}')
    reached(reply)
    assert reply.status in (400, 422)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer vp_wrong"},
                                     {"Authorization": "Basic YWxpY2U6eA=="}])
def test_no_or_bad_key_is_401(setup: Setup, headers: dict[str, str]) -> None:
    denied(raw(setup.port, "POST", "/v1/chat/completions", headers=headers, body=CHAT), 401)


def test_wrong_role_is_403(setup: Setup) -> None:
    reply = setup.post("/tokenize", b'{"model": "m", "prompt": "hi"}', who="alice")
    denied(reply, 403)
    assert reply.headers["x-perimeter-reason"] == "role"
    denied(setup.post("/pause", b"", who="alice", source="127.0.0.3"), 403)


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/invocations"), ("POST", "/collective_rpc"), ("POST", "/adapters"),
    ("DELETE", "/adapters/a1"), ("GET", "/docs"), ("GET", "/openapi.json"), ("POST", "/sleep"),
    ("GET", "/tokenizer_info"), ("POST", "/v1/load_lora_adapter"), ("GET", "/metrics"),
    ("GET", "/metrics/x"), ("POST", "/start_profile"), ("GET", "/v1/realtime"), ("POST", "/scale_elastic_ep"),
])
def test_denied_routes_are_answered_by_the_proxy(setup: Setup, method: str, path: str) -> None:
    reply = raw(setup.port, method, path, headers=setup.auth("ops"), body=b"{}" if method != "GET" else None,
                source="127.0.0.3")
    denied(reply, 404, 405)


def test_pause_for_non_operators(setup: Setup) -> None:
    denied(setup.post("/pause", b"", who="alice", source="127.0.0.3"), 403)   # role
    denied(setup.post("/pause", b"", who="ops", source="127.0.0.1"), 403)     # network
    denied(raw(setup.port, "POST", "/pause", source="127.0.0.3"), 401)        # no key


def test_disallowed_source_address(setup: Setup) -> None:
    reply = setup.post("/v1/chat/completions", CHAT, source="127.0.0.66")
    denied(reply, 403)
    assert reply.headers["x-perimeter-reason"] == "network"
    denied(raw(setup.port, "GET", "/health", source="127.0.0.2"), 403)


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_limit_is_413(setup: Setup, chunked: bool) -> None:
    body = b'{"model": "m", "prompt": "' + b"x" * 9000 + b'"}'
    denied(setup.post("/v1/completions", body, chunked=chunked), 413)


@pytest.mark.parametrize("cap", [b"257", b'"257"', b'"5000"', b"1e9", b"256.5", b'" 300 "', b'"1e3"',
                                 b"[1]", b'{"x": 1}'])
@pytest.mark.parametrize("field", [b"max_tokens", b"max_completion_tokens", b"max\\u005ftokens"])
def test_cap_in_every_form_is_400(setup: Setup, cap: bytes, field: bytes) -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "' + field + b'": ' + cap + b"}"
    reply = setup.post("/v1/chat/completions", body)
    denied(reply, 400)
    assert reply.headers["x-perimeter-reason"].startswith("json-cap:")


def test_duplicate_and_boolean_caps(setup: Setup) -> None:
    denied(setup.post("/v1/chat/completions", b'{"model": "m", "n": 1, "n": 3}'), 400)
    denied(setup.post("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 1, "max_tokens": 999}'),
           400)
    reached(setup.post("/v1/completions", b'{"model": "m", "prompt": "x", "n": true}'))


def test_invalid_json_and_forbidden_fields_are_400(setup: Setup) -> None:
    denied(setup.post("/v1/chat/completions", b'{"model": "m",'), 400)
    for field in (b"cache_salt", b"chat_template", b"chat_template_kwargs"):
        reply = setup.post("/v1/chat/completions", b'{"model": "m", "' + field + b'": "x"}')
        denied(reply, 400)


def test_form_typed_json_is_refused_by_vllm(setup: Setup) -> None:
    # The proxy does not parse form bodies; vLLM's JSON endpoints refuse them (never an engine call).
    body = b'{"model": "m", "prompt": "x", "max_tokens": 99999}'
    for ctype in ("multipart/form-data; boundary=x", "application/x-www-form-urlencoded"):
        headers = {**setup.auth("alice"), "Content-Type": ctype}
        reply = raw(setup.port, "POST", "/v1/completions", headers=headers, body=body)
        reached(reply)
        assert reply.status in (400, 415, 422), (reply.status, reply.body[:200])


def test_rate_per_principal(setup: Setup) -> None:
    statuses = [raw(setup.port, "GET", "/v1/models", headers=setup.auth("alice")).status for _ in range(6)]
    assert statuses.count(429) >= 2, statuses
    last = raw(setup.port, "GET", "/v1/models", headers=setup.auth("alice"))
    denied(last, 429)
    reached(raw(setup.port, "GET", "/v1/models", headers=setup.auth("bob")))


def test_head_is_not_admitted(setup: Setup) -> None:
    denied(raw(setup.port, "HEAD", "/version"), 405)
    denied(raw(setup.port, "HEAD", "/health"), 405)


@pytest.mark.parametrize("target", [
    "/invocations", "/%2e%2e/invocations", "//invocations", "/v1/../invocations", "/INVOCATIONS",
    "/invocations/", "/invocations;x", "/%2finvocations", "/%2Finvocations", "/v1/%2e%2e/invocations",
    "/./invocations", "/%69nvocations", "/v1/chat/completions/../../invocations", "/invocations%20",
])
def test_bypass_attempts_are_denied(setup: Setup, target: str) -> None:
    reply = setup.post(target, b'{"model": "m", "prompt": "x"}')
    denied(reply, 400, 404)
