"""``keys rotate`` / ``keys revoke`` and where ``generate`` says the proxy reads its key files
(issue 12, item 3). In process through ``scanner.cli.main.main``: the exit codes of the script."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scanner.policy.keys import fingerprint, hash_fingerprint, key_sha256
from scanner.policy.load import loads
from tests.cli.inprocess import in_process, run  # noqa: F401  (in_process: the fixture)

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "policies" / "vllm-default.yaml"
INV = "vllm-0.29.0-default"


pytestmark = pytest.mark.usefixtures("in_process")


def new(capsys: pytest.CaptureFixture[str], pfile: Path, name: str, role: str) -> str:
    code, out, err = run(capsys, "keys", "new", name, "--role", role, "--file", str(pfile))
    assert code == 0, err
    return out.strip()


def principals(pfile: Path) -> dict[str, tuple[str, str]]:
    doc = yaml.safe_load(pfile.read_text())
    return {p["name"]: (p["role"], p["key_sha256"]) for p in doc["principals"] or []}


@pytest.fixture
def pfile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "principals.yaml"
    for name, role in (("alice", "user"), ("bob", "user"), ("ops", "operator")):
        new(capsys, path, name, role)
    # a comment of the user's inside alice's entry and one at the end: both must survive
    text = path.read_text().replace("  - name: bob\n", "  # bob: the batch box\n  - name: bob\n")
    path.write_text(text + "# end of file\n")
    return path


# --- rotate ------------------------------------------------------------------------------


def test_rotate_prints_the_new_key_once_and_replaces_only_the_hash(
        pfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, text = principals(pfile), pfile.read_text()
    code, out, err = run(capsys, "keys", "rotate", "alice", "--file", str(pfile))
    assert code == 0, err
    key = out.strip()
    assert out == key + "\n" and key.startswith("vp_") and len(key) == 46
    after = principals(pfile)
    assert after["alice"] == ("user", key_sha256(key))          # role kept, new hash
    assert after["bob"] == before["bob"] and after["ops"] == before["ops"]
    assert before["alice"][1] not in pfile.read_text()          # the old hash is gone
    assert pfile.read_text() == text.replace(before["alice"][1], key_sha256(key))   # nothing else moved
    assert pfile.stat().st_mode & 0o777 == 0o600
    assert key not in err and hash_fingerprint(before["alice"][1]) in err and fingerprint(key) in err
    assert "reload" in err and len(err.strip().splitlines()) == 1


def test_rotate_in_a_flow_style_file_and_in_a_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = key_sha256("old")
    pfile = tmp_path / "p.yaml"
    pfile.write_text(f"principals:\n  - {{name: a, role: user, key_sha256: \"{old}\"}}  # a's laptop\n"
                     f"  - {{name: b, role: user, key_sha256: {key_sha256('b')}}}\n")
    pfile.chmod(0o644)
    code, out, _ = run(capsys, "keys", "rotate", "a", "--file", str(pfile))
    assert code == 0
    assert principals(pfile)["a"] == ("user", key_sha256(out.strip())) and "# a's laptop" in pfile.read_text()
    assert pfile.stat().st_mode & 0o777 == 0o600    # written 0600 whatever it was
    # a policy with inline principals: edited the same way, and it still loads
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text() + f"principals:\n  - {{name: u, role: user, key_sha256: {old}}}\n"
                      f"  - {{name: o, role: operator, key_sha256: {key_sha256('o')}}}\n"
                      f"  - {{name: s, role: service, key_sha256: {key_sha256('s')}}}\n")
    code, out, _ = run(capsys, "keys", "rotate", "u", "--file", str(policy))
    assert code == 0
    loaded = loads(policy.read_text(), str(policy))
    assert {p.name: p.key_sha256 for p in loaded.principals}["u"] == key_sha256(out.strip())


# --- revoke ------------------------------------------------------------------------------


def test_revoke_removes_the_entry_and_keeps_the_rest(pfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, text = principals(pfile), pfile.read_text()
    code, out, err = run(capsys, "keys", "revoke", "bob", "--file", str(pfile))
    assert code == 0, err
    assert out == ""
    assert principals(pfile) == {k: v for k, v in before.items() if k != "bob"}
    assert "# bob: the batch box" in pfile.read_text() and pfile.read_text().endswith("# end of file\n")
    assert pfile.read_text() == text.replace(
        f"  - name: bob\n    role: user\n    key_sha256: {before['bob'][1]}\n", "")
    assert pfile.stat().st_mode & 0o777 == 0o600
    assert f"revoked bob (user) {hash_fingerprint(before['bob'][1])}" in err and "note:" not in err
    # the last of a role: done, with a note that a policy naming the role will not plan
    code, _, err = run(capsys, "keys", "revoke", "ops", "--file", str(pfile))
    assert code == 0 and "note: role 'operator' has no principal left" in err


def test_revoke_every_principal_leaves_an_empty_list_keys_new_can_add_to(
        pfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("alice", "bob", "ops"):
        assert run(capsys, "keys", "revoke", name, "--file", str(pfile))[0] == 0
    assert yaml.safe_load(pfile.read_text())["principals"] == []
    assert "principals: []" in pfile.read_text()
    key = new(capsys, pfile, "carol", "user")
    assert principals(pfile) == {"carol": ("user", key_sha256(key))}


def test_revoke_in_a_flow_style_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pfile = tmp_path / "p.yaml"
    pfile.write_text(f"# mine\nprincipals:\n  - {{name: a, role: user, key_sha256: {key_sha256('a')}}}  # gone\n"
                     f"  - {{name: b, role: user,\n     key_sha256: {key_sha256('b')}}}\n"
                     f"  - {{name: c, role: user, key_sha256: {key_sha256('c')}}}\n")
    assert run(capsys, "keys", "revoke", "b", "--file", str(pfile))[0] == 0
    assert run(capsys, "keys", "revoke", "a", "--file", str(pfile))[0] == 0
    assert pfile.read_text() == f"# mine\nprincipals:\n  - {{name: c, role: user, key_sha256: {key_sha256('c')}}}\n"


@pytest.mark.parametrize("command", ["rotate", "revoke"])
def test_unknown_name_changes_nothing(pfile: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    text = pfile.read_text()
    code, out, err = run(capsys, "keys", command, "carol", "--file", str(pfile))
    assert code == 2 and out == ""
    assert err == f"error: {pfile}: no principal 'carol' (known: alice, bob, ops)\n"
    assert pfile.read_text() == text


def test_a_flow_list_is_not_edited_but_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pfile = tmp_path / "p.yaml"
    text = f"principals: [{{name: a, role: user, key_sha256: {key_sha256('a')}}}]\n"
    pfile.write_text(text)
    code, _, err = run(capsys, "keys", "revoke", "a", "--file", str(pfile))
    assert code == 2 and "block list" in err and pfile.read_text() == text


# --- generate: where the proxy reads its key files ------------------------------------------


def _policy(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str = "") -> Path:
    pfile = tmp_path / "principals.yaml"
    for name, role in (("alice", "user"), ("svc", "service"), ("ops", "operator")):
        new(capsys, pfile, name, role)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text() + f"principals_file: {pfile}\n" + extra)
    return policy


def _generate(capsys: pytest.CaptureFixture[str], proxy: str, policy: Path, out: Path,
              *args: str) -> list[str]:
    code, stdout, err = run(capsys, "generate", proxy, "--inventory", INV, "--policy", str(policy),
                            "-o", str(out), *args)
    assert code == 0, err
    assert stdout == ""
    # the notes on key files (the bundled policy's shared-responses and shared-cache warnings aside:
    # tests/cli/test_init_cli.py)
    return [line for line in err.splitlines() if not line.startswith(("wrote ", "warning: "))]


def test_generate_envoy_names_the_key_file_in_the_output_dir_not_the_runtime_dir(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's way (-o DIR --runtime-dir RUN): Envoy reads DIR/envoy-principals.tsv."""
    policy = _policy(tmp_path, capsys)
    monkeypatch.chdir(tmp_path)
    lines = _generate(capsys, "envoy", policy, Path("out"), "--runtime-dir", str(tmp_path / "run"))
    tsv = tmp_path / "out" / "envoy-principals.tsv"
    assert lines == [f"the proxy reads key hashes from {tsv} (0600, readable by Envoy's user; "
                     "read when Envoy starts)"]
    config = (tmp_path / "out" / "envoy.yaml").read_text()
    assert f'KEYS_FILE = "{tsv}"' in config and str(tmp_path / "run") not in config
    assert tsv.stat().st_mode & 0o777 == 0o600


