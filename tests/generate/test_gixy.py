"""Static analysis: gixy-ng finds nothing in the generated NGINX config.

Run on the golden files and on a config generated for every bundled catalog with the bundled
policy, with gixy-ng's own defaults (every check, every severity). Nothing is suppressed: each
finding gixy-ng 0.2.59 reported was fixed in the config (see docs/generate.md, "Static
analysis"). The last tests show the run can fail: gixy really reads the included files, and
each fix is what keeps its check quiet (put back, the finding returns).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from scanner.cli.main import cli
from scanner.inventory import catalog
from tests.generate.nginx_harness import GOLDEN

GOLDEN_DIR = GOLDEN / "default"


def gixy() -> str:
    here = Path(sys.executable).parent / "gixy"
    found = str(here) if here.exists() else shutil.which("gixy")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("gixy-ng is missing; .ci/run installs it with the dev extras")
        pytest.skip("gixy-ng is not installed (pip install -e '.[dev]')")
    return found


def findings(main: Path) -> list[dict[str, Any]]:
    """gixy-ng's findings on ``main`` (and what it includes); fails if a file went unread."""
    run = subprocess.run([gixy(), "-d", "-f", "json", str(main)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert "Configuration error" not in run.stderr, run.stderr[-2000:]
    parsed = {Path(p).resolve() for p in re.findall(r"Parse file: (\S+)", run.stderr)}
    for conf in main.parent.glob("*.conf"):
        assert conf.resolve() in parsed, f"gixy did not read {conf.name}"
    result: list[dict[str, Any]] = json.loads(run.stdout)
    assert run.returncode == (1 if result else 0), (run.returncode, run.stderr[-2000:])
    return result


def summary(found: list[dict[str, Any]]) -> list[str]:
    return [f"{f['severity']} {f['plugin']} {Path(f['file']).name}:{f['line']}: {f['reason']}" for f in found]


def test_golden_config_has_no_findings() -> None:
    assert summary(findings(GOLDEN_DIR / "nginx.conf")) == []


@pytest.mark.parametrize("name", catalog.names())
def test_generated_config_of_every_catalog_has_no_findings(name: str, tmp_path: Path) -> None:
    out = tmp_path / name
    result = CliRunner().invoke(cli, ["generate", "nginx", "--inventory", name, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert summary(findings(out / "nginx.conf")) == []


# --- the check can fail ----------------------------------------------------------------------

def _golden_copy(tmp_path: Path, edit: tuple[str, str] | None = None, count: int = 1) -> Path:
    directory = tmp_path / "conf"
    shutil.copytree(GOLDEN_DIR, directory)
    if edit is not None:
        http = directory / "perimeter-http.conf"
        text = http.read_text(encoding="utf-8")
        assert edit[0] in text, edit[0]
        http.write_text(text.replace(edit[0], edit[1], count), encoding="utf-8")
    return directory / "nginx.conf"


def _plugins(main: Path) -> set[str]:
    return {f["plugin"] for f in findings(main)}


def test_an_evil_if_in_an_included_file_is_found(tmp_path: Path) -> None:
    evil = ("        set $perimeter_reason not-allowlisted;\n",
            "        if ($http_x_debug) { set $perimeter_reason debug; }\n"
            "        set $perimeter_reason not-allowlisted;\n")
    assert _plugins(_golden_copy(tmp_path, evil)) == {"if_is_evil"}


_CAPTURE = re.compile(r'        if \(\$perimeter_path !~ "[^"]*"\) \{ return 500; \}\n        rewrite \^ \$perimeter_fwd break;\n'
                      r"        proxy_pass http://vllm_upstream;")


def _first_template_forward() -> str:
    text = (GOLDEN_DIR / "perimeter-http.conf").read_text(encoding="utf-8")
    m = _CAPTURE.search(text)
    assert m is not None
    return m.group(0)


@pytest.mark.parametrize("replacement,expected", [
    # the form gixy-ng flagged: the saved $uri straight into proxy_pass
    ("        proxy_pass http://vllm_upstream$perimeter_path$is_args$args;",
     {"http_splitting", "ssrf", "missing_resolver"}),
    # the rewrite without the template's capture: the saved $uri could hold a newline
    ("        rewrite ^ $perimeter_path break;\n        proxy_pass http://vllm_upstream;", {"http_splitting"}),
])
def test_without_the_template_capture_the_finding_returns(tmp_path: Path, replacement: str,
                                                          expected: set[str]) -> None:
    main = _golden_copy(tmp_path, (_first_template_forward(), replacement))
    assert _plugins(main) == expected


def test_js_content_inside_if_is_found(tmp_path: Path) -> None:
    old = "{ rewrite ^ /@perimeter/body last; }"
    assert _plugins(_golden_copy(tmp_path, (old, "{ js_content perimeter.body; }"))) == {"if_is_evil"}


def test_an_unchecked_reason_in_the_reply_header_is_found(tmp_path: Path) -> None:
    # any reason njs or a check set passed into X-Perimeter-Reason as it is
    check = (r'"~^(?<perimeter_reason_token>[A-Za-z0-9_.:-]+)\z" $perimeter_reason_token;',
             '"~." $perimeter_reason;')
    found = findings(_golden_copy(tmp_path, check, count=-1))
    assert {f["plugin"] for f in found} == {"http_splitting"}
    assert all('"$perimeter_reason"' in f["reason"] for f in found)


def test_worker_rlimit_nofile_is_needed(tmp_path: Path) -> None:
    main = _golden_copy(tmp_path)
    text = main.read_text(encoding="utf-8")
    main.write_text(re.sub(r"\nworker_rlimit_nofile [^\n]*", "", text), encoding="utf-8")
    assert _plugins(main) == {"worker_rlimit_nofile_vs_connections"}
