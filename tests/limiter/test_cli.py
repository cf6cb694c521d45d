"""``vllm-perimeter limiter``: bad input is one line and exit 2; secrets are never printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scanner.errors import ConfigError
from scanner.limiter import config


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scanner.cli.main", "limiter", *args],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def zones(tmp_path: Path) -> Path:
    path = tmp_path / "zones.yaml"
    path.write_text("zones:\n  z: {kind: rate, rps: 1, burst: 0}\n")
    return path


@pytest.mark.parametrize(("args", "words"), [
    (("--redis", "redis://:hunter2@127.0.0.1:1/0"), "no password in the URL"),
    (("--redis", "http://127.0.0.1:1"), "expected redis://"),
    (("--redis", "redis://127.0.0.1:1", "--listen", "nowhere"), "expected HOST:PORT"),
    (("--redis", "redis://127.0.0.1:1", "--redis-ca-file", "/x"), "needs a rediss:// URL"),
    (("--redis", "redis://127.0.0.1:1", "--redis-password-file", "/nonexistent/pw"), "cannot read it"),
])
def test_bad_flags_one_line_exit_2(zones: Path, args: tuple[str, ...], words: str) -> None:
    result = run("--zones", str(zones), *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize(("text", "words"), [
    ("zones: [1]", "non-empty mapping"),
    ("zones:\n  z: {kind: leaky}\n", "kind 'leaky'"),
    ("zones:\n  z: {kind: rate, rps: 0, burst: 1}\n", "rps must be"),
    ("zones:\n  z: {kind: rate, rps: 1, burst: -1}\n", "burst must be"),
    ("zones:\n  z: {kind: rate, rps: 1, burst: 1.5}\n", "burst must be"),
    ("zones:\n  z: {kind: concurrency, limit: 2}\n", "slot_ttl_s must be"),
    ("zones:\n  z: {kind: tokens, per_minute: true}\n", "per_minute must be"),
    ("zones:\n  z: {kind: tokens, per_minute: 5, burst: 1}\n", "unknown field 'burst'"),
    ("zones:\n  '{z}': {kind: tokens, per_minute: 5}\n", "no space or braces"),
    ("version: 2\nzones:\n  z: {kind: tokens, per_minute: 5}\n", "version 2"),
    ("zones: {z: [", "not YAML or JSON"),
])
def test_bad_zones_files(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "zones.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_bad_zones_file_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "zones.yaml"
    path.write_text("zones:\n  z: {kind: rate}\n")
    result = run("--redis", "redis://127.0.0.1:1", "--zones", str(path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "rps must be" in result.stderr


def test_zones_file_round_trip() -> None:
    data = {"version": 1, "domain": "d", "zones": {
        "b": {"kind": "concurrency", "limit": 4, "slot_ttl_s": 330.0},
        "a": {"kind": "rate", "rps": 0.5, "burst": 2},
        "c": {"kind": "tokens", "per_minute": 200000}}}
    parsed = config.parse(data)
    assert parsed.to_json() == {**data, "zones": dict(sorted(data["zones"].items()))}   # type: ignore[attr-defined]
    assert config.parse(parsed.to_json()) == parsed
    assert list(parsed.to_json()["zones"]) == ["a", "b", "c"]                         # type: ignore[call-overload]
