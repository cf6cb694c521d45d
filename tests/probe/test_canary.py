"""The SSRF canary (issue 10, item 5: ``probe --ssrf-canary``): a listener the probe runs, media
URLs naming it in allowed bodies, a fetch of one the plan refuses a finding. Rehearsed with the
stand-in fetching media URLs as vLLM does (``--fetch-media``, loopback only), through NGINX and
Envoy; on staging it is a real multimodal vLLM that fetches."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from scanner.cli.main import main
from scanner.errors import UsageError
from scanner.net import free_port
from scanner.plan.inputs import load_policy
from scanner.probe.canary import Canary, parse
from scanner.probe.interface import ProbeOptions
from scanner.standin._witness import _loopback_url
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("ssrf-canary",))
ADDRESS = "127.0.0.77"


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:80", "http://127.0.0.1", "http://canary.example:80",
                                 "http://127.0.0.1:80/path", "http://u@127.0.0.1:80", "127.0.0.1:80"])
def test_a_bad_canary_url_is_one_clear_error(url: str) -> None:
    with pytest.raises(UsageError, match="--ssrf-canary"):
        parse(url)


def test_the_canary_records_the_tokens_asked_for_and_cannot_listen_elsewhere() -> None:
    with Canary(f"http://{ADDRESS}:{free_port()}") as canary:
        assert httpx.get(canary.url_for("abc123"), timeout=5).status_code == 404
        httpx.get(canary.url + "/other", timeout=5)
        assert canary.seen() == {"abc123"}
    with pytest.raises(UsageError, match="cannot listen there"), Canary("http://192.0.2.1:9"):
        pass


def test_the_stand_in_fetches_loopback_hosts_only() -> None:
    assert _loopback_url("http://2130706509:81/x") == "http://127.0.0.77:81/x"
    assert _loopback_url("http://127.0.0.1:81/x") == "http://127.0.0.1:81/x"
    for url in ("http://169.254.169.254/latest/", "http://example.com/", "file:///etc/passwd", "data:,x"):
        assert _loopback_url(url) is None, url


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_the_generated_proxy_keeps_the_canary_unfetched(tmp_path: Path, name: str) -> None:
    with Canary(f"http://{ADDRESS}:{free_port()}") as canary:
        res = probe_through(tmp_path, proxy_named(name), load_policy(None), CATALOG,
                            replace(OPTIONS, canary=canary), fetch_media=True)
        assert canary.seen() == frozenset()
    assert not res.findings, [(f.rule, f.detail) for f in res.findings]
    cov = [c for c in res.coverage if c.check == "ssrf-canary"]
    assert cov and all(c.status == "proved" for c in cov if not c.why), cov
    sent = [a for a in res.attempts if a.check == "ssrf-canary"]
    assert {a.reason for a in sent} == {"media-url:denied"}, {a.reason for a in sent}
    assert any("backslash" in a.note for a in sent) and any("decimal" in a.note for a in sent)


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_a_proxy_without_its_media_check_is_caught_where_the_fetch_lands(tmp_path: Path, name: str) -> None:
    with Canary(f"http://{ADDRESS}:{free_port()}") as canary:
        res = probe_through(tmp_path, proxy_named(name), load_policy(None), CATALOG,
                            replace(OPTIONS, canary=canary), mutant="media-check-removed", fetch_media=True)
        fetched = canary.seen()
    assert fetched, "the stand-in fetched nothing"
    found = [f for f in res.findings if f.check == "ssrf-canary"]
    assert found and {f.rule for f in found} == {"VP005"}, [(f.rule, f.title) for f in res.findings]
    assert any("the upstream fetched the URL" in (e.why or "") for f in found for e in f.evidence)


def test_without_the_option_the_check_sends_nothing(tmp_path: Path) -> None:
    res = probe_through(tmp_path, proxy_named("nginx"), load_policy(None), CATALOG, OPTIONS)
    assert not res.findings and not [a for a in res.attempts if a.check == "ssrf-canary"]
    assert not [c for c in res.coverage if c.check == "ssrf-canary"]


def test_the_probe_command_refuses_a_bad_canary_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["probe", "http://127.0.0.1:9", "--inventory", CATALOG, "--ssrf-canary", "http://canary.example:80"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: --ssrf-canary"), err
