"""``probe`` with its default flags finishes against the generated Envoy (see
test_probe_defaults.py, which runs NGINX: a module each, so two test workers run them at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_probe_defaults import finish_clean

CASES = [
    pytest.param("vllm-0.29.0-default", marks=[pytest.mark.envoy, pytest.mark.timeout(900)]),
    pytest.param("vllm-0.29.0-everything", marks=[pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(1800)]),
]


@pytest.mark.parametrize("catalog", CASES)
def test_default_flags_finish_clean_through_envoy(tmp_path: Path, catalog: str) -> None:
    finish_clean(tmp_path, "envoy", catalog)
