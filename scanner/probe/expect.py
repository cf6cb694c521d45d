"""The expected outcome of one cell, from the plan alone: allowed, or denied and for which
reasons (:mod:`scanner.reasons`). A denial is proven only by one of those reasons."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from scanner.plan.model import Decision
from scanner.probe.interface import Credential


@dataclass(frozen=True)
class Expectation:
    """``allow``: the upstream must answer, unless the perimeter refuses for one of ``reasons``
    (e.g. ``rate`` during a burst). ``deny``: the perimeter must refuse for one of ``reasons``."""

    expected: Literal["allow", "deny"]
    reasons: tuple[str, ...] = ()

    @property
    def denied(self) -> bool:
        return self.expected == "deny"


ALLOW = Expectation("allow")
NOT_ALLOWLISTED = Expectation("deny", ("not-allowlisted",))


@lru_cache(maxsize=4096)
def in_networks(address: str | None, cidrs: tuple[str, ...]) -> bool:
    """Is ``address`` in one of ``cidrs``? An unknown address is assumed inside."""
    if address is None:
        return True
    ip = ipaddress.ip_address(address)
    return any(ip in ipaddress.ip_network(c, strict=False) for c in cidrs)


# Any refusal of a bearer token that is not one the route's audience takes (an API key, another
# audience's token, a malformed one): what it fails depends on the token.
JWT_REFUSALS: tuple[str, ...] = ("jwt-invalid", "jwt-issuer", "jwt-audience", "jwt-expired",
                                 "jwt-not-yet-valid", "jwt-claim", "jwt-role", "role")


def token_reasons(decision: Decision, cred: Credential) -> tuple[str, ...]:
    """Why the token check of an auth "jwt" route refuses ``cred`` (empty: it admits it)."""
    if cred.kind in ("none", "cert"):
        return ("jwt-missing",)
    if cred.kind == "malformed":
        return ("jwt-missing", "jwt-invalid")
    if cred.kind != "token":
        return ("jwt-invalid",)
    if decision.audience not in cred.audiences:
        return JWT_REFUSALS
    if decision.roles and cred.role not in decision.roles:
        return ("role",)
    return ()


def cert_reasons(decision: Decision, cred: Credential) -> tuple[str, ...]:
    """Why the certificate check of an auth "cert" route refuses ``cred`` (empty: it admits it).
    A credential that is no certificate presents none; a certificate names a principal of its
    role (the identity check sends the ones that do not)."""
    if cred.kind != "cert":
        return ("cert-missing",)
    if decision.roles and cred.role not in decision.roles:
        return ("role",)
    return ()


def key_reasons(decision: Decision, cred: Credential) -> tuple[str, ...]:
    """Why the key (or token, or certificate) check refuses ``cred`` on ``decision`` (empty: it
    admits it)."""
    if decision.auth == "none":
        return ()
    if decision.auth == "jwt":
        return token_reasons(decision, cred)
    if decision.auth == "cert":
        return cert_reasons(decision, cred)
    if cred.kind == "token":
        return ("unknown-key",)
    if cred.kind in ("none", "cert"):
        return ("missing-key",)
    if cred.kind == "malformed":
        return ("missing-key", "unknown-key")   # "Bearer" with no token: either reading is a refusal
    if cred.kind != "role":
        return ("unknown-key",)
    if decision.roles and cred.role not in decision.roles:
        return ("role",)
    return ()


def expect(decision: Decision | None, cred: Credential, source_address: str | None,
           path_allowed: tuple[Decision, ...] = ()) -> Expectation:
    """Allowed only if the plan allows it, the source is in its networks and the key fits.

    ``path_allowed``: the allowed decisions on the same path. A method the path does not
    allow is refused as ``method-not-allowed`` where some method is allowed (NGINX may check
    the network first), as ``not-allowlisted`` where none is.
    """
    if decision is None or not decision.allowed:
        if not path_allowed:
            return NOT_ALLOWLISTED
        outside = any(not in_networks(source_address, d.networks) for d in path_allowed)
        return Expectation("deny", ("method-not-allowed", "network") if outside else ("method-not-allowed",))
    reasons: tuple[str, ...] = () if in_networks(source_address, decision.networks) else ("network",)
    reasons += key_reasons(decision, cred)
    return Expectation("deny", reasons) if reasons else ALLOW


def rule_for(exp: Expectation) -> str:
    """The finding rule when a request denied for ``exp.reasons`` got through."""
    why = set(exp.reasons)
    if why & {"not-allowlisted", "method-not-allowed", "missing-key", "unknown-key", "jwt-missing",
              "jwt-invalid", "cert-missing", "cert-invalid", "cert-unknown"}:
        return "VP001"
    if why & {"role", "jwt-role"}:
        return "VP002"
    if "network" in why:
        return "VP003"
    return "VP001"
