"""Bad input to plan / generate / keys / probe / audit / evidence: exit 2 and ONE line that names
the file or option, never "internal error" (exit 3) nor a traceback, never a key.

Each case builds its bad input under ``tmp_path`` and returns the command line, the text the
error line must contain (the file or option) and, for key files, the secret it must not.
The CLI runs in-process through ``scanner.cli.main.main``: the same exit-code mapping as the
``vllm-perimeter`` script.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from scanner.evidence.keys import new_signing_key
from scanner.probe.config import parse_key
from tests.cli.inprocess import in_process, run  # noqa: F401  (in_process: the fixture)

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "policies" / "vllm-default.yaml"
INV = "vllm-0.29.0-default"
CLOSED = "http://127.0.0.1:1"   # nothing listens: a probe that gets past its inputs exits 3
HASH = "0" * 64
NOT_UTF8 = b"\xff\xfe\x00 not text"


class Case(NamedTuple):
    argv: list[str]
    named: str            # the file or option the error line must name
    secret: str = ""      # must appear neither on stdout nor on stderr


def _file(tmp: Path, name: str, content: str | bytes) -> Path:
    path = tmp / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _with_principals(tmp: Path, content: str | bytes | None) -> tuple[list[str], str]:
    """``plan`` with the bundled policy plus ``principals_file:`` (``None``: a missing file)."""
    principals = tmp / "principals.yaml"
    if content is not None:
        _file(tmp, principals.name, content)
    policy = _file(tmp, "policy.yaml", POLICY.read_text() + f"principals_file: {principals}\n")
    return ["plan", "--inventory", INV, "--policy", str(policy)], str(principals)


def _plan_policy(tmp: Path, content: str | bytes) -> Case:
    policy = _file(tmp, "policy.yaml", content)
    return Case(["plan", "--inventory", INV, "--policy", str(policy)], str(policy))


def _plan_inventory(tmp: Path, content: str | bytes) -> Case:
    inv = _file(tmp, "inv.json", content)
    return Case(["plan", "--inventory", str(inv)], str(inv))


def _generate(proxy: str, out: Callable[[Path], Path]) -> Callable[[Path], Case]:
    def make(tmp: Path) -> Case:
        _file(tmp, "a-file", "x")
        target = out(tmp)
        return Case(["generate", proxy, "--inventory", INV, "-o", str(target)], str(target))
    return make


def _keys_change(command: str, tmp: Path, content: str | bytes | None) -> Case:
    """``keys rotate|revoke alice --file p.yaml`` (``None``: the file is missing)."""
    path = tmp / "p.yaml" if content is None else _file(tmp, "p.yaml", content)
    return Case(["keys", command, "alice", "--file", str(path)], str(path))


def _keys_read_only_dir(command: str, tmp: Path) -> Case:
    """A good principals file in a directory the atomic rewrite cannot create its temp file in."""
    d = tmp / "ro"
    d.mkdir()
    path = _file(d, "p.yaml", f"principals:\n  - {{name: alice, role: user, key_sha256: {HASH}}}\n")
    d.chmod(0o500)
    if os.access(d, os.W_OK):
        pytest.skip("this user may write into a 0500 directory (root)")
    return Case(["keys", command, "alice", "--file", str(path)], str(path))


def _probe_key(content: str | bytes) -> Callable[[Path], Case]:
    def make(tmp: Path) -> Case:
        key = _file(tmp, "user.key", content)
        secret = content.strip() if isinstance(content, str) else ""
        return Case(["probe", CLOSED, "--inventory", INV, "--key", f"user=file:{key}", "-q"],
                    "--key user=file:", secret)
    return make


def _merge(content: str | bytes | None) -> Callable[[Path], Case]:
    def make(tmp: Path) -> Case:
        result = tmp / "result.json" if content is None else _file(tmp, "result.json", content)
        return Case(["probe", "merge", str(result)], str(result))
    return make


def _audit_baseline_dir(tmp: Path) -> Case:
    base = tmp / "baseline"
    base.mkdir()
    _file(base, "inventory.json", "{")
    _file(base, "policy.yaml", POLICY.read_text())
    return Case(["audit", str(base), CLOSED], str(base / "inventory.json"))


def _baseline(extra: Callable[[Path], tuple[list[str], str]]) -> Callable[[Path], Case]:
    def make(tmp: Path) -> Case:
        args, named = extra(tmp)
        return Case(["audit", "baseline", str(tmp / "out"), "--inventory", INV, "--policy", str(POLICY),
                     *args], named)
    return make


def _evidence(role: str, content: str | bytes | None) -> Callable[[Path], Case]:
    """``evidence build`` with a good signing key and inventory, and ``--ROLE`` bad."""
    def make(tmp: Path) -> Case:
        key = tmp / "evidence.key"
        new_signing_key(key)
        inv = _file(tmp, "inv.json", (REPO / "policies" / "catalog" / f"{INV}.json").read_text())
        bad = tmp / f"{role}.in"
        if content is not None:
            _file(tmp, bad.name, content).chmod(0o600)   # 0600: a key file's mode must not be the error
        given = {"inventory": str(inv), "policy": str(POLICY), "signing-key": str(key), role: str(bad)}
        args = [a for name, value in given.items() for a in (f"--{name}", value)]
        return Case(["evidence", "build", str(tmp / "pack"), *args], str(bad))
    return make


CASES: dict[str, Callable[[Path], Case]] = {
    # --- the principals file a policy names
    "principals-not-yaml": lambda t: Case(*_with_principals(t, "a: [\n")),
    "principals-missing": lambda t: Case(*_with_principals(t, None)),
    "principals-a-list": lambda t: Case(*_with_principals(t, "- a\n- b\n")),
    "principals-a-scalar": lambda t: Case(*_with_principals(t, "hello\n")),
    "principals-entries-not-a-list": lambda t: Case(*_with_principals(t, "principals: 5\n")),
    "principals-not-utf8": lambda t: Case(*_with_principals(t, NOT_UTF8)),
    "principals-duplicate-name": lambda t: Case(*_with_principals(t, (
        f"principals:\n  - {{name: a, role: user, key_sha256: {HASH}}}\n"
        f"  - {{name: a, role: user, key_sha256: {HASH}}}\n"))),
    # --- the policy
    "policy-empty": lambda t: _plan_policy(t, ""),
    "policy-a-list": lambda t: _plan_policy(t, "- 1\n- 2\n"),
    "policy-a-scalar": lambda t: _plan_policy(t, "just a string\n"),
    "policy-not-yaml": lambda t: _plan_policy(t, "name: [\n"),
    "policy-not-utf8": lambda t: _plan_policy(t, NOT_UTF8),
    "policy-unknown-network": lambda t: _plan_policy(
        t, POLICY.read_text().replace("networks: [admin]", "networks: [admins]")),
    "policy-unknown-yaml-tag": lambda t: _plan_policy(
        t, POLICY.read_text().replace("\nname: ", "\nname: !foo ", 1)),
    "policy-missing": lambda t: Case(["plan", "--inventory", INV, "--policy", str(t / "nope.yaml")],
                                     str(t / "nope.yaml")),
    # --- the inventory
    "inventory-not-json": lambda t: _plan_inventory(t, "not json\n"),
    "inventory-a-json-list": lambda t: _plan_inventory(t, "[1, 2]\n"),
    "inventory-not-utf8": lambda t: _plan_inventory(t, NOT_UTF8),
    "inventory-missing-file": lambda t: Case(["plan", "--inventory", str(t / "nope.json")], str(t / "nope.json")),
    "inventory-unknown-catalog": lambda t: Case(["plan", "--inventory", "vllm-9.9.9-default"],
                                                "'vllm-9.9.9-default'"),
    # --- generate's output directory
    "generate-nginx-out-under-proc": _generate("nginx", lambda t: Path("/proc/x/y")),
    "generate-nginx-out-under-a-file": _generate("nginx", lambda t: t / "a-file" / "out"),
    "generate-envoy-out-under-a-file": _generate("envoy", lambda t: t / "a-file" / "out"),
    "generate-envoy-out-is-a-file": _generate("envoy", lambda t: t / "a-file"),
    "generate-envoy-config-dir-relative": lambda t: Case(
        ["generate", "envoy", "--inventory", INV, "-o", str(t / "out"), "--set", "config_dir=etc/p"], "config_dir"),
    # a token budget NGINX with njs 0.7 (Debian 12's) cannot keep: refused, never dropped
    "generate-nginx-token-budget-on-njs-0.7": lambda t: Case(
        ["generate", "nginx", "--inventory", INV, "-o", str(t / "out"), "--set", "njs=0.7.9", "--policy",
         str(_file(t, "tokens.yaml", POLICY.read_text().replace(
             "      concurrency: 16\n", "      concurrency: 16\n      tokens_per_minute: 2000\n", 1)))],
        "tokens_per_minute needs njs >= 0.8"),
    "generate-nginx-config-dir-relative": lambda t: Case(
        ["generate", "nginx", "--inventory", INV, "-o", str(t / "out"), "--set", "config_dir=etc/p"], "config_dir"),
    # --- keys new --file (a principals file to append to)
    "keys-file-not-utf8": lambda t: Case(
        ["keys", "new", "alice", "--role", "user", "--file", str(_file(t, "p.yaml", NOT_UTF8))], str(t / "p.yaml")),
    "keys-file-a-directory": lambda t: Case(["keys", "new", "alice", "--role", "user", "--file", str(t)], str(t)),
    "keys-file-dir-missing": lambda t: Case(
        ["keys", "new", "alice", "--role", "user", "--file", str(t / "no" / "p.yaml")], str(t / "no" / "p.yaml")),
    # --- keys rotate / revoke --file (a principals file to change)
    "keys-rotate-unknown-name": lambda t: _keys_change("rotate", t, (
        f"principals:\n  - {{name: bob, role: user, key_sha256: {HASH}}}\n")),
    "keys-revoke-unknown-name": lambda t: _keys_change("revoke", t, "principals: []\n"),
    "keys-revoke-file-missing": lambda t: _keys_change("revoke", t, None),
    "keys-rotate-file-a-directory": lambda t: Case(["keys", "rotate", "alice", "--file", str(t)], str(t)),
    "keys-rotate-not-utf8": lambda t: _keys_change("rotate", t, NOT_UTF8),
    "keys-revoke-not-yaml": lambda t: _keys_change("revoke", t, "principals: [\n"),
    "keys-revoke-not-principals": lambda t: _keys_change("revoke", t, "- a\n- b\n"),
    "keys-rotate-principals-a-scalar": lambda t: _keys_change("rotate", t, "principals: 5\n"),
    "keys-rotate-entry-without-hash": lambda t: _keys_change("rotate", t, (
        "principals:\n  - {name: alice, role: user}\n")),
    "keys-revoke-flow-list": lambda t: _keys_change("revoke", t, (
        f"principals: [{{name: alice, role: user, key_sha256: {HASH}}}]\n")),
    "keys-rotate-file-read-only-dir": lambda t: _keys_read_only_dir("rotate", t),
    # --- probe --key ROLE=file:PATH (surrounding whitespace is stripped; inner whitespace is not a key)
    "key-file-two-lines": _probe_key("vp_first\r\nvp_second\r\n"),
    "key-file-inner-space": _probe_key("vp_abc def\n"),
    "key-file-blank": _probe_key(" \r\n"),
    "key-file-not-utf8": _probe_key(NOT_UTF8),
    "key-file-missing": lambda t: Case(
        ["probe", CLOSED, "--inventory", INV, "--key", f"user=file:{t / 'nope'}"], "--key user=file:"),
    # --- probe merge inputs
    "probe-merge-missing": _merge(None),
    "probe-merge-not-json": _merge("{"),
    "probe-merge-not-utf8": _merge(NOT_UTF8),
    # --- audit
    "audit-baseline-missing": lambda t: Case(["audit", str(t / "nope"), CLOSED], str(t / "nope")),
    "audit-baseline-corrupt-inventory": _audit_baseline_dir,
    "audit-baseline-bad-principals": lambda t: Case(
        ["audit", "baseline", str(t / "out"), "--inventory", INV, "--policy", _with_principals(t, "a: [\n")[0][-1]],
        str(t / "principals.yaml")),
    "audit-baseline-out-under-proc": lambda t: Case(
        ["audit", "baseline", "/proc/x/y", "--inventory", INV, "--policy", str(POLICY)], "/proc/x/y"),
    "audit-baseline-probe-result-corrupt": _baseline(
        lambda t: (["--probe-result", str(_file(t, "probe.json", "{"))], str(t / "probe.json"))),
    "audit-baseline-netscan-result-missing": _baseline(
        lambda t: (["--netscan-result", str(t / "nope.json")], str(t / "nope.json"))),
    # --- evidence
    "evidence-inventory-missing": _evidence("inventory", None),
    "evidence-inventory-corrupt": _evidence("inventory", "{"),
    "evidence-probe-corrupt": _evidence("probe", "not json"),
    "evidence-netscan-not-json": _evidence("netscan", "not json"),
    "evidence-netscan-a-list": _evidence("netscan", "[1]"),
    "evidence-signing-key-missing": _evidence("signing-key", None),
    "evidence-signing-key-not-a-key": _evidence("signing-key", "not a key\n"),
    "evidence-verify-not-a-pack": lambda t: Case(["evidence", "verify", str(t)], str(t)),
}


pytestmark = pytest.mark.usefixtures("in_process")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run(capsys, *argv)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[name](tmp_path)
    code, out, err = _run(case.argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert case.named in lines[0], err
    assert "internal error" not in err and "Traceback" not in err
    if case.secret:
        assert case.secret not in err and case.secret not in out


def test_key_file_with_crlf_and_trailing_spaces_is_accepted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Whitespace around a key (CRLF, a trailing newline, spaces) is stripped, as `--key --help` says:
    the probe gets past its inputs and finds the closed port (exit 3, unreachable)."""
    key = _file(tmp_path, "user.key", "vp_abc123  \r\n")
    assert parse_key(f"user=file:{key}").secret == "vp_abc123"
    assert parse_key("user=env:K", {"K": "vp_abc123\r\n"}).secret == "vp_abc123"
    code, out, err = _run(["probe", CLOSED, "--inventory", INV, "--key", f"user=file:{key}", "-q",
                           "--max-time", "5", "--format", "json"], capsys)
    assert code == 3, err
    assert "unreachable" in err and "--key" not in err and "vp_abc123" not in err + out
