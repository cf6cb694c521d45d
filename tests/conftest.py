"""Shared fixtures: where the real vLLM lives, and loopback helpers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/vllm-perimeter/venvs/vllm-0.29.0/bin/python"


def _vllm_python() -> str | None:
    python = os.environ.get("VLLM_PERIMETER_VLLM_PYTHON") or str(DEFAULT_VLLM_PYTHON)
    if not Path(python).exists():
        return None
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True, text=True, check=False, timeout=60,
    )
    return python if probe.returncode == 0 else None


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of the real vLLM 0.29.0 venv. Missing under CI=true is a failure, not a skip."""
    python = _vllm_python()
    if python is None:
        if os.environ.get("CI"):
            pytest.fail("real vLLM venv not found; .ci/run should have provisioned it")
        pytest.skip("real vLLM venv not found (set VLLM_PERIMETER_VLLM_PYTHON)")
    return python
