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


# Modules of minutes (probes paced by the policy's real limits), handed out first: pytest-xdist
# (--dist loadfile) gives modules to its workers in collection order, so the longest going
# first lets them end together.
LONG_FIRST = ("tests/verify/test_mutation.py", "tests/cli/test_probe_defaults.py", "tests/cli/test_probe_defaults_envoy.py",
              "tests/test_e2e.py", "tests/probe/test_witness_vllm.py", "tests/probe/test_redteam.py",
              "tests/verify/test_demo.py", "tests/differential/test_identity_corpus.py")


def pytest_configure(config: pytest.Config) -> None:
    # xdist's loadscope/loadfile scheduler sorts modules by their number of tests unless told not
    # to, which would send the one-test modules of minutes above to the end of the run.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}

    def first(item: pytest.Item) -> int:
        try:
            return rank.get(item.path.relative_to(REPO).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=first)   # stable: each module's own order is kept


@pytest.fixture(autouse=True)
def _no_stop_carried_over() -> None:
    """Each test begins with no stop asked for (scanner.stop's state is per process)."""
    from scanner import stop

    stop.reset()


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of the real vLLM 0.29.0 venv. Missing under CI=true is a failure, not a skip."""
    python = _vllm_python()
    if python is None:
        if os.environ.get("CI"):
            pytest.fail("real vLLM venv not found; .ci/run should have provisioned it")
        pytest.skip("real vLLM venv not found (set VLLM_PERIMETER_VLLM_PYTHON)")
    return python


# The "everything" surface of vLLM 0.29.0 (the catalog profile of that name: dev mode,
# runtime LoRA, tokenizer info, profiler, fault tolerance, generation + speech + pooling).
from scanner.inventory.catalog import PROFILES  # noqa: E402

EVERYTHING_ENV = dict(PROFILES["everything"].env)
EVERYTHING_ARGS = PROFILES["everything"].serve_args
EVERYTHING_TASKS = PROFILES["everything"].tasks


@pytest.fixture(scope="session")
def real_vllm(vllm_python: str):  # type: ignore[no-untyped-def]
    """The real vLLM 0.29.0 app, engine-less, on a random loopback port (no --api-key), behind
    the upstream witness (scanner/standin/_witness.py: it records what reaches the app).

    Yields a started :class:`scanner.standin.real.RealVllmServer`; ``.url`` is its base URL.
    """
    from scanner.standin.real import RealVllmServer

    with RealVllmServer(PROFILES["everything"].extraction(vllm_python), witness=True) as server:
        yield server


@pytest.fixture(scope="session")
def everything_inventory(vllm_python: str):  # type: ignore[no-untyped-def]
    """Inventory of that same surface, extracted by the tool from the real app."""
    from scanner.inventory.vllm_app import extract

    return extract(PROFILES["everything"].extraction(vllm_python))[0]
