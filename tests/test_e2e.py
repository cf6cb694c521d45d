"""The closed loop on real parts: generated proxies in front of the engine-less real vLLM 0.29.0,
proven by the prober with the same plan. Zero findings; weakened configs are caught."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scanner.demo import make_principals
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy.load import loads
from scanner.probe.interface import Credential, ProbeOptions, ProbeResult, Target, Vantage
from scanner.probe.runner import probe
from scanner.resources import data_file
from scanner.runtime import envoy, nginx

NETWORKS = {"public": ("127.0.0.1/32",), "monitoring": ("127.0.0.2/32",), "admin": ("127.0.0.3/32",)}
VANTAGES = (Vantage("public", "127.0.0.1"), Vantage("monitoring", "127.0.0.2"),
            Vantage("admin", "127.0.0.3"), Vantage("outside", "127.0.0.66"))
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=180)
# The engine-less app closes its connection after each handler error (500): no upstream
# keep-alive, or the proxy's next POST on that connection would be a 502.
ENGINELESS = {"upstream_keepalive": "0"}


def _plan(directory: Path, upstream_port: int) -> Plan:
    text = data_file("policies", "vllm-default.yaml").read_text(encoding="utf-8")
    text += (f"\nprincipals_file: principals.yaml\nlisten: {{address: 127.0.0.1, port: {free_port()}}}\n"
             f"upstream: {{host: 127.0.0.1, port: {upstream_port}}}\n")
    return build(load_ref("vllm-0.29.0-everything"), loads(text, "e2e.yaml", directory), NETWORKS)


def _summary(res: ProbeResult) -> list[str]:
    return [f"{f.severity} {f.rule} {f.method} {f.path} [{f.vantage}] {f.evidence[:1]}" for f in res.findings]


@pytest.fixture(scope="module")
def setup(real_vllm, tmp_path_factory) -> tuple[Plan, tuple[Credential, ...], Path]:  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("e2e")
    creds = make_principals(work)
    return _plan(work, real_vllm.port), creds, work


def _nginx_builds() -> Iterator[nginx.NginxBuild]:
    for build_ in (nginx.static_build(), nginx.debian_build()):
        if build_ is not None:
            yield build_


@pytest.mark.parametrize("build_name", ["static-1.31", "debian-1.22"])
def test_nginx_in_front_of_real_vllm_has_zero_findings(setup, build_name: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan, creds, _ = setup
    build_ = {b.name: b for b in _nginx_builds()}.get(build_name)
    if build_ is None:
        pytest.fail(f"NGINX {build_name} missing") if __import__("os").environ.get("CI") else pytest.skip(build_name)
    with nginx.process(plan, build_, tmp_path, ENGINELESS):
        res = probe(plan, Target(f"http://127.0.0.1:{plan.listen.port}"), creds, VANTAGES, OPTIONS)
    assert not res.unreachable, res.reason
    assert res.findings == (), _summary(res)
    assert len(res.attempts) > 5000


def test_envoy_in_front_of_real_vllm_has_zero_findings(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan, creds, _ = setup
    with envoy.process(plan, tmp_path):
        res = probe(plan, Target(f"http://127.0.0.1:{plan.listen.port}"), creds, VANTAGES, OPTIONS)
    assert not res.unreachable, res.reason
    assert res.findings == (), _summary(res)
    assert len(res.attempts) > 5000


# --- deliberately weakened NGINX configs ----------------------------------------------------

def _block(conf: str, location: str) -> tuple[int, int]:
    start = conf.index(f"    location {location} {{\n")
    return start, conf.index("\n    }\n", start)


def _edit_block(location: str, edit: Callable[[str], str]) -> Callable[[str], str]:
    def apply(conf: str) -> str:
        start, end = _block(conf, location)
        new = edit(conf[start:end])
        assert new != conf[start:end], f"mutation of {location} changed nothing"
        return conf[:start] + new + conf[end:]
    return apply


WEAKENINGS: dict[str, tuple[Callable[[str], str], str, str, str]] = {
    # name: (mutation, expected rule, method, path)
    "prefix location instead of exact": (
        lambda c: c.replace("    location = /metrics {\n", "    location /metrics {\n"),
        "VP001", "GET", "/metrics"),
    "forgotten method restriction": (
        _edit_block("= /v1/chat/completions",
                    lambda b: re.sub(r"\n\s*if \(\$request_method != POST\)[^\n]*", "", b)),
        "VP008", "*", "/v1/chat/completions"),
    "missing network rule": (
        _edit_block("= /pause", lambda b: re.sub(r"\n\s*if \(\$perimeter_net_\d+ = 0\)[^\n]*", "", b)),
        "VP003", "POST", "/pause"),
    "raw URI forwarding": (
        lambda c: c.replace("proxy_pass http://vllm_upstream$perimeter_path$is_args$args;",
                            "proxy_pass http://vllm_upstream;"),
        "VP010", "*", "*"),
}


@pytest.mark.parametrize("name", sorted(WEAKENINGS))
def test_weakened_nginx_config_is_caught(setup, name: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan, creds, _ = setup
    mutate, rule, method, path = WEAKENINGS[name]
    build_ = next(_nginx_builds())
    proc = nginx.process(plan, build_, tmp_path, ENGINELESS)
    http_conf = tmp_path / "conf" / "perimeter-http.conf"
    original = http_conf.read_text()
    http_conf.write_text(mutate(original))
    assert http_conf.read_text() != original
    with proc:
        res = probe(plan, Target(f"http://127.0.0.1:{plan.listen.port}"), creds, VANTAGES, OPTIONS)
    hits = [f for f in res.findings if f.rule == rule and method in (f.method, "*") and path in (f.path, "*")]
    assert hits, f"{name}: expected {rule} {method} {path}; got {_summary(res)}"
    assert res.exit_code("low") == 1
