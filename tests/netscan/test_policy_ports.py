"""The policy's optional ports: section, validated with lines like the rest."""

from __future__ import annotations

import pytest

from scanner.errors import PolicyError
from scanner.policy.load import loads

HEAD = """\
schema_version: 1
name: t
networks:
  public: [0.0.0.0/0]
  admin: [10.30.0.0/16]
audiences:
  none: {kind: none}
routes:
  - {path: /x, audience: none}
"""


def test_ports_section_loads() -> None:
    p = loads(HEAD + "ports:\n  allow:\n    - {port: 8443, networks: [public]}\n"
              "    - {port: 29500, networks: [admin], note: rendezvous}\n")
    assert p.ports is not None
    assert p.ports.allowed_networks(8443) == ("public",)
    assert p.ports.allowed_networks(29500) == ("admin",) and p.ports.allow[1].line == 13
    assert p.ports.allowed_networks(1) == ()
    assert loads(HEAD).ports is None


@pytest.mark.parametrize("section, message", [
    ("ports:\n  allow:\n    - {port: 70000, networks: [public]}\n", ":12: ports.allow[0].port: expected a TCP port"),
    ("ports:\n  allow:\n    - {port: 1, networks: [publik]}\n", ":12: ports.allow[0].networks[0]: unknown network 'publik' (did you mean 'public'?)"),
    ("ports:\n  allow:\n    - {port: 1, networks: []}\n", "name at least one network"),
    ("ports:\n  allow:\n    - {port: 1, networks: [public]}\n    - {port: 1, networks: [admin]}\n",
     ":13: ports.allow[1].port: port 1 is already allowed at line 12"),
    ("ports:\n  alow: []\n", ":11: ports.alow: unknown key 'alow' (did you mean 'allow'?)"),
    ("ports:\n  allow:\n    - {port: 1}\n", "missing required key 'networks'"),
])
def test_ports_errors_name_their_line(section: str, message: str) -> None:
    with pytest.raises(PolicyError) as exc:
        loads(HEAD + section)
    assert message in str(exc.value)
