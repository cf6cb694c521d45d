"""``vllm-perimeter witness export|secret`` and ``probe --witness-secret`` (issue 30): the file vLLM
loads needs nothing but the standard library; a secret is never printed; bad input is one line and
exit 2. In process through ``scanner.cli.main.main``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.inprocess import in_process, run  # noqa: F401  (in_process: the fixture)

pytestmark = pytest.mark.usefixtures("in_process")


def test_export_writes_a_module_that_imports_with_the_standard_library_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(capsys, "witness", "export", str(tmp_path / "site"))
    assert code == 0 and "--middleware vllm_perimeter_witness.Witness" in err
    # -I -S: no site-packages, no PYTHONPATH, no current directory: only the file and the stdlib
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import vllm_perimeter_witness as w; "
             "assert 'scanner' not in sys.modules; print(w.Witness.__name__)")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "Witness", done.stderr


def test_secret_is_written_0600_and_never_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "witness.secret"
    code, out, err = run(capsys, "witness", "secret", "--out", str(path))
    secret = path.read_text().strip()
    assert code == 0 and len(secret) >= 32 and os.stat(path).st_mode & 0o777 == 0o600
    assert secret not in out + err


@pytest.mark.parametrize("case", ["no-witness", "readable-by-others", "short"])
def test_bad_witness_secret_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   case: str) -> None:
    path = tmp_path / "witness.secret"
    path.write_text("short\n" if case == "short" else "w" * 43 + "\n")
    path.chmod(0o644 if case == "readable-by-others" else 0o600)
    witness = [] if case == "no-witness" else ["--witness", "http://127.0.0.1:9"]
    code, out, err = run(capsys, "probe", "http://127.0.0.1:9", "--inventory", "vllm-0.29.0-default",
                         *witness, "--witness-secret", str(path), "-q")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "w" * 43 not in out + err
