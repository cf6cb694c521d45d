from pathlib import Path

import pytest

from scanner.errors import PolicyError
from scanner.policy import keys
from scanner.policy.load import load, loads

REPO = Path(__file__).resolve().parents[2]

BASE = """\
schema_version: 1
name: t
networks:
  users: [127.0.0.1/32]
audiences:
  inference:
    kind: end-user
    networks: [users]
    roles: [user]
  none:
    kind: none
principals:
  - {name: alice, role: user, key_sha256: %s}
routes:
  - {path: /v1/models, methods: [GET], audience: inference}
  - {path: /invocations, audience: none}
""" % ("a" * 64)


def test_default_policy_loads() -> None:
    policy = load(REPO / "policies" / "vllm-default.yaml")
    assert policy.name == "vllm-default"
    assert {a.kind for a in policy.audiences.values()} == {
        "end-user", "service", "operator", "monitoring", "none"}
    by_path = {(r.path, r.methods): r for r in policy.rules}
    assert policy.audiences[by_path[("/pause", ("POST",))].audience].kind == "operator"
    assert policy.audiences[by_path[("/collective_rpc", ())].audience].kind == "none"


def test_minimal_policy() -> None:
    policy = loads(BASE, source="p.yaml")
    assert policy.principals[0].fingerprint == "sha256:" + "a" * 12
    assert policy.rules[0].line == 15
    assert policy.digest.startswith("sha256:")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("  - {path: /v1/models, methods: [GET], audience: inference}",
         "  - {path: /v1/models, methods: [GET], audience: inferense}",
         "p.yaml:15: routes[0].audience: unknown audience 'inferense' (did you mean 'inference'?)"),
        ("  - {path: /invocations, audience: none}",
         "  - {path: /invocations, audence: none}",
         "p.yaml:16: routes[1].audence: unknown key 'audence' (did you mean 'audience'?)"),
        ("  - {path: /invocations, audience: none}",
         "  - {path: /v1/*, audience: none}",
         "p.yaml:16: routes: rule '/v1/*' overlaps rule '/v1/models' at line 15"),
        ("    kind: end-user", "    kind: enduser", "p.yaml:7: audiences.inference.kind: 'enduser' is not one of"),
        ("  users: [127.0.0.1/32]", "  users: [127.0.0.300/32]", "p.yaml:4: networks.users[0]: '127.0.0.300/32' is not"),
        ("    networks: [users]", "    networks: [user]", "p.yaml:8: audiences.inference.networks[0]: unknown network 'user'"),
        ("schema_version: 1", "schema_version: 7", "p.yaml:1: schema_version: this tool reads schema_version 1"),
        ("methods: [GET]", "methods: [FETCH]", "p.yaml:15: routes[0].methods: unknown method 'FETCH'"),
        ("key_sha256: " + "a" * 64, "key_sha256: vp_plaintextkey", "never the key itself"),
        ("    roles: [user]", "    roles: [usr]", "role 'usr' has no principal"),
    ],
)
def test_errors_name_the_line(old: str, new: str, message: str) -> None:
    assert old in BASE
    with pytest.raises(PolicyError) as err:
        loads(BASE.replace(old, new), source="p.yaml")
    assert message in str(err.value)


def test_yaml_syntax_error_has_line() -> None:
    with pytest.raises(PolicyError, match=r"p.yaml:4: not valid YAML"):
        loads("schema_version: 1\nname: x\naudiences: [\n", source="p.yaml")


def test_methods_overlap_only_when_shared() -> None:
    text = BASE.replace("  - {path: /invocations, audience: none}",
                        "  - {path: /v1/models, methods: [POST], audience: none}")
    policy = loads(text, source="p.yaml")
    assert len(policy.rules) == 2


def test_principals_file_and_keys(tmp_path: Path) -> None:
    key = keys.new_key()
    pfile = tmp_path / "principals.yaml"
    keys.append_principal(pfile, "bob", "user", key)
    assert oct(pfile.stat().st_mode & 0o777) == "0o600"
    assert key not in pfile.read_text()
    text = BASE.replace("principals:\n  - {name: alice, role: user, key_sha256: %s}\n" % ("a" * 64),
                        "principals_file: principals.yaml\n")
    (tmp_path / "policy.yaml").write_text(text)
    policy = load(tmp_path / "policy.yaml")
    assert [p.name for p in policy.principals] == ["bob"]
    assert policy.principals[0].key_sha256 == keys.key_sha256(key)


