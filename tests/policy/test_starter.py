"""``vllm-perimeter init``'s files: the bundled policy with owned responses and per-principal
salts, its secrets and principals file 0600, nothing existing overwritten but the policy (forced)."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path

import pytest

from scanner.errors import ConfigError, UsageError
from scanner.plan.inputs import load_policy
from scanner.policy import keys, starter
from scanner.policy.load import load


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_starter_policy_turns_on_owned_responses_and_per_principal_salts(tmp_path: Path) -> None:
    done = starter.write_starter(tmp_path)
    assert [w.action for w in done] == ["wrote"] * 4
    policy = load(tmp_path / "policy.yaml")
    assert policy.body.owned and policy.body.cache_salt == "per-principal"
    assert policy.body.responses_secret_file == str(tmp_path / "responses.secret")
    assert policy.body.cache_salt_secret_file == str(tmp_path / "cache-salt.secret")
    for name in ("responses.secret", "cache-salt.secret", "principals.yaml"):
        assert _mode(tmp_path / name) == 0o600, name
    # everything else is the bundled policy's: the same routes, audiences and field rules
    bundled = load_policy(None)
    assert [replace(r, line=0) for r in policy.rules] == [replace(r, line=0) for r in bundled.rules]
    assert policy.audiences.keys() == bundled.audiences.keys()
    for name, a in policy.audiences.items():
        b = bundled.audiences[name]
        assert (a.kind, a.auth, a.roles, a.networks, a.limits, a.fields.named, a.media.urls) == \
               (b.kind, b.auth, b.roles, b.networks, b.limits, b.fields.named, b.media.urls), name
    assert policy.principals == ()


def test_secrets_elsewhere_and_keys_new_appends_to_its_principals_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    starter.write_starter(tmp_path, secrets)
    for name, role in (("alice", "user"), ("batch", "service"), ("ops", "operator")):
        keys.append_principal(tmp_path / "principals.yaml", name, role, keys.new_key())
    policy = load(tmp_path / "policy.yaml")
    assert policy.body.responses_secret_file == str(secrets / "responses.secret")
    assert [p.name for p in policy.principals] == ["alice", "batch", "ops"]
    assert not (tmp_path / "responses.secret").exists()


def test_a_second_init_keeps_secrets_and_principals_and_refuses_the_policy_unless_forced(tmp_path: Path) -> None:
    starter.write_starter(tmp_path)
    secret = (tmp_path / "responses.secret").read_text()
    keys.append_principal(tmp_path / "principals.yaml", "alice", "user", keys.new_key())
    with pytest.raises(UsageError, match="exists; keep it, or write a new one with --force"):
        starter.write_starter(tmp_path)
    done = starter.write_starter(tmp_path, force=True)
    assert [w.action for w in done] == ["wrote", "kept", "kept", "kept"]
    assert (tmp_path / "responses.secret").read_text() == secret
    assert "alice" in (tmp_path / "principals.yaml").read_text()


def test_an_existing_secret_others_can_read_is_refused_not_kept(tmp_path: Path) -> None:
    (tmp_path / "cache-salt.secret").write_text("x" * 40 + "\n")
    (tmp_path / "cache-salt.secret").chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        starter.write_starter(tmp_path)


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such directory"):
        starter.write_starter(tmp_path / "nope")


def test_key_roles_are_the_roles_of_the_key_audiences(tmp_path: Path) -> None:
    starter.write_starter(tmp_path)
    assert starter.key_roles(tmp_path / "policy.yaml") == ("operator", "service", "user")