def test_generate_envoy_with_config_dir_says_what_to_copy_and_names_vllms_key_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "vllm.key"
    secret.write_text("vllm-secret-123\n")
    policy = _policy(tmp_path, capsys, f"upstream: {{host: 127.0.0.1, port: 8000, api_key_file: {secret}}}\n")
    lines = _generate(capsys, "envoy", policy, tmp_path / "out", "--set", "config_dir=/etc/perimeter/")
    assert lines == [
        "the proxy reads key hashes from /etc/perimeter/envoy-principals.tsv (0600, readable by Envoy's "
        "user; read when Envoy starts)",
        f"copy {tmp_path / 'out' / 'envoy-principals.tsv'} to /etc/perimeter/envoy-principals.tsv",
        f"the proxy reads vLLM's API key (upstream.api_key_file) from {secret} (0600, readable by "
        "Envoy's user; read when Envoy starts)"]
    assert 'KEYS_FILE = "/etc/perimeter/envoy-principals.tsv"' in (tmp_path / "out" / "envoy.yaml").read_text()


def test_generate_nginx_names_its_key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _policy(tmp_path, capsys)
    out = tmp_path / "out"
    lines = _generate(capsys, "nginx", policy, out, "--runtime-dir", str(tmp_path / "run"))
    assert lines == [f"the proxy reads key hashes from {out / 'perimeter-principals.conf'} (0600, read by "
                     "NGINX's master at start and on reload; relative to nginx.conf's directory)"]
    assert 'include "perimeter-principals.conf";' in (out / "perimeter-http.conf").read_text()
    lines = _generate(capsys, "nginx", policy, out, "--set", "config_dir=/etc/perimeter")
    assert lines[0] == f"copy {out / 'perimeter-http.conf'} to /etc/perimeter/perimeter-http.conf"
    assert lines[1] == ("the proxy reads key hashes from /etc/perimeter/perimeter-principals.conf (0600, read "
                        "by NGINX's master at start and on reload)")
    copied = {line.split()[1].rpartition("/")[2] for line in lines[2:] if line.startswith("copy ")}
    assert len(lines) == 7 and copied == {"perimeter-principals.conf", "perimeter-proxy.conf", "perimeter.js",
                                          "perimeter-rules.json", "perimeter-identity.json"}, lines


def test_generate_nginx_names_the_file_with_vllms_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "vllm.key"
    secret.write_text("vllm-secret-123\n")
    policy = _policy(tmp_path, capsys, f"upstream: {{host: 127.0.0.1, port: 8000, api_key_file: {secret}}}\n")
    out = tmp_path / "out"
    lines = _generate(capsys, "nginx", policy, out)
    assert lines[1] == (f"the proxy reads vLLM's API key from {out / 'perimeter-upstream-key.conf'} (0600, read "
                        "by NGINX's master at start and on reload; relative to nginx.conf's directory)")
    assert len(lines) == 2 and "vllm-secret-123" not in "\n".join(lines)
