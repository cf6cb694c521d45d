"""Rate, concurrency and token limits proven at their value, and a bucket per principal (issue 18,
item 3): the generated configs weakened by hand, as a reviewer would (edits of the generated text,
not scanner/mutate.py's operators), must fail the probe with the right rule; the unmodified ones
give no finding. Real proxies in front of the stand-in and its witness, the bundled policy's own
limits, two keys per role."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.inputs import load_policy
from scanner.policy.load import loads
from scanner.policy.model import Policy, Rate
from scanner.probe.checks.load import capacity
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.standin.serve import StandinThread
from scanner.verify import loop
from tests.probe.realproxy import proxy_named

CATALOG = "vllm-0.29.0-default"
DEFAULT = Path(__file__).parents[2] / "policies" / "vllm-default.yaml"
LOAD = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("rate", "concurrency"))
TOKENS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("token-budget",))
Edit = Callable[[str], str]


def run(tmp_path: Path, proxy: str, options: ProbeOptions, edit: Edit | None = None,
        policy: Policy | None = None, file: str = "") -> ProbeResult:
    """The plan's config for ``proxy``, its main file (or ``file``) changed by ``edit``, probed
    through."""
    p = proxy_named(proxy)
    inventory, port = load_ref(CATALOG), free_port()
    s = loop.setup(inventory, policy or load_policy(None), tmp_path, port, keys_per_role=2)
    written = p.write(s.plan, tmp_path / "proxy")
    if edit is not None:
        main = written / (file or ("envoy.yaml" if p.kind == "envoy" else "perimeter-http.conf"))
        before = main.read_text()
        main.write_text(edit(before))
        assert main.read_text() != before, "the edit changed nothing"
    with StandinThread(inventory, "127.0.0.1", port) as standin:
        return loop.proxy_run(s, p, tmp_path / "proxy", options, standin.url).result


def times(n: int, pattern: str) -> Edit:
    """Every number captured by ``pattern`` (one group) multiplied by ``n``."""
    def edit(text: str) -> str:
        def times_n(m: re.Match[str]) -> str:
            start, end = m.span(1)[0] - m.start(), m.span(1)[1] - m.start()
            return m.group(0)[:start] + str(int(m.group(1)) * n) + m.group(0)[end:]
        return re.sub(pattern, times_n, text)
    return edit


def coverage(result: ProbeResult, check: str) -> dict[str, tuple[str, str]]:
    return {c.subject: (c.status, c.why) for c in result.coverage if c.check == check}


def rules(result: ProbeResult) -> set[tuple[str, str, str]]:
    """(rule, check, title without the route) of each finding."""
    return {(f.rule, f.check, f.title.split(": ")[0]) for f in result.findings}


# --- the capacity the plan gives (no proxy) ------------------------------------------------------

def test_capacity_follows_the_generated_buckets() -> None:
    # NGINX: burst + 1 at once; Envoy: max_tokens = max(burst, one fill); both refill at the rate
    assert capacity(Rate(10, 20), 0.0) == pytest.approx(21 + 0.2 + 1)
    assert capacity(Rate(10, 20), 1.0) == pytest.approx(21 + 10 + 0.2 + 1)
    assert capacity(Rate(50, 10), 0.0) == pytest.approx(50 + 1 + 1)        # Envoy's bucket holds one fill
    assert capacity(Rate(0.5, 1), 2.0) == pytest.approx(2 + 1 + 0.01 + 1)  # 30r/m


# --- the unmodified configs ----------------------------------------------------------------------

@pytest.mark.parametrize("proxy", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_the_generated_limits_hold_at_their_value_and_per_principal(tmp_path: Path, proxy: str) -> None:
    result = run(tmp_path, proxy, LOAD)
    assert not result.findings, [(f.rule, f.title, f.detail) for f in result.findings]
    for check, zones in (("rate", 4), ("concurrency", 3)):
        cov = coverage(result, check)
        assert cov and all(status == "proved" for status, _why in cov.values()), cov
        # inference, service, operator keyed per principal; monitoring (rate only) per address
        others = [k for k in cov if k.endswith(("other principal", "other address"))]
        assert len(others) == zones, others


# --- rate ------------------------------------------------------------------------------------------

RATE_ZONE = r"limit_req_zone \$perimeter_principal zone=\w+:1m rate=(\d+)r/s"
NGINX_RATE: dict[str, Edit] = {
    "rate x10": times(10, RATE_ZONE),
    "burst x10": times(10, r"limit_req zone=\w+ burst=(\d+)"),
    "dry run": lambda t: t.replace("    limit_req_status 429;", "    limit_req_status 429;\n    limit_req_dry_run on;"),
    "zone keyed by address": lambda t: t.replace("limit_req_zone $perimeter_principal",
                                                 "limit_req_zone $binary_remote_addr"),
}
ENVOY_RATE: dict[str, Edit] = {
    "rate x10": times(10, r"token_bucket: \{max_tokens: \d+, tokens_per_fill: (\d+), fill_interval: 1s\}"),
    "burst x10": times(10, r"token_bucket: \{max_tokens: (\d+), tokens_per_fill: \d+, fill_interval: 1s\}"),
    "shadow (filter_enforced 0)": lambda t: t.replace(
        "filter_enforced: {default_value: {numerator: 100,", "filter_enforced: {default_value: {numerator: 0,"),
    # without its per-principal descriptors, every principal spends the filter's one bucket
    "one bucket for all principals": lambda t: re.sub(
        r"              # one bucket per principal\n              rate_limits:\n(?:              [ -].*\n)+", "", t),
}


@pytest.mark.parametrize(("proxy", "name"), [*(("nginx", n) for n in NGINX_RATE),
                                             *(("envoy", n) for n in ENVOY_RATE)])
def test_a_weakened_rate_limit_fails_the_probe(tmp_path: Path, proxy: str, name: str) -> None:
    edit = (NGINX_RATE if proxy == "nginx" else ENVOY_RATE)[name]
    result = run(tmp_path, proxy, LOAD, edit)
    assert result.exit_code() == 1, coverage(result, "rate")
    titles = {t for r, c, t in rules(result) if r == "VP005" and c == "rate"}
    shared = "address" in name or "one bucket" in name
    assert titles == ({"rate limit zone shared"} if shared else {"rate above the plan"}), rules(result)


# --- concurrency -------------------------------------------------------------------------------------

CONCURRENCY: dict[str, dict[str, Edit]] = {
    "nginx": {"x2": times(2, r"limit_conn perimeter_conn_\d+ (\d+);"),
              "keyed by address": lambda t: t.replace("limit_conn_zone $perimeter_principal",
                                                      "limit_conn_zone $binary_remote_addr")},
    # the circuit breaker's thresholds raised (max_requests alone: max_connections still holds
    # HTTP/1.1 to the limit, rightly not a finding)
    "envoy": {"x2": lambda t: times(2, r"max_connections: (\d+)")(times(2, r"max_requests: (\d+)")(t)),
              "x10": lambda t: times(10, r"max_connections: (\d+)")(times(10, r"max_requests: (\d+)")(t))},
}


@pytest.mark.parametrize(("proxy", "name"), [(p, n) for p, edits in CONCURRENCY.items() for n in edits])
def test_a_weakened_concurrency_limit_fails_the_probe(tmp_path: Path, proxy: str, name: str) -> None:
    result = run(tmp_path, proxy, LOAD, CONCURRENCY[proxy][name])
    assert result.exit_code() == 1, coverage(result, "concurrency")
    titles = {t for r, c, t in rules(result) if r == "VP005" and c == "concurrency"}
    assert titles == ({"concurrency limit zone shared"} if "address" in name else {"concurrency above the plan"}), \
        rules(result)


# --- token budgets -------------------------------------------------------------------------------------

def token_policy() -> Policy:
    """8000 a minute, the default bucket of 2000 (the probe's requests of 166 are whole requests)."""
    return loads(DEFAULT.read_text().replace("      concurrency: 16\n",
                                             "      concurrency: 16\n      tokens_per_minute: 8000\n", 1))


TOKEN_EDITS: dict[str, Edit] = {
    # the bucket's capacity and its refill (perimeter-rules.json: "t1":{"by":"principal","cap":2000,"limit":8000})
    "nginx": lambda t: times(10, r'"cap":(\d+),"limit":\d+')(times(10, r'"cap":\d+,"limit":(\d+)')(t)),
    "envoy": times(10, r"token_bucket: \{max_tokens: (\d+), tokens_per_fill: \d+, fill_interval: 60s\}"),
}


@pytest.mark.parametrize("proxy", ["nginx", "envoy"])
def test_a_token_budget_raised_x10_fails_the_probe(tmp_path: Path, proxy: str) -> None:
    p = proxy_named(proxy)
    if proxy == "nginx" and getattr(p, "build", None) is not None and p.build.njs_module:  # type: ignore[attr-defined]
        pytest.skip("needs the static NGINX build (njs >= 0.8)")
    result = run(tmp_path, proxy, TOKENS, TOKEN_EDITS[proxy], token_policy(),
                 file="perimeter-rules.json" if proxy == "nginx" else "")
    assert result.exit_code() == 1, coverage(result, "token-budget")
    assert {t for r, c, t in rules(result) if r == "VP005"} == {"token budget not enforced"}, rules(result)
