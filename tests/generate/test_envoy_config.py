"""Envoy generator: golden files, determinism, `envoy --mode validate`, secrets, input errors."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from scanner.errors import GenerateError, InternalError
from scanner.generate import interface
from scanner.generate.envoy import EnvoyGenerator, lua_quote, lua_value, yaml_quote
from scanner.generate.envoy_model import JsonValue, _lua_step, bucket, duration
from scanner.generate.interface import GeneratedConfig, GenerateOptions
from scanner.generate.write import write_config
from scanner.inventory.model import load as load_inventory
from scanner.plan.model import Plan
from scanner.policy.keys import key_sha256
from scanner.policy.load import loads
from scanner.policy.model import Listen, Principal, Rate, TlsServer, TlsUpstream, Upstream
from scanner.rules import BudgetStep
from tests.generate.golden import assert_matches_golden
from tests.generate.test_envoy_harness import FIXED_INVENTORY, GOLDEN, REPO, make_plan, validate

GOLDEN_OPTIONS = GenerateOptions(output_dir="/var/lib/vllm-perimeter")
# Fixed, fake principals: hashes of public strings, never real keys.
GOLDEN_PRINCIPALS = """principals:
  - {{name: alice, role: user, key_sha256: {}}}
  - {{name: batch-svc, role: service, key_sha256: {}}}
  - {{name: ops, role: operator, key_sha256: {}}}
