"""Evidence packs: build + verify, tamper detection, key handling, no secrets in a pack."""

from __future__ import annotations

import base64
import json
import re
import shutil
import stat
from pathlib import Path

import pytest

from scanner.cli.main import main
from scanner.documents import validate
from scanner.evidence import keys

REPO = Path(__file__).resolve().parents[2]
KEY_FORMAT = re.compile(r"vp_[A-Za-z0-9_-]{43}")
POLICY = """\
schema_version: 1
name: evidence-test
networks:
  public: [0.0.0.0/0]
audiences:
  inference: {kind: end-user, networks: [public], roles: [user]}
  none: {kind: none}
principals_file: principals.yaml
routes:
  - {path: /v1/models, methods: [GET], audience: inference}
ports:
  allow:
    - {port: 8080, networks: [public]}
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture
def work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """Inputs of a run: signing key, inventory, policy + principals (with a real API key made)."""
    rc, out, _ = run(["keys", "signing-key", "--out", str(tmp_path / "ev.key")], capsys)
    assert rc == 0 and re.fullmatch(r"sha256:[0-9a-f]{16}\n", out)
    rc, key, _ = run(["keys", "new", "alice", "--role", "user", "--file",
                      str(tmp_path / "principals.yaml")], capsys)
    assert rc == 0 and KEY_FORMAT.fullmatch(key.strip())
    (tmp_path / "alice.key").write_text(key)
    shutil.copy(REPO / "policies/catalog/vllm-0.29.0-default.json", tmp_path / "inv.json")
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "netscan.json").write_text('{"schema_version": 1, "findings": []}\n')
    (tmp_path / "nginx.conf").write_text("events {}\n")
    return tmp_path


def build(work: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    return run(["evidence", "build", str(work / "pack"), "--inventory", str(work / "inv.json"),
                "--policy", str(work / "policy.yaml"), "--netscan", str(work / "netscan.json"),
                "--config", str(work / "nginx.conf"), "--signing-key", str(work / "ev.key"),
                *extra], capsys)


def verify(work: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, object]]:
    rc, out, _ = run(["evidence", "verify", str(work / "pack"), "--format", "json", *extra], capsys)
    return rc, json.loads(out)


def test_build_and_verify(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = build(work, capsys)
    assert rc == 0, err
    assert "files/policy/principals.yaml" in out and "vLLM 0.29.0" in err
    manifest = json.loads((work / "pack/manifest.json").read_text())
    validate("evidence-manifest", manifest, "manifest.json")   # the published schema holds
    assert manifest["vllm_version"] == "0.29.0" and manifest["tool"]["name"] == "vllm-perimeter"
    assert manifest["created"].endswith("+00:00")
    assert {f["role"] for f in manifest["files"]} == {"inventory", "policy", "principals", "netscan", "config"}
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", f["sha256"]) for f in manifest["files"])
    rc, doc = verify(work, capsys, "--public-key", str(work / "ev.key.pub"))
    assert rc == 0 and doc["ok"] is True and doc["first_failure"] is None
    rc, out, _ = run(["evidence", "verify", str(work / "pack")], capsys)
    assert rc == 0 and "VERIFIED" in out and "integrity only" in out
    # The copied policy still loads from inside the pack (its principals file sits next to it).
    from scanner.policy.load import load
    assert [p.name for p in load(work / "pack/files/policy/policy.yaml").principals] == ["alice"]


def test_tampered_file_is_named(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build(work, capsys)[0] == 0
    target = work / "pack/files/netscan/netscan.json"
    target.write_text(target.read_text().replace("[]", '[{"id": "x"}]'))
    rc, doc = verify(work, capsys, "--public-key", str(work / "ev.key.pub"))
    assert rc == 1 and doc["first_failure"] == "files/netscan/netscan.json"
    rc, out, _ = run(["evidence", "verify", str(work / "pack")], capsys)
    assert rc == 1 and "VERIFICATION FAILED" in out and "first mismatch files/netscan/netscan.json" in out


def test_missing_and_added_files_fail(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build(work, capsys)[0] == 0
    (work / "pack/files/config/nginx.conf").unlink()
    rc, doc = verify(work, capsys)
    assert rc == 1 and doc["first_failure"] == "files/config/nginx.conf"
    shutil.rmtree(work / "pack")
    assert build(work, capsys)[0] == 0
    (work / "pack/files/extra.txt").write_text("smuggled\n")
    rc, doc = verify(work, capsys)
    assert rc == 1 and doc["first_failure"] == "files/extra.txt"


def test_tampered_manifest_or_signature_fails(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build(work, capsys)[0] == 0
    manifest_path = work / "pack/manifest.json"
    original = manifest_path.read_text()
    # A manifest rewritten to match a tampered file: the signature no longer matches.
    manifest = json.loads(original)
    manifest["vllm_version"] = "0.99.0"
    manifest_path.write_text(json.dumps(manifest))
    rc, doc = verify(work, capsys, "--public-key", str(work / "ev.key.pub"))
    assert rc == 1 and doc["first_failure"] == "manifest.sig.json"
    manifest_path.write_text(original)
    sig_path = work / "pack/manifest.sig.json"
    sig = json.loads(sig_path.read_text())
    raw = bytearray(base64.b64decode(sig["signature"]))
    raw[0] ^= 1
    sig["signature"] = base64.b64encode(bytes(raw)).decode()
    sig_path.write_text(json.dumps(sig))
    rc, doc = verify(work, capsys)
    assert rc == 1 and doc["first_failure"] == "manifest.sig.json"
    manifest_path.write_text("{not json")
    rc, doc = verify(work, capsys)
    assert rc == 1 and doc["first_failure"] == "manifest.json"


def test_wrong_public_key_fails(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build(work, capsys)[0] == 0
    other_pub, _ = keys.new_signing_key(work / "other.key")
    rc, doc = verify(work, capsys, "--public-key", str(other_pub))
    assert rc == 1 and doc["first_failure"] == "manifest.sig.json"
    # A pack re-signed with another key and its embedded key swapped: passes only the
    # integrity check, fails against the real signer's key.
    shutil.rmtree(work / "pack")
    rc, _, _ = run(["evidence", "build", str(work / "pack"), "--inventory", str(work / "inv.json"),
                    "--policy", str(work / "policy.yaml"), "--signing-key", str(work / "other.key")], capsys)
    assert rc == 0
    assert verify(work, capsys)[0] == 0
    assert verify(work, capsys, "--public-key", str(work / "ev.key.pub"))[0] == 1


def test_private_key_perms_and_never_in_pack(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key_file = work / "ev.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert "PRIVATE KEY" in key_file.read_text() and "PRIVATE" not in (work / "ev.key.pub").read_text()
    rc, _, err = run(["keys", "signing-key", "--out", str(key_file)], capsys)
    assert rc == 2 and "refusing to overwrite" in err
    key_file.chmod(0o644)
    rc, _, err = build(work, capsys)
    assert rc == 2 and "too open" in err and not (work / "pack").exists()
    key_file.chmod(0o600)
    rc, _, err = build(work, capsys, "--plan", str(key_file))
    assert rc == 2 and "is the signing key" in err and not (work / "pack").exists()
    assert build(work, capsys)[0] == 0
    private = key_file.read_bytes()
    for f in (work / "pack").rglob("*"):
        if f.is_file():
            assert b"PRIVATE KEY" not in f.read_bytes() and private not in f.read_bytes()


def test_no_api_key_material_in_pack(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build(work, capsys)[0] == 0
    key = (work / "alice.key").read_text().strip()
    for f in (work / "pack").rglob("*"):
        if f.is_file():
            text = f.read_text()
            assert not KEY_FORMAT.search(text), f
            assert key not in text
    # An input that holds a key is refused, and nothing is written.
    shutil.rmtree(work / "pack")
    rc, _, err = build(work, capsys, "--probe", str(work / "alice.key"))
    assert rc == 2 and "contains an API key" in err and not (work / "pack").exists()


def test_bad_input_exit_2(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["evidence", "verify", str(work)], capsys)
    assert rc == 2 and "not an evidence pack" in err
    rc, _, err = build(work, capsys, "--plan", str(work / "nope.json"))
    assert rc == 2 and "no such file" in err
    (work / "pack").mkdir()
    (work / "pack/x").write_text("x")
    rc, _, err = build(work, capsys)
    assert rc == 2 and "not an empty directory" in err
    assert len(err.strip().splitlines()) == 1
