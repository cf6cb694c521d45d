"""The identity check (bearer tokens of auth: jwt audiences) through the real proxies, keys and
tokens side by side in one policy: exit 0 on the generated configs; every jwt mutation operator
caught by it (exit 1). The stand-in and its witness behind the proxy; verify's test issuer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scanner.policy.load import loads
from scanner.probe.interface import ProbeOptions, ProbeResult
from scanner.probe.tokens_jwt import Issuer
from tests.generate.test_jwt_live import POLICY
from tests.probe.realproxy import probe_through, proxy_named

CATALOG = "vllm-0.29.0-default"
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=300, checks=("identity", "matrix", "upstream"))


def _policy(tmp_path: Path):  # type: ignore[no-untyped-def]
    Issuer.new().write_jwks(tmp_path / "jwks.json")
    return loads(POLICY, source=str(tmp_path / "policy.yaml"), base_dir=tmp_path)


def _run(tmp_path: Path, proxy: str, mutant: str = "", checks: tuple[str, ...] = OPTIONS.checks) -> ProbeResult:
    return probe_through(tmp_path, proxy_named(proxy), _policy(tmp_path), CATALOG,
                         replace(OPTIONS, checks=checks), mutant=mutant)


@pytest.mark.parametrize("proxy", ["envoy", "nginx"])
def test_identity_and_access_hold(tmp_path: Path, proxy: str) -> None:
    res = _run(tmp_path, proxy)
    assert res.exit_code() == 0, [(f.rule, f.title, f.detail[:300]) for f in res.findings]
    covered = {c.subject: c.status for c in res.coverage if c.check == "identity"}
    assert covered and set(covered.values()) == {"proved"}, covered
    assert any(s.startswith("token admitted GET /v1/models") for s in covered)


JWT_OPERATORS = ("jwt-signature-unchecked", "jwt-audience-unchecked", "jwt-expiry-unchecked",
                 "jwt-issuer-unchecked", "jwt-crit-ignored", "jwt-issuer-prefix", "jwt-trailing-accepted")
# the cases each of these operators lets through, and only those (by name: tokens_jwt.cases)
LET_THROUGH = {
    "jwt-issuer-prefix": {"jwt:iss suffix-extended 'https://issuer.example2'",
                          "jwt:iss trailing slash 'https://issuer.example/'",
                          "jwt:iss look-alike 'https://issuer.example.evil.net'"},
    "jwt-trailing-accepted": {"jwt:trailing dot", "jwt:trailing dots", "jwt:trailing padding"},
}


@pytest.mark.parametrize("proxy", ["envoy", "nginx", "nginx-debian"])
@pytest.mark.parametrize("mutant", JWT_OPERATORS)
def test_jwt_operators_caught_by_identity(tmp_path: Path, proxy: str, mutant: str) -> None:
    res = _run(tmp_path, proxy, mutant, checks=("identity",))
    assert res.exit_code() == 1
    caught = {f.rule for f in res.findings if f.check == "identity"}
    assert "VP019" in caught, [(f.rule, f.title) for f in res.findings]
    if mutant in LET_THROUGH:
        failed = {a.credential for a in res.attempts if a.check == "identity" and a.verdict == "failed"}
        assert failed == LET_THROUGH[mutant], failed


@pytest.mark.parametrize("proxy", ["envoy", "nginx"])
def test_look_alike_issuers_and_audiences_refused_without_a_witness(tmp_path: Path, proxy: str) -> None:
    """Signed tokens whose iss or aud is a neighbour of the allowed one (a prefix, suffix-extended,
    case-changed, trailing slash, look-alike host or letters) are refused with jwt-issuer /
    jwt-audience, proven by the proxy's answers alone (no witness): exit 0, each proved."""
    res = probe_through(tmp_path, proxy_named(proxy), _policy(tmp_path), CATALOG,
                        replace(OPTIONS, checks=("identity",)), witness=False)
    alike = [a for a in res.attempts if a.check == "identity" and a.credential.startswith(("jwt:iss ", "jwt:aud "))]
    assert res.exit_code() == 0, [(f.rule, f.title, f.detail[:300]) for f in res.findings]
    # two routes of the people audience, 5 issuer and 5 audience neighbours each
    assert len(alike) == 20 and {a.verdict for a in alike} == {"proved"}, [(a.credential, a.why) for a in alike]
    assert {a.reason for a in alike} == {"jwt-issuer", "jwt-audience"}


@pytest.mark.parametrize("proxy", ["nginx", "nginx-debian"])
def test_duplicates_read_caught_by_identity_on_nginx(tmp_path: Path, proxy: str) -> None:
    """njs's duplicate-member scan removed: the signed token naming its subject twice, and the one
    naming alg twice, are admitted (JSON.parse keeps the last copy): VP019. Envoy has no such
    operator: its jwt_authn refuses a duplicate itself behind Lua's scan."""
    res = _run(tmp_path, proxy, "jwt-duplicates-read", checks=("identity",))
    assert res.exit_code() == 1
    failed = {a.credential for a in res.attempts if a.check == "identity" and a.verdict == "failed"}
    assert {"jwt:claim sub twice", "jwt:header alg twice"} <= failed, failed


