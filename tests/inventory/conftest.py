"""Helpers for inventory tests: run the CLI in-process and capture what it printed."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scanner.cli.main import main

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class CliResult:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def assert_one_line_error(self, rc: int) -> str:
        """Exit ``rc``, stderr exactly one ``error:`` line, no traceback, nothing on stdout."""
        assert self.rc == rc, (self.rc, self.err)
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("error: "), self.err
        assert "Traceback" not in self.err
        assert self.out == ""
        return lines[0]


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    def run(*args: str) -> CliResult:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        captured = capsys.readouterr()
        code = exc.value.code
        return CliResult(code if isinstance(code, int) else 0, captured.out, captured.err)

    return run
