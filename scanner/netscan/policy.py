"""Which ports may answer from which network, and the findings for those that should not.

A policy's ``ports:`` section lists the allowed ports and the networks they may answer
from; every other answering port is a finding (default deny). A policy without ``ports:``
allows only its proxy's ``listen.port``, from every network it names.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

from scanner.netscan.model import PortAttempt, PortFinding, ScanVantage
from scanner.netscan.ports import known
from scanner.policy.model import Policy, PortPolicy, PortRule

RULE = "NS001"


def port_policy(policy: Policy) -> PortPolicy:
    if policy.ports is not None:
        return policy.ports
    note = "implied: the policy has no ports: section, so only its proxy's listen.port"
    return PortPolicy(allow=(PortRule(port=policy.listen.port, networks=tuple(policy.networks),
                                      note=note),))


def networks_of(address: str, networks: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Names of the policy networks that contain ``address``."""
    ip = ipaddress.ip_address(address)
    return tuple(name for name, cidrs in networks.items()
                 if any(ip in ipaddress.ip_network(c, strict=False) for c in cidrs
                        if ipaddress.ip_network(c, strict=False).version == ip.version))


def findings(host: str, attempts: Sequence[PortAttempt], vantage: ScanVantage,
             ports: PortPolicy) -> tuple[PortFinding, ...]:
    out = []
    for attempt in attempts:
        if attempt.state != "open":
            continue
        allowed = ports.allowed_networks(attempt.port)
        if set(allowed) & set(vantage.networks):
            continue
        out.append(_finding(host, attempt, vantage, allowed))
    return tuple(out)


SPEAKS = {"h2c": "HTTP/2 in clear text (h2c: a gRPC server or an HTTP/2 listener)",
          "http/1.1": "HTTP/1.1"}


def _finding(host: str, attempt: PortAttempt, vantage: ScanVantage, allowed: Sequence[str]) -> PortFinding:
    k = known(attempt.port)
    what = f"{attempt.port} ({k.name})" if k else f"{attempt.port}"
    where = ", ".join(vantage.networks) or "no policy network"
    allowed_text = (f"the policy allows it only from {', '.join(allowed)}" if allowed
                    else "the policy does not allow it from any network")
    speaks = f"; it speaks {SPEAKS.get(attempt.service, attempt.service)}" if attempt.service else ""
    detail = (f"TCP port {what} on {host} answered ({attempt.reason}, {attempt.method}{speaks}) from "
              f"{vantage.label} (in: {where}); {allowed_text}." + (f" {k.note}" if k else ""))
    remediation = (
        f"Bind {k.name if k else 'the service'} to a private interface or firewall port "
        f"{attempt.port} so it answers only where needed; if this network needs it, add "
        f"`{{port: {attempt.port}, networks: [...]}}` to the policy's ports.allow."
    )
    return PortFinding(
        id=f"{RULE}:{host}:{attempt.port}:{vantage.label}", rule=RULE,
        severity=k.severity if k else "medium",
        title=f"port {what} answers from {where} but the policy does not allow it",
        port=attempt.port, vantage=vantage.label, detail=detail, remediation=remediation,
        evidence=(attempt,),
    )
