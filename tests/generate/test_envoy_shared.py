"""Envoy's config for a fleet (policy shared:): what the ratelimit filter sends is the plan's
zones, nothing is left to a local filter under deny, and under local the local filters hold the
plan's per-proxy shares and count only requests the limiter could not decide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scanner.generate.envoy import EnvoyGenerator
from scanner.generate.interface import GenerateOptions
from scanner.generate.shared import zones_config
from scanner.inventory.catalog import load_ref
from scanner.limiter import config as limiter_config
from scanner.plan.model import Plan
from scanner.runtime.proxy import EnvoyProxy
from scanner.verify import loop
from tests.limiter.fleet import CATALOG, fleet_policy


def _plan(tmp: Path, on_unavailable: str) -> Plan:
    tmp.mkdir(parents=True, exist_ok=True)
    return loop.setup(load_ref(CATALOG), fleet_policy(on_unavailable), tmp, 18000).plan


def _files(plan: Plan, tmp: Path) -> dict[str, str]:
    config = EnvoyGenerator().render(plan, GenerateOptions(output_dir=str(tmp), access_log=str(tmp / "a.log")))
    return {f.name: f.content for f in config.files}


def _hcm(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    return doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]  # type: ignore[no-any-return]


def _sent(route: dict[str, Any]) -> list[tuple[str, ...]]:
    """Each rate_limits entry of a route as (zone, key source, op, slot?, hits)."""
    out = []
    for entry in route["typed_per_filter_config"]["perimeter.shared"]["rate_limits"]:
        acts = entry["actions"]
        zone = acts[0]["generic_key"]["descriptor_value"]
        key = "remote_address" if "remote_address" in acts[1] else acts[1]["metadata"]["metadata_key"]["path"][0]["key"]
        op = next((a["generic_key"]["descriptor_value"] for a in acts[2:] if "generic_key" in a), "acquire")
        slot = any(a.get("metadata", {}).get("descriptor_key") == "slot" for a in acts)
        # the slot's owner (the worker's Lua VM id) beside every slot, on no other descriptor
        owner = [a["metadata"]["metadata_key"] for a in acts if a.get("metadata", {}).get("descriptor_key") == "owner"]
        assert owner == ([{"key": "perimeter", "path": [{"key": "owner"}]}] if slot else []), owner
        hits = entry.get("hits_addend", {}).get("format", "")
        assert entry.get("apply_on_stream_done", False) == (op != "acquire")
        out.append((zone, key, op, "slot" if slot else "", hits))
    return out


@pytest.mark.parametrize("mode", ["deny", "local"])
def test_every_limited_route_sends_its_plan_zones(tmp_path: Path, mode: str) -> None:
    plan = _plan(tmp_path, mode)
    shared = plan.shared
    assert shared is not None
    files = _files(plan, tmp_path)
    hcm = _hcm(files["envoy.yaml"])
    names = [f["name"] for f in hcm["http_filters"]]
    assert names.index("perimeter.lua") < names.index("perimeter.shared")   # Lua writes what it sends
    rl = next(f for f in hcm["http_filters"] if f["name"] == "perimeter.shared")["typed_config"]
    assert rl["failure_mode_deny"] is True and rl["domain"] == shared.domain
    assert rl["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"] == "perimeter_limiter"
    mapper = hcm["local_reply_config"]["mappers"][0]
    assert mapper["filter"] == {"response_flag_filter": {"flags": ["RLSE"]}} and mapper["status_code"] == 503
    assert {"key": "X-Perimeter-Reason", "value": "shared-store-unavailable"} in [h["header"] for h in mapper["headers_to_add"]]
    routes = {r["name"]: r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]}
    for d in plan.allowed:
        route = routes[f"allow:{d.method} {d.path}"]
        zones = shared.route_zones(d)
        if not zones:
            assert "perimeter.shared" not in route.get("typed_per_filter_config", {})
            continue
        key = "principal" if d.auth == "key" else "remote_address"
        want = [(z, key, "acquire", "slot" if z.startswith("conc:") else "",
                 "%DYNAMIC_METADATA(perimeter:cost)%" if z.startswith("tokens:") else "") for z in zones]
        want += [(z, key, "release", "slot", "") for z in zones if z.startswith("conc:")]
        want += [(z, key, "settle", "", "%DYNAMIC_METADATA(perimeter:refund)%") for z in zones if z.startswith("tokens:")]
        assert _sent(route) == want, d.path
    # the limiter's zones file is the plan's, and the envoyproxy/ratelimit one names the same zones
    assert limiter_config.parse(yaml.safe_load(files["limiter-zones.json"])) == zones_config(shared)
    ratelimit = yaml.safe_load(files["ratelimit-config.yaml"])
    assert {d["value"] for d in ratelimit["descriptors"]} == {
        n for n, z in shared.zones.items() if z.kind != "concurrency"}
    lua = hcm["http_filters"][1]["typed_config"]["default_source_code"]["inline_string"]
    assert "local SHARED = true\n" in lua and '["slot"] = true' in lua
    assert 'dynamicMetadata():set("perimeter", "owner", OWNER)' in lua and '"/dev/urandom"' in lua
    locals_ = [f for f in hcm["http_filters"] if f["name"].startswith(("perimeter.rate", "perimeter.tokens"))]
    clusters = [c["name"] for c in yaml.safe_load(files["envoy.yaml"])["static_resources"]["clusters"]]
    if mode == "deny":   # every limit is the limiter's: no local bucket, no per-principal breaker
        assert not locals_ and not any(".c" in c for c in clusters if c.startswith("vllm."))
        return
    # local: each filter counts only requests marked {shared: unavailable}, with the plan's shares
    assert locals_
    for f in locals_:
        cfg = f["typed_config"]
        assert "token_bucket" not in cfg
        assert cfg["rate_limits"][0]["actions"][0]["metadata"]["metadata_key"] == {
            "key": "envoy.filters.http.ratelimit", "path": [{"key": "shared"}]}
        assert all(d["entries"][0] == {"key": "shared", "value": "unavailable"} for d in cfg["descriptors"])
    rate = next(f for f in locals_ if f["name"] == "perimeter.rate.inference")["typed_config"]
    share = shared.local["rate:inference:key:4/5"]
    assert rate["descriptors"][0]["token_bucket"]["max_tokens"] == 2 and share.burst == 2   # type: ignore[union-attr]
    tokens = next(f for f in locals_ if f["name"].startswith("perimeter.tokens.inference"))["typed_config"]
    assert tokens["descriptors"][0]["token_bucket"]["max_tokens"] == 1000                   # 2000 / 2
    assert any(c.endswith(".c1.verify-user-1") for c in clusters)                          # 2 slots / 2


def test_the_config_is_deterministic_and_envoy_takes_it(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "local")
    assert _files(plan, tmp_path / "a") == _files(plan, tmp_path / "a")
    proxy = EnvoyProxy()
    written = proxy.write(plan, tmp_path / "proxy")
    assert proxy.validate(plan, written) == ""
