"""inventory vllm: clear one-line errors when vLLM is missing, too old or of unknown layout.

No real vLLM needed: a fake ``vllm`` package on PYTHONPATH stands in for the bad cases.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.inventory.conftest import CliResult


def fake_vllm(root: Path, version: str) -> Path:
    pkg = root / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n", encoding="utf-8")
    return root


def test_missing_interpreter(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    line = run_cli("inventory", "vllm", "--python", str(tmp_path / "bin" / "python"),
                   "--", "--model", "m").assert_one_line_error(2)
    assert "python interpreter not found" in line


def test_python_without_vllm(run_cli: Callable[..., CliResult]) -> None:
    line = run_cli("inventory", "vllm", "--python", sys.executable, "--isolated-env",
                   "--", "--model", "m").assert_one_line_error(2)
    assert "has no vllm package installed" in line


def test_version_outside_supported_range(run_cli: Callable[..., CliResult], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm(tmp_path, "0.20.1")))
    line = run_cli("inventory", "vllm", "--python", sys.executable,
                   "--", "--model", "m").assert_one_line_error(2)
    assert "vLLM 0.20.1 is outside the supported range 0.28-0.33" in line
    assert "--allow-unsupported" in line


def test_unknown_layout_fails_clearly(run_cli: Callable[..., CliResult], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm(tmp_path, "0.31.0")))
    line = run_cli("inventory", "vllm", "--python", sys.executable,
                   "--", "--model", "m").assert_one_line_error(2)
    assert "vLLM 0.31.0 has a layout this tool does not know" in line
    assert "vllm.entrypoints.launchers.app" in line


def test_bad_env_pair(run_cli: Callable[..., CliResult]) -> None:
    line = run_cli("inventory", "vllm", "--env", "NOEQUALS", "--", "--model", "m") \
        .assert_one_line_error(2)
    assert "--env expects K=V" in line


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    """The installed entry point, as a user runs it: one line on stderr, exit 2."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "scanner.cli.main", "inventory", "diff",
                           str(bad), "vllm-0.29.0-default"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"error: {bad}:1: not valid JSON: "
                                                "Expecting property name enclosed in double quotes"]
