"""vLLM's own --api-key kept on behind the perimeter (issue 12, item 1).

With ``upstream.api_key_file`` the proxy presents ``Authorization: Bearer <vLLM's key>`` on every
allowed request (NGINX: a 0600 include its master reads; Envoy: Lua reads the file once, the route
sets the header), the client's key still never reaches vLLM, and no config text holds the key.
``verify`` gives the stand-in (vLLM's guard) a throwaway key; the witness proves which key arrived."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from scanner import mutate
from scanner.errors import ConfigError, PolicyError
from scanner.inventory.catalog import PROFILES, load_ref
from scanner.net import free_port
from scanner.plan.inputs import load_policy
from scanner.policy import keys
from scanner.policy.load import loads
from scanner.policy.model import Policy
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime import nginx
from scanner.runtime.proxy import EnvoyProxy, NginxProxy, Proxy
from scanner.secrets import fingerprint
from scanner.verify import loop, mutation
from tests.probe.realproxy import but_rates, probe_through, proxy_named, unpaced

CATALOG = "vllm-0.29.0-default"
# every check but rates and concurrency: the policy is unpaced (these tests are about the key)
OPTIONS = but_rates(ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300))
POLICY_TEXT = (Path(__file__).parents[2] / "policies" / "vllm-default.yaml").read_text()


def _policy() -> Policy:
    """The bundled policy with vLLM's key file, unpaced (these tests are about the key, not rates)."""
    policy = unpaced(load_policy(None))
    return replace(policy, upstream=replace(policy.upstream, api_key_file="/run/secrets/vllm-api-key"))


def test_the_key_file_is_an_absolute_path_in_the_policy() -> None:
    text = POLICY_TEXT + "upstream: {host: 127.0.0.1, port: 8000, api_key_file: /run/secrets/vllm.key}\n"
    assert loads(text).upstream.api_key_file == "/run/secrets/vllm.key"
    for bad in ("vllm.key", "/run/a b", "/run/$x"):
        with pytest.raises(PolicyError, match="absolute path"):
            loads(POLICY_TEXT + f"upstream: {{api_key_file: '{bad}'}}\n")


def test_the_key_is_in_no_config_text(tmp_path: Path) -> None:
    s = loop.setup(load_ref(CATALOG), _policy(), tmp_path, 9)
    assert s.upstream_key and s.plan.upstream.api_key_file == str((tmp_path / "upstream-api-key").resolve())
    assert (tmp_path / "upstream-api-key").stat().st_mode & 0o777 == 0o600
    for proxy in (EnvoyProxy(), NginxProxy(nginx.static_build() or nginx.debian_build(), "nginx")):  # type: ignore[arg-type]
        out = tmp_path / proxy.kind
        proxy.write(s.plan, out)
        holding = [f for f in out.rglob("*") if f.is_file() and s.upstream_key in f.read_text()]
        if proxy.kind == "envoy":    # Lua reads the policy's file itself
            assert holding == []
            assert any(s.plan.upstream.api_key_file in f.read_text() for f in out.rglob("envoy.yaml"))
        else:                        # the master reads a 0600 include; nothing else holds the key
            assert [f.name for f in holding] == ["perimeter-upstream-key.conf"]
            assert holding[0].stat().st_mode & 0o777 == 0o600


def test_a_bad_key_file_is_a_usage_error(tmp_path: Path) -> None:
    s = loop.setup(load_ref(CATALOG), _policy(), tmp_path, 9)
    key_file = Path(s.plan.upstream.api_key_file or "")
    for text in ("two words\n", "", "a\nb\n"):
        key_file.write_text(text)
        for proxy in (EnvoyProxy(), proxy_named("nginx")):
            with pytest.raises(ConfigError, match=r"upstream\.api_key_file") as caught:
                proxy.write(s.plan, tmp_path / "out")
            assert "two" not in str(caught.value)     # the file is named, its content never
    key_file.unlink()
    with pytest.raises(ConfigError, match="cannot read"):
        proxy_named("nginx").write(s.plan, tmp_path / "out")


