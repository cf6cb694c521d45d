"""``vllm-perimeter limiter``: bad input is one line and exit 2; secrets are never printed."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scanner.cli.main import main
from scanner.errors import ConfigError
from scanner.limiter import config


def run(*args: str) -> tuple[int, str]:
    """(exit code, stderr + stdout) of ``vllm-perimeter limiter ARGS``, in this process."""
    before = signal.getsignal(signal.SIGTERM)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                pytest.raises(SystemExit) as done:
            main(["limiter", *args])
    finally:
        signal.signal(signal.SIGTERM, before)
    code = done.value.code
    return code if isinstance(code, int) else 0, err.getvalue() + out.getvalue()


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
    code, text = run("--zones", str(zones), *args)
    lines = text.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0] and "hunter2" not in text, text


@pytest.mark.parametrize(("text", "words"), [
    ("zones: [1]", "non-empty mapping"),
    ("zones:\n  z: {kind: leaky}\n", "kind 'leaky'"),
    ("zones:\n  z: {kind: rate, rps: 0, burst: 1}\n", "rps must be"),
    ("zones:\n  z: {kind: rate, rps: 1, burst: -1}\n", "burst must be"),
    ("zones:\n  z: {kind: rate, rps: 1, burst: 1.5}\n", "burst must be"),
    ("zones:\n  z: {kind: concurrency, limit: 2}\n", "slot_ttl_s must be"),
    ("zones:\n  z: {kind: tokens, per_minute: true}\n", "per_minute must be"),
    ("zones:\n  z: {kind: tokens, per_minute: 5, burst: 6}\n", "burst 6 is more than per_minute 5"),
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
    code, text = run("--redis", "redis://127.0.0.1:1", "--zones", str(path))
    assert code == 2 and len(text.strip().splitlines()) == 1 and "rps must be" in text


def test_zones_file_round_trip() -> None:
    data = {"version": 1, "domain": "d", "zones": {
        "b": {"kind": "concurrency", "limit": 4, "slot_ttl_s": 330.0},
        "a": {"kind": "rate", "rps": 0.5, "burst": 2},
        "c": {"kind": "tokens", "per_minute": 200000, "burst": 50000}}}
    parsed = config.parse(data)
    assert parsed.to_json() == {**data, "zones": dict(sorted(data["zones"].items()))}   # type: ignore[attr-defined]
    assert config.parse(parsed.to_json()) == parsed
    assert list(parsed.to_json()["zones"]) == ["a", "b", "c"]                         # type: ignore[call-overload]


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_starts_without_redis_and_stops_quietly(zones: Path, tmp_path: Path, sigint: str) -> None:
    """Redis not there at start: a warning, then every answer says unavailable; SIGTERM with
    connections open: exit 143 and no traceback, also when the parent left SIGINT ignored (a
    service manager, or pytest-xdist's workers: SIGTERM must not rely on SIGINT's handler)."""
    import signal
    import socket

    from scanner.net import free_port, wait_for_port
    from tests.limiter.clients import HttpClient

    (tmp_path / "pw").write_text("hunter2\n")
    port, dead = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "scanner.cli.main", "limiter", "--redis", f"redis://127.0.0.1:{dead}",
                             "--redis-password-file", str(tmp_path / "pw"), "--zones", str(zones),
                             "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored"
                            else None)
    try:
        assert wait_for_port("127.0.0.1", port, 20)
        client = HttpClient("127.0.0.1", port)
        assert client.post("/v1/acquire", {"key": "k", "zone": "z"}) == (
            503, {"allow": False, "reason": "shared-store-unavailable"})
        idle = socket.create_connection(("127.0.0.1", port))      # a connection that sent nothing
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
        idle.close()
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    assert "warning: shared store unavailable" in err and "Traceback" not in err and "hunter2" not in err
