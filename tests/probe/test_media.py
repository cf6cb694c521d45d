"""Media rules through the real proxies (issue 10, item 5): NGINX (njs checkMedia, both builds;
1.22's Lua runtime, nginx-lua) and Envoy (Lua media_check) decide every body of the corpus as scanner/policy/media.py reads it,
and the probe proves the bundled policy's media rules (and catches a route without them)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.inputs import load_policy
from scanner.policy import media
from scanner.policy.model import Policy
from scanner.probe.interface import ProbeOptions
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.policy.test_media import CORPUS, RULES
from tests.probe.realproxy import decided, probe_through, proxy_named

CATALOG = "vllm-0.29.0-everything"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("media",))


@pytest.fixture(params=["nginx", "nginx-debian", "nginx-lua", "envoy"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return proxy_named(request.param)


def _with_media(rules: media.MediaRules, rate: bool = True) -> Policy:
    policy = load_policy(None)
    inference = policy.audiences["inference"]
    inference = replace(inference, media=rules,
                        limits=inference.limits if rate else replace(inference.limits, rate=None))
    return replace(policy, audiences={**policy.audiences, "inference": inference})


def test_every_body_of_the_corpus_is_decided_as_python_reads_it(tmp_path: Path, proxy: Proxy) -> None:
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, _with_media(RULES, rate=False), tmp_path, port)
    directory = tmp_path / "proxy"
    proxy.write(s.plan, directory)
    key = next(c.secret for c in s.credentials if c.role == "user")
    public = next(v for v in s.vantages if v.name == "public")
    wrong = []
    with ExitStack() as stack, StandinThread(inventory, "127.0.0.1", port), \
            httpx.Client(base_url=f"http://127.0.0.1:{s.plan.listen.port}", timeout=10,
                         transport=httpx.HTTPTransport(local_address=public.address)) as client:
        loop.start_checked(proxy, s.plan, directory, stack)
        for what, body, want in CORPUS:
            assert media.reason(json.loads(body), RULES) == want, what      # the oracle agrees
            r = client.post("/v1/chat/completions", content=body,
                            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            got = r.headers.get("x-perimeter-reason", "") if r.status_code == 400 else ""
            if got != want or (not want and "x-perimeter-decision" in r.headers):
                wrong.append((what, want, r.status_code, r.headers.get("x-perimeter-reason")))
    assert not wrong, wrong


def test_the_bundled_media_rules_are_proved_through_the_proxy(tmp_path: Path, proxy: Proxy) -> None:
    res = probe_through(tmp_path, proxy, load_policy(None), CATALOG, OPTIONS)
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    subjects = [c for c in res.coverage if c.subject.startswith("media ")]
    assert len(subjects) >= 4 and all(c.status == "proved" for c in subjects), \
        [(c.subject, c.status, c.why) for c in subjects if c.status != "proved"]
    notes = {a.note for a in res.attempts}
    assert any("backslash" in n for n in notes) and any("max_items" in n for n in notes)


def test_listed_domains_are_proved_through_the_proxy(tmp_path: Path) -> None:
    res = probe_through(tmp_path, proxy_named("envoy"), _with_media(RULES), CATALOG, OPTIONS)
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    allowed = decided([a for a in res.attempts if a.note.startswith("a listed host")])
    assert allowed and all(a.verdict == "proved" for a in allowed)


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_a_route_without_its_media_check_is_caught(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), load_policy(None), CATALOG, OPTIONS,
                        mutant="media-check-removed")
    assert any(f.rule == "VP005" and "media" in (f.title + f.detail) for f in res.findings), \
        [(f.rule, f.title) for f in res.findings]


# --- neighbours of the listed domains, without a witness (issue 30, item 5) ------------------------

NO_WITNESS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("media",))


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_a_listed_domain_widened_to_its_parent_is_caught_without_a_witness(tmp_path: Path, name: str) -> None:
    """img.example.org:8443 -> *.example.org:8443 (the first exact entry; scanner/mutate
    core.domain_widened): its siblings and its subdomain now pass the proxy; the probe without
    --witness sees them reach vLLM."""
    res = probe_through(tmp_path, proxy_named(name), _with_media(RULES), CATALOG, NO_WITNESS,
                        mutant="media-domain-widened", witness=False)
    assert res.exit_code() == 1, [(c.subject, c.status, c.why) for c in res.coverage]
    leaked = {a.note.split(" at ")[0] for a in res.attempts if a.verdict == "failed"}
    assert {"neighbour of img.example.org:8443: a sibling", "neighbour of img.example.org:8443: a look-alike "
            "with a prefix"} <= leaked, leaked
    assert "neighbour of img.example.org:8443: its parent" not in leaked, leaked   # a wildcard: not the apex


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_the_neighbours_of_listed_domains_are_refused_without_a_witness(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), _with_media(RULES), CATALOG, NO_WITNESS, witness=False)
    assert res.exit_code() == 0 and not res.findings, [(f.rule, f.title) for f in res.findings]
    near = decided([a for a in res.attempts if a.note.startswith("neighbour of ")])
    assert len({a.note for a in near}) >= 20 and all(a.verdict == "proved" and a.reason == "media-url:host"
                                                     for a in near), near[:3]
