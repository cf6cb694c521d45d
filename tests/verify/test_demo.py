"""The README's first command: the whole loop on loopback, zero findings through the proxy."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanner.runtime import nginx
from scanner.verify import demo


@pytest.fixture(scope="module")
def private_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary directory of this module's own for what the demo creates (tempfile.tempdir)."""
    root = tmp_path_factory.mktemp("demo-tmp")
    saved, tempfile.tempdir = tempfile.tempdir, str(root)
    yield root
    tempfile.tempdir = saved


@pytest.fixture(scope="module")
def ran(private_tmp: Path) -> tuple[demo.DemoResult, list[str]]:
    """One demo run for the tests of this module (each run takes most of a minute)."""
    if nginx.static_build() is None and nginx.debian_build() is None:
        pytest.skip("no NGINX installed")
    messages: list[str] = []
    return demo.run(messages.append), messages


def test_demo_closed_loop(ran: tuple[demo.DemoResult, list[str]], private_tmp: Path) -> None:
    result, messages = ran
    assert [m[:3] for m in messages] == ["1/4", "2/4", "3/4", "4/4"]
    proxied = result.proxied
    assert not proxied.unreachable, proxied.reason
    assert proxied.findings == (), [f"{f.rule} {f.method} {f.path} {f.vantage}" for f in proxied.findings]
    assert len(proxied.attempts) > 5000 and set(proxied.vantages) == {"public", "monitoring", "monitoring-2", "admin", "outside"}
    # every subject of every check proved (or not applicable with a reason): nothing unproven
    assert proxied.coverage and all(c.status in ("proved", "not-applicable") for c in proxied.coverage)
    assert {c.check for c in proxied.coverage if c.status == "proved"} >= {
        "matrix", "bypass", "spoof", "limits", "rate", "concurrency", "upstream"}
    # vLLM's own --api-key alone: the routes outside its guarded prefixes are open.
    open_routes = {(f.method, f.path) for f in result.bare.findings if f.rule == "VP001"}
    for route in [("POST", "/invocations"), ("POST", "/pause"), ("POST", "/collective_rpc"),
                  ("POST", "/adapters"), ("GET", "/docs"), ("GET", "/openapi.json"), ("POST", "/tokenize")]:
        assert route in open_routes, route
    # Inside vLLM's guarded prefixes only OPTIONS gets through (vLLM skips its key check for it).
    for f in result.bare.findings:
        if f.rule == "VP001" and f.path.startswith(("/v1/", "/v2/", "/inference/")):
            assert f.evidence and all(e.request_line.startswith("OPTIONS ") for e in f.evidence), f
    assert result.state_changes_bare == 0
    assert _verify_processes(private_tmp) == set()   # NGINX, the stand-in and the witness are gone


def test_demo_cli_prints_report_and_exit_code(ran: tuple[demo.DemoResult, list[str]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The command renders the run (the same run as above: the loop itself is tested there)."""
    from click.testing import CliRunner

    from scanner.cli.main import cli

    monkeypatch.setattr(demo, "run", lambda say: ran[0])
    res = CliRunner().invoke(cli, ["demo"], standalone_mode=False)
    assert res.exception is None, res.output
    assert res.return_value == 0
    assert "perimeter verdict: PASS" in res.output
    assert "vp_" not in res.output


def _verify_processes(root: Path) -> set[str]:
    """Processes whose command line names a verify (or demo) working directory under ``root``, the
    temporary directory of one run of this module (other runs on the machine, e.g. a parallel test
    worker's, have theirs elsewhere)."""
    found = subprocess.run(["pgrep", "-f", f"{root}/vllm-perimeter-verify-"], capture_output=True, text=True,
                           check=False)
    return set(found.stdout.split())


@pytest.mark.parametrize(("signum", "code"), [(2, 130), (15, 143)])   # SIGINT (Ctrl-C), SIGTERM
def test_demo_cleans_up_when_stopped(signum: int, code: int, tmp_path: Path) -> None:
    import glob
    import os
    import signal
    import time

    if nginx.static_build() is None and nginx.debian_build() is None:
        pytest.skip("no NGINX installed")
    proc = subprocess.Popen([sys.executable, "-m", "scanner.cli.main", "demo"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until NGINX and the stand-in are up and probing
        line = proc.stderr.readline()
        if line.startswith("3/4") or not line:
            break
    time.sleep(1.0)
    assert _verify_processes(tmp_path), "the demo's proxy runs from its working directory under TMPDIR"
    proc.send_signal(signum)
    proc.communicate(timeout=60)
    assert proc.returncode == code
    assert glob.glob(os.path.join(tmp_path, "vllm-perimeter-verify-*")) == []
    left = _verify_processes(tmp_path)
    for _ in range(50):                            # a process group stopped: gone within 5 s
        if not left:
            break
        time.sleep(0.1)
        left = _verify_processes(tmp_path)
    assert left == set()                           # nothing this run started is left running