@pytest.mark.parametrize("proxy", ["envoy", "nginx", "nginx-debian"])
def test_principal_namespace_collision_caught_by_verify_mutate(tmp_path: Path, proxy: str) -> None:
    """``verify --mutate`` with the operator that drops the token principal's ``jwt:ID:`` prefix:
    the identity check's token whose subject is a key principal's name reaches the upstream named
    as that principal (VP014): caught, by the check the operator names."""
    from scanner.inventory.catalog import load_ref
    from scanner.policy.load import load
    from scanner.verify import mutation

    (tmp_path / "policy.yaml").write_text((Path(__file__).parent / "jwt-keys-and-tokens.yaml").read_text())
    Issuer.new().write_jwks(tmp_path / "jwks.json")
    p = proxy_named(proxy)
    runs, mutants = mutation.mutants(load_ref(CATALOG), load(tmp_path / "policy.yaml"), [p],
                                     replace(OPTIONS, checks=("identity",)), keys_per_role=1,
                                     only=(f"{p.kind}.principal-namespace-collision",))
    assert runs[0].result.exit_code() == 0, [(f.rule, f.title) for f in runs[0].result.findings]
    (m,) = mutants
    assert m.status == "caught" and m.expected and "VP014" in m.rules, (m.status, m.rules, m.what)
    # the token named as a key principal is one of what catches it (its note in the finding)
    (tmp_path / "probe").mkdir()
    res = _run(tmp_path / "probe", proxy, "principal-namespace-collision", checks=("identity",))
    found = [f for f in res.findings if f.check == "identity" and f.rule == "VP014"]
    assert res.exit_code() == 1 and any("a subject named as the principal 'verify-service-1'" in f.detail
                                        for f in found), [(f.rule, f.detail[:300]) for f in res.findings]


@pytest.mark.parametrize("proxy", ["envoy", "nginx"])
def test_verify_keys_tokens_and_open_side_by_side(tmp_path: Path, proxy: str) -> None:
    """Every check through the real proxy (verify's loop): keys, tokens and an open audience in
    one policy; the plan holds (exit 0, every applicable subject proved)."""
    from scanner.inventory.catalog import load_ref
    from scanner.policy.load import load
    from scanner.verify import loop

    text = (Path(__file__).parent / "jwt-keys-and-tokens.yaml").read_text()
    (tmp_path / "policy.yaml").write_text(text)
    Issuer.new().write_jwks(tmp_path / "jwks.json")
    options = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=240)
    (run,) = loop.run(load_ref(CATALOG), load(tmp_path / "policy.yaml"), [proxy_named(proxy)], options,
                      keys_per_role=2)
    res = run.result
    assert res.exit_code(require_proof=True) == 0, [(f.rule, f.title) for f in res.findings]
    assert {c.status for c in res.coverage if c.check == "identity"} == {"proved"}
    assert {c.status for c in res.coverage if c.check == "rate"} == {"proved"}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("proxy", ["envoy", "nginx"])
def test_verify_token_budget_per_token_principal(tmp_path: Path, proxy: str) -> None:
    """The people audience with a token budget (limits.tokens_per_minute): charged and settled per
    token principal, another principal's budget its own (about 200-270 s a proxy: token pacing).
    8000 a minute: the default bucket of 2000 holds the check's requests of 166 (one per multiplier)."""
    from scanner.inventory.catalog import load_ref
    from scanner.policy.load import load
    from scanner.verify import loop

    text = (Path(__file__).parent / "jwt-keys-and-tokens.yaml").read_text().replace(
        "      timeout_s: 60\n", "      timeout_s: 60\n      tokens_per_minute: 8000\n", 1)
    assert "tokens_per_minute" in text
    (tmp_path / "policy.yaml").write_text(text)
    Issuer.new().write_jwks(tmp_path / "jwks.json")
    options = ProbeOptions(rate=0, concurrency=8, timeout=10, max_time=600)
    (run,) = loop.run(load_ref(CATALOG), load(tmp_path / "policy.yaml"), [proxy_named(proxy)], options,
                      keys_per_role=2)
    res = run.result
    assert res.exit_code(require_proof=True) == 0, [(f.rule, f.title) for f in res.findings]
    assert {c.status for c in res.coverage if c.check == "token-budget"} == {"proved"}


def test_a_check_that_cannot_generate_makes_the_run_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A check failing in its subjects or cases (a bug) never leaves the run passing: exit 3."""
    from scanner.probe.checks import identity

    def broken(self: object, ctx: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(identity.Identity, "generate", broken)
    res = _run(tmp_path, "envoy", checks=("identity",))
    assert res.exit_code() == 3 and "check identity failed" in res.reason
