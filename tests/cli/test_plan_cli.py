"""CLI contract of plan / keys: exit codes and one-line errors, never a traceback, never a key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scanner.inventory.model import Inventory, Route, Source

CLI = [sys.executable, "-m", "scanner.cli.main"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False)


def _inventory(tmp_path: Path) -> Path:
    inv = Inventory(source=Source(kind="asgi", target="t:app"), routes=(
        Route("/v1/chat/completions", ("POST",), guarded=True), Route("/invocations", ("POST",))))
    path = tmp_path / "inv.json"
    path.write_text(inv.to_json())
    return path


def test_plan_json_is_deterministic(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    a = run("plan", "--inventory", str(inv), "--format", "json")
    b = run("plan", "--inventory", str(inv), "--format", "json")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    doc = json.loads(a.stdout)
    actions = {(d["method"], d["path"]): d["action"] for d in doc["decisions"]}
    assert actions == {("POST", "/v1/chat/completions"): "allow", ("POST", "/invocations"): "deny"}


def test_policy_typo_is_one_line_exit_2(tmp_path: Path) -> None:
    policy = (Path(__file__).resolve().parents[2] / "policies" / "vllm-default.yaml").read_text()
    bad = tmp_path / "typo.yaml"
    bad.write_text(policy.replace("{path: /v1/models, methods: [GET], audience: inference}",
                                  "{path: /v1/models, methods: [GET], audience: inferense}"))
    r = run("plan", "--inventory", str(_inventory(tmp_path)), "--policy", str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: {bad}:")
    assert "unknown audience 'inferense' (did you mean 'inference'?)" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_inventory_exit_2(tmp_path: Path) -> None:
    r = run("plan", "--inventory", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "No such file" in r.stderr and "Traceback" not in r.stderr


def test_bad_network_override_exit_2(tmp_path: Path) -> None:
    r = run("plan", "--inventory", str(_inventory(tmp_path)), "--network", "admin=10.0.0.300/8")
    assert r.returncode == 2 and "not an IP network" in r.stderr


def test_keys_new_prints_key_once_and_stores_hash(tmp_path: Path) -> None:
    pfile = tmp_path / "principals.yaml"
    r = run("keys", "new", "alice", "--role", "user", "--file", str(pfile))
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert key.startswith("vp_") and len(key) == 46
    assert key not in r.stderr and key not in pfile.read_text()
    assert "sha256:" in r.stderr
    again = run("keys", "new", "alice", "--role", "user", "--file", str(pfile))
    assert again.returncode == 2 and "already exists" in again.stderr