def _proxy(name: str) -> Proxy:
    return proxy_named(name)


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_the_stand_in_guarded_by_its_key_is_reached_with_it(name: str) -> None:
    run = loop.run(load_ref(CATALOG), _policy(), [_proxy(name)], OPTIONS)[0].result
    assert not run.findings, [(f.rule, f.title, f.evidence[:1]) for f in run.findings]
    seen = [a.upstream for a in run.attempts if a.upstream is not None and a.expected == "allow"]
    assert len(seen) > 50
    auths = {u.header("authorization") for u in seen}
    assert len(auths) == 1 and None not in auths      # one key, vLLM's, on every allowed request


@pytest.mark.parametrize("name", ["nginx", "envoy"])
def test_a_proxy_that_does_not_present_the_key_is_caught(name: str, tmp_path: Path) -> None:
    # in verify, vLLM's guard refuses the guarded routes (an allowed route blocked, VP006) ...
    runs, mutants = mutation.mutants(load_ref(CATALOG), _policy(), [_proxy(name)], OPTIONS,
                                     only=("upstream-key-not-presented",))
    assert not runs[0].result.findings
    assert [m.status for m in mutants] == ["caught"], mutants
    # ... and with an unguarded upstream the witness alone sees it, on every allowed route
    res = probe_through(tmp_path, _proxy(name), _policy(), CATALOG, replace(OPTIONS, checks=("upstream",)),
                        mutant="upstream-key-not-presented")
    vp016 = [f for f in res.findings if f.rule == "VP016"]
    assert vp016 and all(f.rule == "VP016" for f in res.findings), [(f.rule, f.title) for f in res.findings]
    assert any(f.path == "/health" for f in vp016)   # a route vLLM itself does not guard


def test_without_the_setting_the_mutant_does_not_apply(tmp_path: Path) -> None:
    plan = loop.setup(load_ref(CATALOG), load_policy(None), tmp_path, 9).plan
    with pytest.raises(mutate.NotApplicable):
        mutate.OPERATORS["nginx.upstream-key-not-presented"].apply(Path("/nonexistent"), plan)


# --- the real engine-less vLLM 0.29.0 with --api-key ------------------------------------------

def test_real_vllm_with_its_api_key_behind_both_proxies(vllm_python: str, tmp_path: Path) -> None:
    from scanner.standin.real import RealVllmServer

    key, port = keys.new_key(), free_port()
    spec = PROFILES["default"].extraction(vllm_python)
    spec = replace(spec, serve_args=(*spec.serve_args, "--api-key", key))
    s = loop.setup(load_ref(CATALOG), _policy(), tmp_path, port, upstream_key=key)
    builds = [b for b in (nginx.static_build(), nginx.debian_build()) if b is not None]
    proxies: list[Proxy] = [NginxProxy(builds[0], builds[0].name, {"upstream_keepalive": "0"}), EnvoyProxy()]
    with RealVllmServer(spec, port=port, witness=True) as server:
        for proxy in proxies:
            directory = tmp_path / proxy.name
            proxy.write(s.plan, directory)
            res: ProbeResult = loop.proxy_run(s, proxy, directory, OPTIONS, server.url).result
            assert not res.findings, (proxy.name, [(f.rule, f.title, f.evidence[:1]) for f in res.findings])
            guarded = [a for a in res.attempts if a.expected == "allow" and a.path.startswith("/v1/")
                       and a.upstream is not None]
            assert guarded and all(a.status != 401 for a in guarded)
            assert {a.upstream.header("authorization") for a in guarded if a.upstream} == {fingerprint(key)}
        # and vLLM's guard is really on: without the proxy, no key, 401
        assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401
    assert json.dumps(s.plan.body_dict()).count(key) == 0
