"""Finding rules and the grouping of failed attempts into findings (one per rule, method,
path and vantage, with a few attempts as evidence)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scanner.probe.interface import Attempt, Evidence, Finding, Severity

MAX_EVIDENCE = 5


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    title: str
    remediation: str


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("VP001", "critical", "unauthorised route reachable",
         "Deny this method and path at the perimeter (default deny); regenerate the proxy config "
         "from the plan and reload it."),
    Rule("VP002", "high", "wrong role allowed",
         "Check the key-to-role mapping at the perimeter: only the audience's roles may pass."),
    Rule("VP003", "high", "disallowed network reached",
         "Restrict the route to the audience's networks by the connection's source address; "
         "trust X-Forwarded-For only from trusted_proxies."),
    Rule("VP004", "critical", "denied route reachable through a request variant",
         "Match on the normalised path and reject ambiguous targets (encoded slashes, dot "
         "segments, path parameters, absolute-form) before routing; forward the normalised path."),
    Rule("VP005", "medium", "limit not enforced",
         "Enforce the plan's body size, JSON caps and rate limits at the perimeter."),
    Rule("VP006", "medium", "expected route blocked",
         "The plan allows this cell: check the allowlist, the key's role and the source network."),
    Rule("VP007", "high", "unexpected route reachable",
         "A known vLLM route the plan does not list answered: re-run inventory for this deployment "
         "and make sure the perimeter denies everything it does not list."),
    Rule("VP008", "low", "undeclared method or preflight forwarded to the upstream",
         "Allow only the plan's methods per path at the perimeter; answer everything else there."),
    Rule("VP010", "high", "proxy forwards the raw request target",
         "Forward the normalised path the perimeter matched (NGINX: a URI in proxy_pass, or "
         "$uri; Envoy: normalize_path and merge_slashes), never the client's raw target."),
    Rule("VP009", "low", "denied only by the upstream's own key guard",
         "vLLM's --api-key refused this, not the perimeter: it was not reached, but the "
         "perimeter should deny it itself (defence in depth)."),
)}


def finding_id(rule: str, method: str, path: str, vantage: str, extra: str = "") -> str:
    h = hashlib.sha256(f"{rule} {method} {path} {vantage} {extra}".encode()).hexdigest()[:10]
    return f"{rule}-{h}"


def make(rule_id: str, attempts: Iterable[Attempt], detail: str, *, severity: Severity | None = None,
         title: str = "", extra: str = "", method: str = "") -> Finding:
    """One finding from the attempts that prove it (all of one method, path and vantage)."""
    rule = RULES[rule_id]
    items = list(attempts)
    first = items[0]
    method = method or first.method
    more = f" ({len(items)} attempts; {MAX_EVIDENCE} shown)" if len(items) > MAX_EVIDENCE else ""
    return Finding(
        id=finding_id(rule_id, method, first.path, first.vantage, extra),
        rule=rule_id, severity=severity or rule.severity,
        title=f"{title or rule.title}: {method} {first.path}",
        method=method, path=first.path, vantage=first.vantage,
        detail=detail + more, remediation=rule.remediation,
        evidence=tuple(Evidence.of(a) for a in items[:MAX_EVIDENCE]),
    )


def group(pairs: Iterable[tuple[str, Attempt]],
          method_of: Callable[[str, Attempt], str] | None = None,
          ) -> dict[tuple[str, str, str, str], list[Attempt]]:
    """Attempts keyed by (rule, method, path, vantage), in first-seen order."""
    out: dict[tuple[str, str, str, str], list[Attempt]] = {}
    for rule, a in pairs:
        method = method_of(rule, a) if method_of else a.method
        out.setdefault((rule, method, a.path, a.vantage), []).append(a)
    return out
