"""The expected outcome of one cell, from the plan alone."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from scanner.plan.model import Decision
from scanner.probe.interface import Credential

# Why a cell is expected to be denied; "" when it is expected to be allowed.
Why = Literal["", "plan", "network", "auth", "role"]


@dataclass(frozen=True)
class Expectation:
    expected: Literal["allow", "deny"]
    why: Why


ALLOW = Expectation("allow", "")


@lru_cache(maxsize=4096)
def in_networks(address: str | None, cidrs: tuple[str, ...]) -> bool:
    """Is ``address`` in one of ``cidrs``? An unknown address is assumed inside."""
    if address is None:
        return True
    ip = ipaddress.ip_address(address)
    return any(ip in ipaddress.ip_network(c, strict=False) for c in cidrs)


def credential_ok(decision: Decision, cred: Credential) -> Why:
    if decision.auth == "none":
        return ""
    if cred.kind != "role":
        return "auth"
    if decision.roles and cred.role not in decision.roles:
        return "role"
    return ""


def expect(decision: Decision | None, cred: Credential, source_address: str | None) -> Expectation:
    """Allowed only if the plan allows it, the source is in its networks and the key fits."""
    if decision is None or not decision.allowed:
        return Expectation("deny", "plan")
    why = credential_ok(decision, cred)
    if why:
        return Expectation("deny", why)
    if not in_networks(source_address, decision.networks):
        return Expectation("deny", "network")
    return ALLOW