def test_upstream_replicas() -> None:
    policy = loads(BASE + "upstream:\n  servers: [10.0.0.5:8000, '[fd00::5]:8001', vllm-2.llm.svc.:8000]\n"
                   "  balance: round_robin\n  health: {max_fails: 3, eject_s: 20}\n", source="p.yaml")
    up = policy.upstream
    assert up.servers == (("10.0.0.5", 8000), ("fd00::5", 8001), ("vllm-2.llm.svc.", 8000))
    assert (up.host, up.port, up.balance) == ("10.0.0.5", 8000, "round_robin")
    assert (up.health.max_fails, up.health.eject_s) == (3, 20)
    one = loads(BASE + "upstream: {host: 10.0.0.9, port: 9000}\n", source="p.yaml").upstream
    assert one.servers == (("10.0.0.9", 9000),) and one.balance == "least_conn" and not one.replicas


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ("{servers: [10.0.0.5:8000], host: 10.0.0.6}", "give either servers or host and port"),
        ("{servers: []}", "expected at least one host:port"),
        ("{servers: [10.0.0.5]}", "'10.0.0.5' is not host:port"),
        ("{servers: ['fd00::5:8000']}", "is not host:port (IPv6 as [addr]:port)"),
        ("{servers: [10.0.0.5:80000]}", "is not host:port"),
        ("{servers: ['bad host:8000']}", "'bad host' is not an IP address or a host name"),
        ("{servers: [10.0.0.5:8000, 10.0.0.5:8000]}", "is listed twice"),
        ("{servers: [a:1, b:1], tls: {ca: /c.pem}}", "several servers need tls.server_name"),
        ("{servers: [a:1], balance: random}", "'random' is not one of least_conn, round_robin"),
        ("{servers: [a:1], health: {max_fails: 0}}", "expected a whole number >= 1"),
        ("{port: 70000}", "port 70000 is not in 1..65535"),
    ],
)
def test_upstream_replica_errors_name_the_line(upstream: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        loads(BASE + f"upstream: {upstream}\n", source="p.yaml")
    assert "p.yaml:" in str(err.value) and message in str(err.value)


@pytest.mark.parametrize(("old", "new", "message"), [
    ("  - {path: /invocations, audience: none}", "  - {path: /invocations, audience: none, line: 3}",
     "p.yaml:16: routes[1].line: unknown key 'line'"),
    ("  none:\n    kind: none\n", "  none:\n    kind: none\n    name: other\n",
     "p.yaml:12: audiences.none.name: unknown key 'name'"),
    ("    roles: [user]\n", "    roles: [user]\n    limits: {rate: {rps: 1, burts: 2}}\n",
     "p.yaml:10: audiences.inference.limits.rate.burts: unknown key 'burts' (did you mean 'burst'?)"),
    ("    roles: [user]\n", "    roles: [user]\n    limits: {timeout_s: '5'}\n",
     "p.yaml:10: audiences.inference.limits.timeout_s: expected a positive number, got '5'"),
    ("  none:\n    kind: none\n", "  none:\n    networks: [users]\n",
     "p.yaml:11: audiences.none: missing required key 'kind'"),
])
def test_internal_fields_are_not_keys_and_values_keep_their_type(old: str, new: str, message: str) -> None:
    """What the models set themselves (a line, an audience's name) is no key a user writes; a
    quoted number is not a number."""
    with pytest.raises(PolicyError) as err:
        loads(BASE.replace(old, new), source="p.yaml")
    assert str(err.value) == message


def test_a_principals_file_error_names_that_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "principals.yaml").write_text("principals:\n  - {name: bob, role: user, key_sha256: abc}\n")
    text = BASE.replace("principals:\n  - {name: alice, role: user, key_sha256: %s}\n" % ("a" * 64),
                        "principals_file: principals.yaml\n")
    with pytest.raises(PolicyError) as err:
        loads(text, source="p.yaml", base_dir=tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'principals.yaml'}:2: principals[0].key_sha256: expected the "
                                     "sha256 hex digest")


def test_the_schema_names_the_keys_the_loader_reads() -> None:
    """The published schema is generated from the models: each section's properties are the keys
    its model reads (renamed and reshaped keys by their YAML names, internal fields left out)."""
    from scanner import documents
    from scanner.policy import model

    defs = documents.json_schema("policy")["$defs"]
    for name, schema in defs.items():
        assert sorted(schema["properties"]) == sorted(getattr(model, name).yaml_keys()), name
    top = documents.json_schema("policy")
    assert sorted(top["properties"]) == sorted(model.Policy.yaml_keys())
    assert top["required"] == ["name", "audiences", "routes", "schema_version"]
