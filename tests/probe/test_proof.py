"""The five ways a 0-findings verdict could hide a weakened perimeter (issue 8), each measured
with the bundled default policy's real rate limits, the 0.29.0 "everything" stand-in, a
loopback address per network (single hosts: /32) plus one outside, user/service/operator keys:
every one must now give findings."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from scanner.generate.nginx_model import RULES
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import unpaced

CATALOG = "vllm-0.29.0-everything"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300)


def _nginx() -> Proxy:
    build = nginx.static_build() or nginx.debian_build()
    if build is None:
        pytest.skip("no NGINX")
    return NginxProxy(build, "nginx")


def _probe(tmp_path: Path, proxy: Proxy, edit: Callable[[Path], None], checks: tuple[str, ...],
           paced: bool = False) -> ProbeResult:
    """The proxy's generated config, edited by hand, in front of the stand-in, probed (``paced``:
    under the bundled policy's own rate limits, else under unpaced() ones)."""
    from scanner.net import free_port

    inventory = load_ref(CATALOG)
    port = free_port()
    policy = load_policy(None)
    s = loop.setup(inventory, policy if paced else unpaced(policy), tmp_path, port, keys_per_role=1)
    directory = tmp_path / "proxy"
    edit(proxy.write(s.plan, directory))
    with StandinThread(inventory, "127.0.0.1", port) as standin:
        return loop.proxy_run(s, proxy, directory, replace(OPTIONS, checks=checks), standin.url).result


def _route_edit(route: str, old: str, new: str) -> Callable[[Path], None]:
    def edit(conf: Path) -> None:
        http = conf / "perimeter-http.conf"
        text = http.read_text()
        start = text.index(f"\n    # {route}: ")
        end = text.index("\n    # ", start + 1)
        block = re.sub(old, new, text[start:end])
        assert block != text[start:end]
        http.write_text(text[:start] + block + text[end:])
    return edit


def _rules(res: ProbeResult, path: str) -> set[str]:
    return {f.rule for f in res.findings if f.path == path}


def test_raised_body_limit_is_caught_though_the_matrix_spends_the_rate_budget(tmp_path: Path) -> None:
    # Before: the matrix used up the inference rate budget, every body case met 429, and a 429
    # counted as denied. Now a 429 proves nothing but a rate limit, and the cases are paced.
    res = _probe(tmp_path, _nginx(), _route_edit("/v1/chat/completions", r"client_(max_body|body_buffer)_size \d+;",
                                                 r"client_\1_size 100m;"), ("matrix", "limits"), paced=True)
    assert "VP005" in _rules(res, "/v1/chat/completions"), [f.title for f in res.findings]
    assert not [a for a in res.attempts if a.check == "limits" and a.verdict == "inconclusive" and a.tries == 3]


def test_json_caps_removed_from_every_inference_route_are_caught(tmp_path: Path) -> None:
    def edit(conf: Path) -> None:
        # every rule program without its cap steps
        rules = conf / RULES
        doc = json.loads(rules.read_text())
        capped = {pid: [s for s in steps if s["op"] != "cap"] for pid, steps in doc["programs"].items()}
        assert capped != doc["programs"]
        rules.write_text(json.dumps({**doc, "programs": capped}))

    res = _probe(tmp_path, _nginx(), edit, ("matrix", "limits"))
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        assert "VP005" in _rules(res, path), path


def test_an_allowed_route_that_fails_closed_with_503_is_not_silent(tmp_path: Path) -> None:
    def edit(conf: Path) -> None:
        doc = yaml.safe_load((conf / "envoy.yaml").read_text())
        hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        route = next(r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]
                     if r["name"] == "allow:POST /v1/chat/completions")
        route["typed_per_filter_config"]["perimeter.lua"] = {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute", "disabled": True}
        (conf / "envoy.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    res = _probe(tmp_path, EnvoyProxy(), edit, ("matrix",))
    found = [f for f in res.findings if f.path == "/v1/chat/completions"]
    assert found and {f.severity for f in found} & {"medium", "high", "critical"}
    assert any("503" in (e.why or "") for f in found for e in f.evidence), found


def test_a_single_host_network_is_spoofed_and_a_trusting_config_caught(tmp_path: Path) -> None:
    # admin is 127.0.0.x/32, a single host: the spoof check now claims that very address
    def edit(conf: Path) -> None:
        http = conf / "perimeter-http.conf"
        text = http.read_text()
        http.write_text(text.replace("    server_name _;\n", "    server_name _;\n    set_real_ip_from 0.0.0.0/0;\n"
                                     "    real_ip_header X-Forwarded-For;\n", 1))

    res = _probe(tmp_path, _nginx(), edit, ("spoof",))
    assert any(f.rule == "VP003" and f.path == "/pause" for f in res.findings), [f.title for f in res.findings]


@pytest.mark.parametrize("header", ["Authorization", "Upgrade", "HTTP2-Settings"])
def test_headers_forwarded_upstream_are_seen_by_the_witness(tmp_path: Path, header: str) -> None:
    var = "$http_" + header.lower().replace("-", "_")

    def edit(conf: Path) -> None:
        proxy = conf / "perimeter-proxy.conf"
        proxy.write_text(proxy.read_text() + f"proxy_set_header {header} {var};\n")

    res = _probe(tmp_path, _nginx(), edit, ("upstream",))
    rules = {f.rule for f in res.findings}
    assert rules & {"VP012", "VP013"}, [f.title for f in res.findings]
