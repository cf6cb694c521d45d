"""Tenant-scoped prefix cache (issue 10, item 4): ``cache_salt: per-principal | per-audience``. The
perimeter writes cache_salt = HMAC-SHA256(secret, subject) over any client's; decided once in the
plan (``Decision.salt``), the salts computed at generate time into the 0600 files only, written by
njs and Lua, proved by the probe through the witness (the exact salt, different per principal)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from scanner.cli.main import cli
from scanner.errors import ConfigError, PolicyError
from scanner.inventory.catalog import load_ref
from scanner.plan.body import forwarded
from scanner.plan.build import build
from scanner.plan.inputs import load_policy
from scanner.policy.load import loads
from scanner.policy.model import BodyPolicy, Policy
from scanner.policy.salt import new_secret, read_secret, salt
from scanner.probe.interface import ProbeOptions
from scanner.runtime.proxy import Proxy
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-everything"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=300, checks=("limits",))
CHAT = ("POST", "/v1/chat/completions")


def _salted(mode: str = "per-principal", secret_file: str = "/nonexistent/salt") -> Policy:
    policy = load_policy(None)   # loop.setup puts a throwaway secret in its run directory
    return replace(policy, body=BodyPolicy(cache_salt=mode, chat_template=policy.body.chat_template,  # type: ignore[arg-type]
                                           cache_salt_secret_file=secret_file))


# --- policy and plan ----------------------------------------------------------------------------

def test_the_plan_says_whose_salt_each_body_route_writes() -> None:
    plan = build(load_ref(CATALOG), _salted())
    chat = plan.decision(*CHAT)
    assert chat is not None and chat.salt == "principal" and chat.salt_subject("alice") == "principal:alice"
    assert chat.fields.mode("cache_salt") == "strip"       # the client's is replaced, not refused
    models = plan.decision("GET", "/v1/models")
    assert models is not None and models.salt == ""
    assert chat.to_dict()["fields"]["salt"] == "principal"
    assert plan.body_dict()["body"]["cache_salt_secret_file"] == "/nonexistent/salt"
    # per-audience: one salt per audience; per-principal on a route without keys: its audience's
    per_audience = build(load_ref(CATALOG), _salted("per-audience")).decision(*CHAT)
    assert per_audience is not None and per_audience.salt_subject("alice") == "audience:inference"
    policy = _salted()
    anonymous = replace(policy.audiences["inference"], auth="none", roles=())
    open_plan = build(load_ref(CATALOG), replace(policy, audiences={**policy.audiences, "inference": anonymous}))
    open_chat = open_plan.decision(*CHAT)
    assert open_chat is not None and open_chat.salt == "audience"
    from scanner.report.plan import to_table
    table = to_table(plan, width=400)
    assert "cache_salt:per-principal" in table and "cache_salt: per-principal (HMAC-SHA256" in table
    # the other modes are unchanged
    assert build(load_ref(CATALOG), load_policy(None)).decision(*CHAT).salt == ""   # type: ignore[union-attr]


def test_forwarded_body_carries_the_salt_over_the_clients() -> None:
    plan = build(load_ref(CATALOG), _salted())
    chat = plan.decision(*CHAT)
    assert chat is not None
    sent = {"model": "m", "messages": [], "max_tokens": 5, "cache_salt": "mine"}
    assert forwarded(chat, sent, "s1") == {"model": "m", "messages": [], "max_tokens": 5,
                                                     "cache_salt": "s1"}
    assert forwarded(chat, {"model": "m", "max_tokens": 5}, "s1") == {
        "model": "m", "max_tokens": 5, "cache_salt": "s1"}
    with pytest.raises(ValueError, match="give the expected salt"):
        forwarded(chat, sent)


def test_a_large_body_is_judged_by_the_witness_outline() -> None:
    from scanner.probe.checks.limits import body_received
    from scanner.probe.interface import WitnessRecord
    sent = json.dumps({"model": "m", "pad": "a" * 70_000, "cache_salt": "mine"}).encode()
    want = {"model": "m", "pad": "a" * 70_000, "cache_salt": "s" * 64}

    def seen(short: dict[str, object], keys: tuple[str, ...] = ("cache_salt", "model", "pad")) -> WitnessRecord:
        return WitnessRecord("POST", "/", body_bytes=len(sent), outline={"keys": list(keys), "short": short})
    assert body_received(sent, seen({"model": "m", "cache_salt": "s" * 64}), want) == ("proved", "")
    verdict, why = body_received(sent, seen({"model": "m", "cache_salt": "mine"}), want)
    assert verdict == "failed" and 'cache_salt: "mine" reached the upstream' in why
    verdict, why = body_received(sent, seen({"model": "m"}, ("model", "pad")), want)
    assert verdict == "failed" and "cache_salt: absent upstream" in why


@pytest.mark.parametrize(("body", "message"), [
    ("{cache_salt: per-principal}", "needs cache_salt_secret_file"),
    ("{cache_salt: reject, cache_salt_secret_file: /etc/s}", "only cache_salt: per-principal or per-audience"),
    ("{cache_salt: per-audience, cache_salt_secret_file: rel/s}", "give an absolute path"),
    ("{cache_salt: per-tenant}", "is not one of"),
])
def test_salt_policy_errors(body: str, message: str) -> None:
    text = ("schema_version: 1\nname: t\nnetworks: {n: [127.0.0.1/32]}\n"
            "audiences:\n  a: {kind: end-user, networks: [n], auth: none}\n"
            f"body: {body}\n"
            "routes:\n  - {path: /v1/models, audience: a}\n")
    with pytest.raises(PolicyError) as err:
        loads(text, source="p.yaml")
    assert message in str(err.value)


def test_secret_file_is_made_0600_and_refused_when_others_may_read_it(tmp_path: Path) -> None:
    path = tmp_path / "salt.secret"
    res = CliRunner().invoke(cli, ["keys", "salt-secret", "--out", str(path)])
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = read_secret(str(path))
    assert secret.decode() not in res.output
    assert salt(secret, "principal:a") == hmac.new(secret, b"principal:a", hashlib.sha256).hexdigest()
    assert salt(secret, "principal:a") != salt(secret, "principal:b")
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match="readable by others"):
        read_secret(str(path))
    short = tmp_path / "short"
    short.write_text("abc\n")
    os.chmod(short, 0o600)
    with pytest.raises(ConfigError, match="at least 32"):
        read_secret(str(short))


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
def test_salts_are_written_only_into_the_0600_files(tmp_path: Path, name: str) -> None:
    secret_file = tmp_path / "salt.secret"
    new_secret(secret_file)
    secret = read_secret(str(secret_file))
    policy = _salted(secret_file=str(secret_file))
    from scanner.policy.model import Principal
    policy = replace(policy, principals=(Principal("alice", "user", "a" * 64), Principal("bob", "user", "b" * 64)))
    plan = build(load_ref(CATALOG), policy)
    out = tmp_path / "out"
    proxy_named(name).write(plan, out)
    alice, bob = salt(secret, "principal:alice"), salt(secret, "principal:bob")
    holders = []
    for f in sorted(x for x in out.rglob("*") if x.is_file()):
        text = f.read_text(encoding="utf-8", errors="replace")
        assert secret.decode() not in text, f.name
        if alice in text:
            assert bob in text and stat.S_IMODE(f.stat().st_mode) == 0o600, f.name
            holders.append(f.name)
    assert holders == (["perimeter-principals.conf"] if name.startswith("nginx") else ["envoy-principals.tsv"])


# --- the real proxies ---------------------------------------------------------------------------

@pytest.fixture(params=["nginx", "nginx-debian", "nginx-lua", "envoy"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return proxy_named(request.param)


def _seen_salts(res: object) -> dict[str, set[str]]:
    """Credential label -> the cache_salt values the witness saw on salted cases."""
    out: dict[str, set[str]] = {}
    for a in res.attempts:   # type: ignore[attr-defined]
        if a.subject.startswith("salt ") and a.upstream is not None and a.upstream.body:
            out.setdefault(a.credential, set()).add(json.loads(a.upstream.body).get("cache_salt"))
    return out


def test_per_principal_salts_are_proved_through_the_proxy(tmp_path: Path, proxy: Proxy) -> None:
    res = probe_through(tmp_path, proxy, _salted(), CATALOG, OPTIONS, keys_per_role=2)
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    salts = [c for c in res.coverage if c.subject.startswith("salt ")]
    assert salts and all(c.status == "proved" for c in salts), [c for c in salts if c.status != "proved"][:3]
    seen = _seen_salts(res)
    users = {k: v for k, v in seen.items() if len(v) == 1}
    assert len(users) >= 2 and len({next(iter(v)) for v in users.values()}) == len(users), seen
    assert "probe-x1" not in {s for v in seen.values() for s in v}


def test_per_audience_salt_is_proved(tmp_path: Path) -> None:
    res = probe_through(tmp_path, proxy_named("envoy"), _salted("per-audience"), CATALOG, OPTIONS,
                        keys_per_role=2)
    assert not res.findings, [(f.rule, f.title, f.evidence[:1]) for f in res.findings]
    salts = [c for c in res.coverage if c.subject.startswith("salt ")]
    assert salts and all(c.status == "proved" for c in salts)


def test_without_the_secret_the_salt_is_not_proven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scanner.verify import loop
    original = loop.probe_options

    def no_secret(s: loop.Setup, base: ProbeOptions, witness: str) -> ProbeOptions:
        return replace(original(s, base, witness), salt_secret="")
    monkeypatch.setattr(loop, "probe_options", no_secret)
    res = probe_through(tmp_path, proxy_named("envoy"), _salted(), CATALOG, OPTIONS)
    assert [f.rule for f in res.findings] == ["VP011"], [(f.rule, f.title) for f in res.findings]
    assert {c.subject.split()[0] for c in res.coverage if c.status == "not-proven"} == {"salt"}
    salts = [c for c in res.coverage if c.subject.startswith("salt ")]
    assert salts and all(c.status == "not-proven" and "--salt-secret-file" in c.why for c in salts), salts[:2]


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_a_route_forwarding_the_clients_salt_is_caught(tmp_path: Path, name: str) -> None:
    res = probe_through(tmp_path, proxy_named(name), _salted(), CATALOG, OPTIONS, mutant="salt-not-rewritten")
    assert any(f.rule == "VP015" and "cache_salt" in f.detail for f in res.findings), \
        [(f.rule, f.title, f.detail[:200]) for f in res.findings]
