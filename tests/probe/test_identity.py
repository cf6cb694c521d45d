"""What reaches vLLM, proven on every route (issue 18, item 3): the Host vLLM receives is the
plan's (never the client's, nor an absolute-form target's), X-Forwarded-For is exactly the
client address, X-Request-Id the proxy's own; each forwarding header alone and single-valued
never opens a network-restricted route; a path parameter with CR, LF or NUL never reaches vLLM.

Each weakening is a reviewer's hand edit of the generated config (text, not the project's
mutation operators), probed through the real proxy in front of the stand-in and its witness:
the unmodified configs give no finding, every edit makes the probe exit 1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.runtime.proxy import Proxy
from tests.probe.realproxy import Edit, probe_edited, proxy_named, sub

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300)
TEMPLATE = "/v1/responses/{response_id}"


def _probe(tmp_path: Path, proxy: Proxy, edit: Edit | None, checks: tuple[str, ...],
           witness: bool = True) -> ProbeResult:
    """The generated config (edited by hand) in front of the stand-in, probed with ``checks``."""
    return probe_edited(tmp_path, proxy, replace(OPTIONS, checks=checks), edit, CATALOG, witness)


def _both(*edits: Edit) -> Edit:
    def edit(conf: Path) -> None:
        for e in edits:
            e(conf)
    return edit


def _dollar_anchor(conf: Path) -> None:
    """The template route's location and capture regexes end in ``$`` instead of ``\\z``."""
    f = conf / "perimeter-http.conf"
    lines = f.read_text().split("\n")
    out = [ln.replace('\\z"', '$"') if "/v1/responses/(" in ln and "/cancel" not in ln else ln for ln in lines]
    assert out != lines
    f.write_text("\n".join(out))


NGINX_HTTP, NGINX_PROXY, ENVOY = "perimeter-http.conf", "perimeter-proxy.conf", "envoy.yaml"
WEAKENINGS: dict[str, tuple[str, Edit, tuple[str, ...], str]] = {
    # name: (proxy, edit, checks, a rule the finding must have)
    "nginx-host-from-client": ("nginx", sub(NGINX_HTTP, r'proxy_set_header Host "[^"]+";',
                                             "proxy_set_header Host $http_host;"), ("upstream",), "VP013"),
    "nginx-dollar-anchor": ("nginx", _dollar_anchor, ("upstream",), "VP004"),
    "nginx-xff-appended": ("nginx", sub(NGINX_PROXY, r"X-Forwarded-For \$remote_addr;",
                                         "X-Forwarded-For $proxy_add_x_forwarded_for;"), ("upstream",), "VP013"),
    "nginx-request-id-from-client": ("nginx", sub(NGINX_PROXY, r"X-Request-Id \$request_id;",
                                                   "X-Request-Id $http_x_request_id;"), ("upstream",), "VP015"),
    "nginx-real-ip-from-true-client-ip": (
        "nginx", sub(NGINX_HTTP, r"    server_name _;\n", "    server_name _;\n    set_real_ip_from 0.0.0.0/0;\n"
                      "    real_ip_header True-Client-IP;\n", count=1), ("spoof",), "VP003"),
    "nginx-debian-dollar-anchor": ("nginx-debian", _dollar_anchor, ("upstream",), "VP004"),
    "nginx-debian-real-ip-from-x-client-ip": (
        "nginx-debian", sub(NGINX_HTTP, r"    server_name _;\n", "    server_name _;\n    set_real_ip_from "
                             "0.0.0.0/0;\n    real_ip_header X-Client-IP;\n", count=1), ("spoof",), "VP003"),
    "envoy-client-address-from-xff": ("envoy", _both(sub(ENVOY, "direct_remote_ip", "remote_ip"),
                                                     sub(ENVOY, "use_remote_address: true", "use_remote_address: false")),
                                      ("spoof",), "VP003"),
    "envoy-host-from-client": ("envoy", sub(ENVOY, r"\n *host_rewrite_literal: [^\n]+", ""), ("upstream",),
                               "VP013"),
    "envoy-xff-appended": ("envoy", _both(sub(ENVOY, r'\n *- "x-forwarded-for"', ""),
                                          sub(ENVOY, r"(key: x-forwarded-for, [^\n]+\n *append_action: )\w+",
                                               r"\1APPEND_IF_EXISTS_OR_ADD")), ("upstream",), "VP013"),
    "envoy-request-id-from-client": ("envoy", sub(ENVOY, r"\n( *)stat_prefix: perimeter\n",
                                                   r"\n\1stat_prefix: perimeter\n\1preserve_external_request_id: true\n",
                                                   count=1), ("upstream",), "VP013"),
}


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "envoy"])
def test_unmodified_configs_give_no_finding(tmp_path: Path, name: str) -> None:
    res = _probe(tmp_path, proxy_named(name), None, ("upstream", "spoof"))
    assert res.findings == (), [(f.rule, f.title) for f in res.findings]
    assert res.exit_code() == 0
    control = [c for c in res.coverage if c.subject.startswith("control characters")]
    assert control and {c.status for c in control} == {"proved"}, control
    raw_lf = [a for a in res.attempts if a.note == "raw LF in a parameter" and a.verdict == "proved"]
    assert raw_lf and all(a.upstream is None for a in raw_lf)
    hosts = {a.upstream.header("host") for a in res.attempts if a.upstream is not None}
    assert len(hosts) == 1 and None not in hosts, hosts


@pytest.mark.parametrize("weakening", sorted(WEAKENINGS))
def test_hand_weakenings_fail_the_probe(tmp_path: Path, weakening: str) -> None:
    proxy, edit, checks, rule = WEAKENINGS[weakening]
    res = _probe(tmp_path, proxy_named(proxy), edit, checks)
    assert res.exit_code() == 1
    assert rule in {f.rule for f in res.findings}, [(f.rule, f.title) for f in res.findings]


def test_dollar_anchor_is_caught_without_a_witness(tmp_path: Path) -> None:
    res = _probe(tmp_path, proxy_named("nginx"), _dollar_anchor, ("upstream",), witness=False)
    assert res.exit_code() == 1
    found = [f for f in res.findings if f.rule == "VP004"]
    assert found and all(f.path == TEMPLATE for f in found), [(f.rule, f.title) for f in res.findings]
