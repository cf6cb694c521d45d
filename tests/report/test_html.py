"""The HTML report: self-contained, escaped, and readable in a real browser (headless Chromium)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from scanner.inventory.catalog import load_ref
from scanner.inventory.diff import diff
from scanner.plan.model import Plan
from scanner.probe.interface import Evidence, Finding, ProbeResult, Vantage
from scanner.report import html
from scanner.report.probe_writers import render
from tests.probe import helpers as h

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def _leaky(p: Plan) -> Callable[[Vantage], httpx.AsyncBaseTransport]:
    """A correct perimeter, except that /invocations goes straight to vLLM."""
    good, bad = h.perimeter(p), h.open_upstream(p)

    def factory(v: Vantage) -> httpx.AsyncBaseTransport:
        g, b = good(v), bad(v)

        async def handle(request: httpx.Request) -> httpx.Response:
            t = b if request.url.path == "/invocations" else g
            return await t.handle_async_request(request)

        return httpx.MockTransport(handle)

    return factory


@pytest.fixture(scope="module")
def leaky_result() -> ProbeResult:
    res = h.run(_leaky(h.plan()), "user", "operator", vantages=(Vantage(), Vantage("admin", "127.0.0.3")),
                checks=("matrix",))
    hostile = Finding(id="x", rule="VP999", severity="low", title=HOSTILE, method="GET", path="/x" + HOSTILE,
                      vantage="default", detail=HOSTILE, remediation="none",
                      evidence=(Evidence("GET /x HTTP/1.1", "none", "default", 200, "upstream", "reached"),))
    return dataclasses.replace(res, findings=(*res.findings, hostile))


@pytest.fixture(scope="module")
def page(leaky_result: ProbeResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = diff(load_ref("vllm-0.28.0-everything"), load_ref("vllm-0.29.0-everything"),
             "vllm-0.28.0-everything", "vllm-0.29.0-everything")
    out = tmp_path_factory.mktemp("html") / "report.html"
    out.write_text(html.render_probe(leaky_result, d), encoding="utf-8")
    return out


def test_self_contained_and_escaped(page: Path, leaky_result: ProbeResult) -> None:
    text = page.read_text()
    assert "<script" not in text and "onerror=alert" not in text.replace("onerror=alert(1)&gt;", "")
    assert "&lt;script&gt;" in text
    assert not re.search(r'(src|href)=["\']?(https?:)?//', text), "external asset"
    assert "<link" not in text and "@import" not in text
    assert h.USER_KEY not in text and h.OPER_KEY not in text
    assert render(leaky_result, "html").startswith("<!DOCTYPE html>")


def test_grid_cells(leaky_result: ProbeResult) -> None:
    m = html.matrix(leaky_result)
    # one row per path, one column per method: it fits a screen whatever the credentials
    assert m.methods == ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    by_path = dict(m.rows)
    post = m.methods.index("POST")
    # the safe requests reached vLLM, which refused them itself (400 validation, 405 method): not
    # the colour of a request it served, nor of one the perimeter denied
    assert by_path["/invocations"][post].css == "refused"
    assert {c.css for c in by_path["/invocations"]} == {"refused"}
    served = dataclasses.replace(leaky_result.attempts[0], outcome="reached", status=200, expected="deny",
                                 verdict="failed", layer="upstream")
    assert html.cell_class(served) == "open"
    assert {c.css for c in by_path["/health"]} <= {"denied", "allowed"}
    assert m.count("blocked") == 0
    assert {p for p, cells in m.rows if any(c.css in ("open", "refused") for c in cells)} == {"/invocations"}
    limited = dataclasses.replace(leaky_result.attempts[0], outcome="limited", status=429, expected="allow",
                                  verdict="proved")
    assert html.cell_class(limited) == "limited"
    guarded = dataclasses.replace(leaky_result.attempts[0], outcome="guarded", status=401, expected="deny",
                                  verdict="failed", layer="upstream")
    assert html.cell_class(guarded) == "guarded"
    assert html.cell_class(dataclasses.replace(guarded, verdict="inconclusive")) == "inconclusive"
    assert all("attempts: " in c.title and " expected " in c.title for _p, cells in m.rows for c in cells)


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.environ.get("CI"):
        pytest.fail("chromium not installed; .ci/run should have installed it")
    return found


def _run_chromium(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=90, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def test_chromium_renders_what_a_person_needs(page: Path) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    dom = _run_chromium(binary, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = dom.stdout
    assert re.search(r'<td class="refused" title="\d+ attempts: [^"]*Worst: POST /invocations HTTP/1.1 as none '
                     r'from \w+: expected deny, got 400 \(reached, layer upstream', text)
    findings = text[text.index('<table class="findings">'):]
    findings = findings[:findings.index("</table>")]
    assert "critical" in findings and "/invocations" in findings
    assert "&lt;script&gt;" in text and "<script>alert" not in text  # shown as text, never run
    assert "Upgrade diff: vllm-0.28.0-everything" in text and "/v1/messages/render" in text
    png = page.with_suffix(".png")
    shot = _run_chromium(binary, f"--screenshot={png}", "--window-size=1400,2000", "--hide-scrollbars",
                         page.as_uri())
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000
    keep = os.environ.get("VLLM_PERIMETER_KEEP_SCREENSHOT")
    if keep:
        shutil.copyfile(png, keep)


def test_probe_cli_html_with_diff(leaky_result: ProbeResult, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from scanner.cli.main import cli
    from scanner.probe import result as result_doc

    saved = tmp_path / "r.json"
    saved.write_text(result_doc.to_json(leaky_result))
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["probe", "merge", str(saved), "--format", "html", "--diff",
                                   "vllm-0.29.0-default", "vllm-0.33.0-default", "-o", str(out)],
                             standalone_mode=False)
    assert res.exception is None and res.return_value == 1
    assert "Upgrade diff: vllm-0.29.0-default" in out.read_text() and "/kv_event_sources" in out.read_text()
    res = CliRunner().invoke(cli, ["probe", "merge", str(saved), "--diff", "a", "b"], standalone_mode=False)
    assert "--diff goes with --format html" in str(res.exception)
