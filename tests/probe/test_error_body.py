"""What the client sees of vLLM's errors (issue 19, item 5): a 5xx body from the upstream never
reaches the client (vLLM's error text has leaked heap addresses: CVE-2026-22778, CVE-2026-54236);
the perimeter answers its own JSON error with the request id, the status kept. A 4xx (vLLM's
validation answers) passes byte for byte.

The witness answers ``vp_answer=<status>`` itself with a body holding a marker
(scanner/witness_asgi.py, error_body); the upstream check's "error body" aspect sends a 500 and
a 400 through every allowed HTTP route. Hand weakenings of the generated configs (NGINX: the
interception removed, or the 5xx pages dropped so the server's 4xx pages intercept; Envoy: the
custom_response filter removed) make the probe exit 1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.inputs import load_policy
from scanner.plan.model import Decision
from scanner.probe import forms
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from scanner.witness_asgi import LEAK_MARKER
from tests.probe.realproxy import Edit, probe_edited, proxy_named, sub, unpaced

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300, checks=("upstream",))
NGINX_HTTP, ENVOY = "perimeter-http.conf", "envoy.yaml"


def _probe(tmp_path: Path, proxy: Proxy, edit: Edit | None = None) -> ProbeResult:
    return probe_edited(tmp_path, proxy, OPTIONS, edit, CATALOG)


def _drop_custom_response(conf: Path) -> None:
    f = conf / ENVOY
    lines = f.read_text().split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.strip() == "- name: perimeter.upstream_errors")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines))
               if lines[i].strip().startswith("- name:") and len(lines[i]) - len(lines[i].lstrip()) == indent)
    f.write_text("\n".join(lines[:start] + lines[end:]))


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_5xx_bodies_are_replaced_and_4xx_pass_on_every_route(tmp_path: Path, name: str) -> None:
    res = _probe(tmp_path, proxy_named(name))
    assert res.findings == (), [(f.rule, f.title) for f in res.findings]
    subjects = [c for c in res.coverage if c.subject.startswith("error body ")]
    assert len(subjects) > 20 and {c.status for c in subjects} == {"proved"}, subjects
    last = {(a.subject, a.note): a for a in res.attempts if a.note.startswith("the upstream answers ")}
    # a 500 and a 400 per route and way of forwarding it (the last try of each)
    ways = {f"error body {d.method} {d.path}": max(1, len(forms.of(d))) for d in res_plan(tmp_path)}
    assert len(last) == 2 * sum(ways[c.subject] for c in subjects)
    for a in last.values():
        assert a.verdict == "proved", (a.path, a.note, a.why)
        if a.status == 500:
            assert LEAK_MARKER not in a.answer_body and a.decision == "error"
            assert a.upstream is not None and (a.upstream.header("x-request-id") or "-") in a.answer_body
        else:
            assert a.status == 400 and LEAK_MARKER in a.answer_body and not a.decision


def res_plan(tmp_path: Path) -> list[Decision]:
    (tmp_path / "plan").mkdir()
    return list(loop.setup(load_ref(CATALOG), load_policy(None), tmp_path / "plan", 9).plan.allowed)


# the interception removed where bodies are forwarded as sent (NGINX's <up>_checked locations)
# only: the route's other ways of forwarding keep it, so only a body of that form shows it
ONE_WAY = r"(\n    location @perimeter_up_\w+_checked \{[^}]*?)proxy_intercept_errors on;"

WEAKENINGS: dict[str, tuple[str, Edit, str]] = {
    "nginx-no-intercept-where-bodies-pass": ("nginx", sub(NGINX_HTTP, ONE_WAY, r"\1proxy_intercept_errors off;"),
                                             "VP018"),
    # the interception removed: vLLM's 5xx text reaches the client
    "nginx-no-intercept": ("nginx", sub(NGINX_HTTP, r"\n *proxy_intercept_errors on;", ""), "VP018"),
    "nginx-debian-no-intercept": ("nginx-debian", sub(NGINX_HTTP, r"\n *proxy_intercept_errors on;", ""), "VP018"),
    # the location's own error pages dropped: the server's (4xx too) intercept every answer
    "nginx-server-pages-intercept": (
        "nginx", sub(NGINX_HTTP, r"(\n *proxy_intercept_errors on;)(\n *error_page [^\n]+)+", r"\1"), "VP006"),
    "envoy-no-custom-response": ("envoy", _drop_custom_response, "VP018"),
    # retried on a 5xx: one request reaches vLLM four times (its work done again each time)
    "envoy-retries-5xx": ("envoy", sub(ENVOY, r'retry_on: "connect-failure,reset", num_retries: 1',
                                       'retry_on: "connect-failure,reset,5xx", num_retries: 3'), "VP015"),
}


@pytest.mark.parametrize("weakening", sorted(WEAKENINGS))
def test_hand_weakenings_fail_the_probe(tmp_path: Path, weakening: str) -> None:
    proxy, edit, rule = WEAKENINGS[weakening]
    res = _probe(tmp_path, proxy_named(proxy), edit)
    assert res.exit_code() == 1
    assert rule in {f.rule for f in res.findings}, [(f.rule, f.title) for f in res.findings]


def test_without_a_witness_the_error_body_is_not_applicable(tmp_path: Path) -> None:
    inventory = load_ref(CATALOG)
    port = free_port()
    s = loop.setup(inventory, unpaced(load_policy(None)), tmp_path, port)
    proxy = proxy_named("nginx")
    proxy.write(s.plan, tmp_path / "proxy")
    with StandinThread(inventory, "127.0.0.1", port):
        res = loop.proxy_run(s, proxy, tmp_path / "proxy", replace(OPTIONS, max_time=120), "").result
    subjects = [c for c in res.coverage if c.subject.startswith("error body ")]
    assert subjects and {c.status for c in subjects} == {"not-applicable"}, subjects
