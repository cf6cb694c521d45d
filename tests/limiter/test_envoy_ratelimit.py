"""The zones as an envoyproxy/ratelimit configuration (scanner/limiter/envoy_ratelimit.py)."""

from __future__ import annotations

from scanner.limiter import config, envoy_ratelimit


def test_rate_and_token_zones_mapped_concurrency_left_out() -> None:
    cfg = config.parse({"domain": "d", "zones": {
        "rate:a": {"kind": "rate", "rps": 10, "burst": 20},
        "rate:b": {"kind": "rate", "rps": 0.5, "burst": 1},
        "rate:c": {"kind": "rate", "rps": 2.5, "burst": 1},
        "conc:a": {"kind": "concurrency", "limit": 4, "slot_ttl_s": 60},
        "tokens:a": {"kind": "tokens", "per_minute": 200000}}})
    out = envoy_ratelimit.config(cfg)
    assert out["domain"] == "d"
    assert [d["value"] for d in out["descriptors"]] == ["rate:a", "rate:b", "rate:c", "tokens:a"]
    limits = {d["value"]: d["descriptors"][0]["rate_limit"] for d in out["descriptors"]}
    assert limits == {"rate:a": {"unit": "second", "requests_per_unit": 10},
                      "rate:b": {"unit": "minute", "requests_per_unit": 30},
                      "rate:c": {"unit": "minute", "requests_per_unit": 150},
                      "tokens:a": {"unit": "minute", "requests_per_unit": 200000}}
    assert [k["key"] for k in out["descriptors"][0]["descriptors"]] == ["principal", "remote_address"]
