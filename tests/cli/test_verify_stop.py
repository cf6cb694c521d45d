"""``verify --mutate`` stopped by SIGTERM between its runs: the reports of what was proven are
written, the mutant it cut short is "interrupted" (never counted caught: a cut-short run exits
non-zero), no further mutant starts, nothing it started is left, exit 143."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scanner.runtime import nginx

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.nginx
@pytest.mark.timeout(300)
def test_sigterm_during_a_mutant_keeps_the_report_and_counts_no_catch(tmp_path: Path) -> None:
    if nginx.static_build() is None and nginx.debian_build() is None:
        pytest.skip("no NGINX installed")
    out = tmp_path / "verify.json"
    # in this order: key-check-removed (caught in seconds), timeout-raised-x10 (its catch waits
    # out a 10 s timeout: long enough to be cut), rate-dry-run (must never start)
    argv = [sys.executable, "-m", "scanner.cli.main", "verify", "--inventory", "vllm-0.29.0-default",
            "--proxy", "nginx", "--mutate", "--operator", "key-check-removed",
            "--operator", "timeout-raised-x10", "--operator", "rate-dry-run", "--format", "json", "-o", str(out)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if not line or "key-check-removed:" in line:
                break
        assert any("key-check-removed: caught" in s for s in seen), seen
        time.sleep(2.0)   # the timeout mutant's proxy is up and being probed
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-2000:]
    assert stderr.rstrip().endswith("terminated") and "Traceback" not in stderr
    report = json.loads(out.read_text())          # the baseline's report: what was proven is kept
    assert report["findings"] == [] and report["coverage"]
    rows = {op: line for line in stdout.splitlines()
            for op in ("key-check-removed", "timeout-raised-x10", "rate-dry-run") if op in line}
    assert "caught" in rows["key-check-removed"]
    assert "interrupted" in rows["timeout-raised-x10"] and "caught" not in rows["timeout-raised-x10"], stdout
    assert "rate-dry-run" not in rows, stdout     # no mutant starts after the stop
    assert "mutation score 1/1" in stdout, stdout     # the interrupted one is not counted
    time.sleep(0.5)
    assert glob.glob(str(tmp_path / "vllm-perimeter-verify-*")) == []
