"""The CLI run in this process, as a user would run it: the exit code, stdout and stderr."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from scanner.cli.main import main


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No debug re-raise; give back the SIGTERM handler that ``main`` installs."""
    monkeypatch.delenv("VLLM_PERIMETER_DEBUG", raising=False)
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``vllm-perimeter ARGV``: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out = capsys.readouterr()
    code = done.value.code
    return code if isinstance(code, int) else 0, out.out, out.err
