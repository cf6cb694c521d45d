"""``vllm-perimeter init``: the README's quick start yields owned responses and per-principal
cache salts, proven by ``verify`` on every proxy; ``plan`` says loudly when either is off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "scanner.cli.main"]
INVENTORY = "vllm-0.29.0-default"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


def _init(tmp_path: Path) -> Path:
    res = run("init", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert "next: set your networks" in res.stderr and "(operator, service, user)" in res.stderr
    for name, role in (("alice", "user"), ("batch", "service"), ("ops", "operator")):
        key = run("keys", "new", name, "--role", role, "--file", str(tmp_path / "principals.yaml"))
        assert key.returncode == 0, key.stderr
    secrets = [(tmp_path / n).read_text().strip() for n in ("responses.secret", "cache-salt.secret")]
    assert all(s and s not in res.stderr for s in secrets)   # secrets are never printed
    return tmp_path / "policy.yaml"


def test_plan_warns_on_stderr_when_responses_or_prefix_cache_are_shared(tmp_path: Path) -> None:
    bundled = run("plan", "--inventory", INVENTORY, "-o", str(tmp_path / "plan.txt"))
    assert bundled.returncode == 0, bundled.stderr
    warnings = [line for line in bundled.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, bundled.stderr
    assert "stored responses shared" in warnings[0] and "prefix cache shared" in warnings[1]
    assert all("vllm-perimeter init" in w for w in warnings)
    assert "WARNING: stored responses shared" in (tmp_path / "plan.txt").read_text()
    (tmp_path / "mine").mkdir()
    started = run("plan", "--inventory", INVENTORY, "--policy", str(_init(tmp_path / "mine")))
    assert started.returncode == 0 and "warning" not in started.stderr, started.stderr
    assert "responses: owned" in started.stdout and "cache_salt: per-principal" in started.stdout


def test_init_refuses_an_existing_policy_and_a_missing_directory_in_one_line(tmp_path: Path) -> None:
    assert run("init", str(tmp_path)).returncode == 0
    again = run("init", str(tmp_path))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    missing = run("init", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such directory" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("proxy", ["nginx", "nginx-debian", "envoy"])
def test_the_quick_start_deploys_owned_responses_and_per_principal_salts(proxy: str, tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    policy = _init(tmp_path / "p")
    out = tmp_path / "verify.json"
    res = run("verify", "--inventory", INVENTORY, "--policy", str(policy), "--proxy", proxy,
              "--format", "json", "-o", str(out), "-q", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["findings"] == []
    assert doc["summary"]["coverage"]["ownership"]["proved"] >= 3
    assert doc["summary"]["coverage"]["ownership"]["failed"] == 0
    salted = [c for c in doc["coverage"] if c["subject"].startswith("salt ")]
    assert any(c["path"] == "/v1/chat/completions" for c in salted)
    assert len(salted) >= 10 and all(c["status"] == "proved" for c in salted), salted