""".format(key_sha256("golden-alice"), key_sha256("golden-batch"), key_sha256("golden-ops"))


def default_policy_text() -> str:
    return (REPO / "policies" / "vllm-default.yaml").read_text(encoding="utf-8")


def golden_plan(tmp: Path) -> Plan:
    (tmp / "principals.yaml").write_text(GOLDEN_PRINCIPALS, encoding="utf-8")
    return make_plan(load_inventory(FIXED_INVENTORY),
                     default_policy_text() + "\nprincipals_file: principals.yaml\n", tmp)


def render(plan: Plan, options: GenerateOptions = GOLDEN_OPTIONS) -> GeneratedConfig:
    return EnvoyGenerator().render(plan, options)


def main_yaml(config: GeneratedConfig) -> str:
    return next(f.content for f in config.files if f.name == config.main)


def test_generator_is_registered() -> None:
    assert isinstance(interface.get("envoy"), EnvoyGenerator)


def test_golden_default_policy(tmp_path: Path) -> None:
    config = render(golden_plan(tmp_path))
    assert config.main == "envoy.yaml"
    assert [f.name for f in config.files] == ["envoy.yaml", "envoy-principals.tsv"]
    assert_matches_golden(config, GOLDEN / "default")


def test_deterministic(tmp_path: Path) -> None:
    a, b = render(golden_plan(tmp_path)), render(golden_plan(tmp_path))
    assert [(f.name, f.content, f.mode) for f in a.files] == [(f.name, f.content, f.mode) for f in b.files]


def test_golden_validates(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_config(render(golden_plan(tmp_path)), out)
    result = validate(out / "envoy.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_key_hashes_only_in_the_0600_file(tmp_path: Path) -> None:
    config = render(golden_plan(tmp_path))
    files = {f.name: f for f in config.files}
    assert files["envoy-principals.tsv"].mode == 0o600
    assert files["envoy.yaml"].mode == 0o644
    digest = key_sha256("golden-alice")
    assert digest in files["envoy-principals.tsv"].content
    assert digest not in files["envoy.yaml"].content
    for f in config.files:
        assert "golden-alice" not in f.content  # the (fake) key itself is nowhere
    lines = [ln for ln in files["envoy-principals.tsv"].content.splitlines() if not ln.startswith("#")]
    assert lines == sorted(lines, key=lambda ln: ln.split("\t")[1])
    assert all(re.fullmatch(r"[0-9a-f]{64}\t[\w.-]+\t[\w.-]+", ln) for ln in lines)
    out = tmp_path / "out"
    write_config(config, out)
    assert (out / "envoy-principals.tsv").stat().st_mode & 0o777 == 0o600


def test_structure_of_the_default_plan(tmp_path: Path) -> None:
    doc = yaml.safe_load(main_yaml(render(golden_plan(tmp_path))))
    assert "admin" not in doc  # no admin interface by default
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["normalize_path"] is True and hcm["merge_slashes"] is True
    assert hcm["path_with_escaped_slashes_action"] == "REJECT_REQUEST"
    assert hcm["use_remote_address"] is True and hcm["xff_num_trusted_hops"] == 0
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    names = [r["name"] for r in routes]
    assert names[-1] == "deny:unknown" and routes[-1]["direct_response"]["status"] == 404
    # one route per allowed method and path, with an exact :method match
    chat = next(r for r in routes if r["name"] == "allow:POST /v1/chat/completions")
    assert chat["match"]["path"] == "/v1/chat/completions"
    assert chat["match"]["headers"] == [{"name": ":method", "string_match": {"exact": "POST"}}]
    # timeout_s is how long it waits without a byte (a stream runs while its events flow), as
    # NGINX's proxy_read_timeout: no total timeout
    assert chat["route"]["idle_timeout"] == "600s" and chat["route"]["timeout"] == "0s"
    # the buffer after Lua holds body_bytes plus the output budget Lua may write in (Lua itself
    # refuses a body over body_bytes: tests/generate/test_envoy_echo.py)
    grown = len(',"max_completion_tokens":4096')
    assert chat["typed_per_filter_config"]["perimeter.buffer"]["buffer"]["max_request_bytes"] == 1048576 + grown
    # templates: the plan's anchored narrow regex
    resp = next(r for r in routes if r["name"] == "allow:GET /v1/responses/{response_id}")
    assert resp["match"]["safe_regex"]["regex"] == r"^/v1/responses/(?:[A-Za-z0-9_][A-Za-z0-9_.:~-]{0,255})$"
    # HEAD is not admitted: /v1/models answers 405 for it
    assert "allow:HEAD /v1/models" not in names
    models = next(r for r in routes if r["name"] == "method:/v1/models")
    assert models["direct_response"]["status"] == 405
    # exact paths come before templates
    first_regex = next(i for i, r in enumerate(routes) if "safe_regex" in r["match"])
    assert all("safe_regex" in r["match"] or r["name"] in ("deny:connect", "deny:unknown")
               for r in routes[first_regex:])
    # denied routes are answered by Envoy
    for path in ("/invocations", "/collective_rpc", "/docs", "/openapi.json"):
        r = next(r for r in routes if r["name"] == f"deny:{path}")
        assert r["direct_response"]["status"] == 404
    # no route forwards a denied path
    forwarded = {r["name"].split(" ", 1)[1] for r in routes if "route" in r}
    assert not forwarded & {"/invocations", "/collective_rpc", "/docs", "/openapi.json"}


def test_every_allowed_decision_has_exactly_one_route(tmp_path: Path) -> None:
    plan = golden_plan(tmp_path)
    doc = yaml.safe_load(main_yaml(render(plan)))
    routes = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    allowed = {f"allow:{d.method} {d.path}" for d in plan.allowed}
    assert {r["name"] for r in routes if r["name"].startswith("allow:")} == allowed
    for r in routes:
        if not r["name"].startswith("allow:"):
            assert "route" not in r, r["name"]  # only allow routes reach the cluster
            assert r["typed_per_filter_config"]["perimeter.lua"]["disabled"] is True


def test_network_acl_and_filters_per_route(tmp_path: Path) -> None:
    doc = yaml.safe_load(main_yaml(render(golden_plan(tmp_path))))
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    routes = {r["name"]: r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]}
    pause = routes["allow:POST /pause"]["typed_per_filter_config"]
    principals = pause["perimeter.network"]["rbac"]["rules"]["policies"]["networks"]["principals"]
    assert principals == [{"direct_remote_ip": {"address_prefix": "10.30.0.0", "prefix_len": 16}}]
    # public (0.0.0.0/0 and ::/0): no RBAC at all
    assert "perimeter.network" not in routes["allow:POST /v1/chat/completions"]["typed_per_filter_config"]
    # monitoring needs no key and no body check, but Lua still drops the headers not forwarded
    assert "perimeter.lua" not in routes["allow:GET /health"]["typed_per_filter_config"]
    assert routes["allow:GET /health"]["metadata"]["filter_metadata"]["perimeter.lua"]["g"]
    filters = [f["name"] for f in hcm["http_filters"]]
    assert filters[0] == "perimeter.network" and filters[1] == "perimeter.lua"
    assert filters[-2:] == ["perimeter.buffer", "envoy.filters.http.router"]
    rate = next(f for f in hcm["http_filters"] if f["name"] == "perimeter.rate.inference")
    descriptors = rate["typed_config"]["descriptors"]
    assert [d["entries"] for d in descriptors] == [[{"key": "principal", "value": "alice"}],
                                                   [{"key": "principal", "value": "batch-svc"}]]
    assert descriptors[0]["token_bucket"] == {"max_tokens": 20, "tokens_per_fill": 10,
                                              "fill_interval": "1s"}
    clusters = [c["name"] for c in doc["static_resources"]["clusters"]]
    assert "vllm" in clusters and "vllm.inference.c16.alice" in clusters
    # Authorization and every spoofable header are removed before the upstream
    removed = hcm["route_config"]["request_headers_to_remove"]
    assert "authorization" in removed and "x-perimeter-principal" in removed
    assert "x-forwarded-for" in removed and "x-original-url" in removed


def test_lua_holds_no_key_and_reads_hashes_by_absolute_path(tmp_path: Path) -> None:
    """The one rule: config_dir if given, else the output directory; never runtime_dir (issue 12)."""
    config = render(golden_plan(tmp_path), GenerateOptions(runtime_dir="/run/perim", output_dir="/srv/out/"))
    assert '"/srv/out/envoy-principals.tsv"' in main_yaml(config) and "/run/perim" not in main_yaml(config)
    assert [(f.path, f.generated, f.holds) for f in config.runtime_files] == [
        ("/srv/out/envoy-principals.tsv", "envoy-principals.tsv", "key hashes")]
    config = render(golden_plan(tmp_path), GenerateOptions(
        runtime_dir="/run/perim", output_dir="/srv/out", extra={"config_dir": "/etc/vllm-perimeter"}))
    assert '"/etc/vllm-perimeter/envoy-principals.tsv"' in main_yaml(config)
    assert config.runtime_files[0].path == "/etc/vllm-perimeter/envoy-principals.tsv"
    with pytest.raises(GenerateError, match="no config directory"):
        render(golden_plan(tmp_path), GenerateOptions(runtime_dir="/run/perim"))


# --- variants that must validate -----------------------------------------------------------


def _variant(tmp_path: Path, plan: Plan, options: GenerateOptions = GOLDEN_OPTIONS) -> str:
    out = tmp_path / "variant"
    write_config(render(plan, options), out)
    result = validate(out / "envoy.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    return (out / "envoy.yaml").read_text(encoding="utf-8")


def test_tls_both_sides_validate(tmp_path: Path) -> None:
    from tests.generate.certs import CertAuthority

    ca = CertAuthority(tmp_path)
    server = ca.issue("perimeter", dns=("perimeter.test",), ips=("127.0.0.1",))
    client = ca.issue("perimeter-client", client=True)
    plan = replace(golden_plan(tmp_path),
                   listen=Listen("127.0.0.1", 8443, TlsServer(str(server.cert), str(server.key))),
                   upstream=Upstream("127.0.0.1", 8000, TlsUpstream(
                       ca=str(ca.pair.cert), client_cert=str(client.cert), client_key=str(client.key),
                       server_name="vllm.test"), use_tls=True))
    text = _variant(tmp_path, plan)
    doc = yaml.safe_load(text)
    listener = doc["static_resources"]["listeners"][0]
    assert "DownstreamTlsContext" in listener["filter_chains"][0]["transport_socket"]["typed_config"]["@type"]
    cluster = doc["static_resources"]["clusters"][0]
    tls = cluster["transport_socket"]["typed_config"]
    assert tls["sni"] == "vllm.test"
    assert tls["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": "vllm.test"}}]
    assert tls["common_tls_context"]["tls_certificates"][0]["certificate_chain"]["filename"] == str(client.cert)
    assert '"https"' in text  # X-Forwarded-Proto


def test_upstream_tls_by_ip_checks_the_ip_san(tmp_path: Path) -> None:
    plan = replace(golden_plan(tmp_path), upstream=Upstream("127.0.0.1", 8000, TlsUpstream(
        ca="/etc/ssl/ca.pem"), use_tls=True))
    doc = yaml.safe_load(main_yaml(render(plan)))
    tls = doc["static_resources"]["clusters"][0]["transport_socket"]["typed_config"]
    assert "sni" not in tls
    assert tls["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}]


def test_trusted_proxies_and_admin_validate(tmp_path: Path) -> None:
    plan = replace(golden_plan(tmp_path), trusted_proxies=("10.0.0.0/8", "fd00::/8"))
    text = _variant(tmp_path, plan, GenerateOptions(output_dir="/var/lib/vllm-perimeter",
                                                    extra={"admin": "127.0.0.1:9901"}))
    doc = yaml.safe_load(text)
    assert doc["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9901}
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["use_remote_address"] is False
    cidrs = hcm["original_ip_detection_extensions"][0]["typed_config"]["xff_trusted_cidrs"]["cidrs"]
    assert {"address_prefix": "10.0.0.0", "prefix_len": 8} in cidrs
    assert "remote_ip:" in text and "direct_remote_ip:" not in text


def test_strip_body_policy_and_hostname_upstream_validate(tmp_path: Path) -> None:

    (tmp_path / "principals.yaml").write_text(GOLDEN_PRINCIPALS, encoding="utf-8")
    policy = (default_policy_text().replace("cache_salt: reject", "cache_salt: strip")
              .replace("chat_template: reject", "chat_template: pass"))
    plan = replace(make_plan(load_inventory(FIXED_INVENTORY), policy + "\nprincipals_file: principals.yaml\n",
                             tmp_path), upstream=Upstream("localhost", 8000))
    text = _variant(tmp_path, plan)
    assert '["cache_salt"] = "strip"' in text and '["cache_salt"] = "reject"' not in text
    assert '["chat_template"] =' not in text          # pass: not named, not checked
    assert "type: STRICT_DNS" in text


def test_websocket_route_validates(tmp_path: Path) -> None:
    (tmp_path / "principals.yaml").write_text(GOLDEN_PRINCIPALS, encoding="utf-8")
    text = default_policy_text().replace(
        '{path: /v1/realtime, audience: none, note: "WebSocket; allow explicitly if you serve realtime audio"}',
        "{path: /v1/realtime, methods: [GET], audience: inference}")
    plan = make_plan(load_inventory(FIXED_INVENTORY), text + "\nprincipals_file: principals.yaml\n",
                     tmp_path)
    assert plan.decision("GET", "/v1/realtime").allowed  # type: ignore[union-attr]
    doc = yaml.safe_load(_variant(tmp_path, plan))
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["upgrade_configs"] == [{"upgrade_type": "websocket", "enabled": False}]
    route = next(r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]
                 if r["name"] == "allow:GET /v1/realtime")
    assert route["route"]["upgrade_configs"] == [{"upgrade_type": "websocket", "enabled": True}]
    assert "perimeter.buffer" not in route["typed_per_filter_config"]


def test_everything_catalog_validates(tmp_path: Path) -> None:
    from scanner.resources import data_file

    catalog = data_file("policies", "catalog", "vllm-0.29.0-everything.json")
    if not catalog.exists():
        pytest.skip("catalog not present")
    (tmp_path / "principals.yaml").write_text(GOLDEN_PRINCIPALS, encoding="utf-8")
    plan = make_plan(load_inventory(catalog),
                     default_policy_text() + "\nprincipals_file: principals.yaml\n", tmp_path)
    _variant(tmp_path, plan)


# --- errors --------------------------------------------------------------------------------


def test_unknown_option_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(GenerateError, match="unknown option"):
        render(golden_plan(tmp_path), GenerateOptions(extra={"njs_module": "/x.so"}))


def test_relative_config_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(GenerateError, match="absolute"):
        render(golden_plan(tmp_path), GenerateOptions(output_dir="run"))
    with pytest.raises(GenerateError, match="absolute"):
        render(golden_plan(tmp_path), GenerateOptions(output_dir="/srv", extra={"config_dir": "etc"}))


@pytest.mark.parametrize("admin", ["0.0.0.0:9901", "10.0.0.1:9901", "127.0.0.1", "localhost:9901"])
def test_admin_must_be_loopback(tmp_path: Path, admin: str) -> None:
    with pytest.raises(GenerateError, match="loopback"):
        render(golden_plan(tmp_path), GenerateOptions(extra={"admin": admin}))


def test_principal_names_must_be_header_safe(tmp_path: Path) -> None:
    plan = golden_plan(tmp_path)
    bad = replace(plan, principals=(*plan.principals, Principal("evil\nname", "user", "0" * 64)))
    with pytest.raises(GenerateError, match="principal"):
        render(bad)


def test_half_mtls_is_an_error(tmp_path: Path) -> None:
    plan = replace(golden_plan(tmp_path), upstream=Upstream("127.0.0.1", 8000, TlsUpstream(
        ca="/ca.pem", client_cert="/c.pem"), use_tls=True))
    with pytest.raises(GenerateError, match="mTLS"):
        render(plan)


def test_listen_address_must_be_an_ip(tmp_path: Path) -> None:
    plan = replace(golden_plan(tmp_path), listen=Listen("localhost", 8080))
    with pytest.raises(GenerateError, match="IP address"):
        render(plan)


def test_no_allowed_routes_still_renders_a_deny_all(tmp_path: Path) -> None:
    policy = loads("schema_version: 1\nname: nothing\naudiences: {none: {kind: none}}\n"
                   "routes: [{path: /v1/models, audience: none}]\n")
    from scanner.plan.build import build

    plan = build(load_inventory(FIXED_INVENTORY), policy)
    assert not plan.allowed
    text = _variant(tmp_path, plan)
    assert '"allow:' not in text


# --- helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(("rps", "burst", "expected"), [
    (10, 20, (20, 10, "1s")),
    (0.5, 0, (1, 1, "2s")),
    (2.5, 1, (5, 5, "2s")),
    (100, 5, (100, 100, "1s")),
])
def test_token_buckets(rps: float, burst: int, expected: tuple[int, int, str]) -> None:
    b = bucket(Rate(rps=rps, burst=burst))
    assert (b.max_tokens, b.tokens_per_fill, b.fill_interval) == expected


def test_durations() -> None:
    assert duration(None) == "0s"
    assert duration(600) == "600s"
    assert duration(1.5) == "1.500s"


def test_quoting() -> None:
    assert yaml.safe_load("k: " + yaml_quote('a "b"\n: c')) == {"k": 'a "b"\n: c'}
    assert yaml.safe_load(yaml_quote("n")) == "n"  # never a YAML boolean
    assert lua_quote('a"b\\c\n') == '"a\\"b\\\\c\\010"'


def test_lua_value_writes_json_as_lua_tables_and_null_as_the_sentinel() -> None:
    steps: list[JsonValue] = [{"op": "pin", "field": "seed", "value": None}, {"op": "cap", "path": "n", "max": 4},
             {"op": "media", "data": 1.5, "domains": [], "embeds": "deny", "x": True, "y": False}]
    assert lua_value(steps) == ('{{["op"] = "pin", ["field"] = "seed", ["value"] = NULL}, '
                                '{["op"] = "cap", ["path"] = "n", ["max"] = 4}, '
                                '{["op"] = "media", ["data"] = 1.5, ["domains"] = {}, ["embeds"] = "deny", '
                                '["x"] = true, ["y"] = false}}')
    assert lua_value("é\n") == lua_quote("é\n") and lua_value(None) != lua_value("null")
    with pytest.raises(InternalError):
        lua_value(float("inf"))


def test_a_budget_step_reaches_lua_split_once() -> None:
    """OPS.budget reads its field's names and its fields' names at the written level from the
    step (the generator splits them once), never splitting route data on a request."""
    fields = ["max_tokens", "max_completion_tokens", "sampling_params.max_tokens", "sampling_params.x.y"]
    nested = BudgetStep(fields=fields, field="sampling_params.max_tokens", absent="inject", cap=5)
    step = _lua_step(nested.model_dump(mode="json"))
    assert isinstance(step, dict) and step["names"] == ["sampling_params", "max_tokens"]
    assert step["level"] == ["max_tokens"] and step["fields"] == fields and step["cap"] == 5
    top = _lua_step(nested.model_copy(update={"field": "max_completion_tokens"}).model_dump(mode="json"))
    assert isinstance(top, dict) and top["names"] == ["max_completion_tokens"]
    assert top["level"] == ["max_tokens", "max_completion_tokens"]
    cap: dict[str, JsonValue] = {"op": "cap", "path": "a.b", "max": 1}
    assert _lua_step(dict(cap)) == cap
