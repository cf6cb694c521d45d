"""Finding rules and the grouping of failed attempts into findings (one per rule, method,
path and vantage, with a few attempts as evidence)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scanner import severity
from scanner.probe.interface import Attempt, Evidence, Finding
from scanner.severity import Severity

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
    Rule("VP005", "high", "limit not enforced",
         "Enforce the plan's body size, JSON caps and rate limits at the perimeter."),
    Rule("VP006", "medium", "expected route blocked",
         "The plan allows this cell: check the allowlist, the key's role and the source network."),
    Rule("VP007", "high", "unexpected route reachable",
         "A known vLLM route the plan does not list answered: re-run inventory for this deployment "
         "and make sure the perimeter denies everything it does not list."),
    Rule("VP008", "medium", "request the perimeter must refuse was forwarded to the upstream",
         "Allow only the plan's methods and paths at the perimeter and answer everything else "
         "there (the upstream refused this one itself, or it was a method or preflight)."),
    Rule("VP010", "high", "proxy forwards the raw request target",
         "Forward the normalised path the perimeter matched (NGINX: a URI in proxy_pass, or "
         "$uri; Envoy: normalize_path and merge_slashes), never the client's raw target."),
    Rule("VP009", "low", "denied only by the upstream's own key guard",
         "vLLM's --api-key refused this, not the perimeter: it was not reached, but the "
         "perimeter should deny it itself (defence in depth)."),
    Rule("VP011", "medium", "not proven",
         "The probe could not establish this (see why): fix the cause (a 5xx, a timeout, a limit "
         "met by another case) and probe again, or prove it another way. Never read it as passed."),
    Rule("VP012", "high", "client credential forwarded to the upstream",
         "Remove Authorization (and Proxy-Authorization) from every request the perimeter "
         "forwards; present the upstream's own key instead if vLLM runs with --api-key."),
    Rule("VP013", "high", "spoofable or hop-by-hop header forwarded to the upstream",
         "Replace or remove X-Forwarded-*, Forwarded, X-Real-IP, X-Original-URL, X-Rewrite-URL, "
         "method overrides and the perimeter's own headers; never forward hop-by-hop headers "
         "(Upgrade, HTTP2-Settings, TE, Proxy-*, headers named in Connection)."),
    Rule("VP014", "high", "principal header missing or chosen by the client",
         "Set X-Perimeter-Principal from the key check only (empty on routes without a key) "
         "and replace any copy the client sent."),
    Rule("VP015", "high", "the upstream received something other than what the plan says",
         "Forward exactly the checked request: the normalised path, the query, and the body with "
         "the policy's stripped fields removed and nothing else changed."),
    Rule("VP016", "medium", "vLLM's own key not presented upstream",
         "With upstream.api_key_file the proxy must send Authorization: Bearer <that key> on every "
         "allowed request (vLLM's --api-key refuses the guarded routes otherwise); check that the "
         "proxy can read the file."),
    Rule("VP018", "high", "the upstream's error text reached the client",
         "Replace every 5xx answer from vLLM by the perimeter's own JSON error with the request id "
         "(its error text has leaked heap addresses: CVE-2026-22778, CVE-2026-54236); NGINX: "
         "proxy_intercept_errors with error_page for the 5xx only, Envoy: the custom_response "
         "filter. vLLM's 4xx validation answers must pass unchanged."),
    Rule("VP019", "critical", "a bearer token the perimeter must refuse was accepted",
         "Verify every token on an auth: jwt route before anything else: its signature with a key "
         "of the JWKS (kid and alg, never none or an HMAC), exp / nbf with the skew, the issuer, the "
         "audience, the required claims and the role map; regenerate the proxy config and reload."),
    Rule("VP021", "critical", "a client certificate the perimeter must refuse was accepted",
         "On an auth: cert route require a client certificate verified against listen.tls.client_ca "
         "(NGINX: ssl_verify_client optional and $ssl_client_verify SUCCESS; Envoy: a validation "
         "context) naming a listed principal by its URI SAN or subject, of a role the route admits; "
         "remove revoked principals, regenerate the proxy config and reload."),
    Rule("VP020", "high", "a stored response reached by a principal it was not handed to",
         "With responses: owned the perimeter seals every response id it hands out to the principal "
         "(id~MAC) and refuses any other (403 not-owner) in the path and in previous_response_id, "
         "forwarding vLLM's own id only; regenerate the proxy config, check that the proxy reads "
         "responses_secret_file, and reload."),
    Rule("VP022", "high", "legacy TLS version or broken cipher suite accepted on the listener",
         "Speak TLS 1.2 and 1.3 only on the perimeter's listener (NGINX: ssl_protocols TLSv1.2 TLSv1.3; "
         "Envoy: tls_params tls_minimum_protocol_version TLSv1_2) with the library's default suites, no "
         "3DES, RC4, DES, NULL, export or MD5 ones; regenerate the proxy config and reload."),
    Rule("VP017", "high", "HTTP/2 cleartext or gRPC accepted on the HTTP/1.1 listener",
         "Serve HTTP/1.1 only on the perimeter's listener (Envoy: codec_type HTTP1; NGINX: no "
         "http2 there) and refuse content-type application/grpc* before any route: a gRPC surface "
         "needs its own allowlist of /package.Service/Method routes."),
)}


def finding_id(rule: str, method: str, path: str, vantage: str, extra: str = "") -> str:
    return severity.finding_id(rule, method, path, vantage, extra)


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
        evidence=tuple(Evidence.of(a) for a in items[:MAX_EVIDENCE]), check=first.check,
    )


MAX_LISTED = 20


def not_proven(check: str, subjects: list[str], method: str, path: str, why: str,
               attempts: list[Attempt]) -> Finding:
    """VP011: ``check`` applies to ``subjects`` but could not prove them, for one reason."""
    rule = RULES["VP011"]
    vantages = sorted({a.vantage for a in attempts})
    more = f" ({len(attempts)} attempts; {MAX_EVIDENCE} shown)" if len(attempts) > MAX_EVIDENCE else ""
    title = subjects[0] if len(subjects) == 1 else f"{len(subjects)} subjects"
    listed = "; ".join(subjects[:MAX_LISTED]) + ("; ..." if len(subjects) > MAX_LISTED else "")
    return Finding(
        id=finding_id("VP011", method, path, check, why if len(subjects) > 1 else subjects[0]),
        rule="VP011", severity=rule.severity, title=f"not proven ({check}): {title}",
        method=method, path=path, vantage=vantages[0] if len(vantages) == 1 else "*",
        detail=f"The {check} check applies here but could not prove it: {why}. Not proven: {listed}.{more}",
        remediation=rule.remediation,
        evidence=tuple(Evidence.of(a) for a in attempts[:MAX_EVIDENCE]), check=check,
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
