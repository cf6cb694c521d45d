"""The prober's seam: what goes in (plan, target, credentials, vantages, options) and what
comes out (a stream of events, summarised into a :class:`ProbeResult`).

``run_probe(plan, target, credentials, vantages, options)`` is an async iterator of
:data:`Event`; :func:`scanner.probe.runner.summarize` folds the events into a result whose
:meth:`ProbeResult.exit_code` is the one exit code of the run. Every request is an
:class:`Attempt` (an unreachable route is data, not a traceback); checks turn attempts
into :class:`Finding` records. Key values live only in :class:`Credential` (``repr=False``)
and never reach an attempt, a finding or a writer: those carry a label and a fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Literal

import httpx
from pydantic import Field

from scanner import jsondoc
from scanner.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNREACHABLE
from scanner.jsondoc import CONFIG, Int, Num, Str
from scanner.severity import FAIL_ON_DEFAULT, SEVERITIES, Severity, fails

if TYPE_CHECKING:
    from scanner.probe.canary import Canary

Layer = Literal["proxy", "upstream", "none"]
# What an answer means for reachability:
#   denied    the perimeter (marker header) refused it (X-Perimeter-Reason says why)
#   limited   the perimeter throttled it (429: rate or concurrency)
#   guarded   the upstream's own guard refused it (vLLM's 401 on its key-guarded prefixes)
#   absent    the upstream has no such route (404) or rejected the request line (400, not JSON)
#   reached   the upstream answered anything else: the request got through
#   error     nothing answered (timeout, connection refused, TLS failure, ...), or the proxy
#             failed (5xx with the marker)
#   skipped   not sent (would change server state; see --allow-state-changes)
Outcome = Literal["denied", "limited", "guarded", "absent", "reached", "error", "skipped"]
# What an answer proves against the plan's expectation (scanner.probe.verdict):
#   proved        allowed and answered by the upstream, or refused for an expected reason
#   failed        the perimeter let through what it must deny, or refused what it must allow
#   inconclusive  another answer (a 429 on a body case, a proxy 5xx, a timeout): retried, and
#                 reported as "not proven" if it stays so
#   skipped       not sent
Verdict = Literal["proved", "failed", "inconclusive", "skipped"]
VERDICTS: tuple[Verdict, ...] = ("proved", "failed", "inconclusive", "skipped")
# "token": a bearer token (auth "jwt"), valid for ``audiences`` with ``role``, naming ``principal``
# "cert": a client certificate (auth "cert") presented in the TLS handshake, naming ``principal``
# of ``role``; no Authorization header
CredentialKind = Literal["none", "malformed", "wrong", "role", "token", "cert"]
PROBE_SCHEMA_VERSION: Final = 1


@dataclass(frozen=True)
class Credential:
    """One way of presenting (or not) an API key. ``secret`` never leaves this object."""

    label: str
    kind: CredentialKind
    role: str = ""
    secret: str = field(default="", repr=False, compare=False)
    fingerprint: str = ""
    audiences: tuple[str, ...] = ()   # a token: the auth "jwt" audiences whose rules it meets
    principal: str = ""               # a token: the principal its principal claim names
    cert_file: str = ""               # a certificate: its PEM file, and its key's (never printed)
    key_file: str = field(default="", repr=False, compare=False)
    # a certificate the listener must refuse (another CA's, expired): sent over TLS 1.2, where the
    # refusal is part of the handshake (TLS 1.3 sends it after the client's Finished, racing the
    # request's write: a broken pipe proves nothing)
    refused_in_handshake: bool = False
    scheme: str = "Bearer"            # the Authorization scheme (a token may be sent as "bearer")

    def headers(self) -> dict[str, str]:
        if self.kind in ("none", "cert"):
            return {}
        if self.kind == "malformed":
            return {"Authorization": "Bearer"}
        return {"Authorization": f"{self.scheme} {self.secret}"}


@dataclass(frozen=True)
class Vantage:
    """Where requests come from: a name and the local address to bind (None: the OS picks)."""

    name: str = "default"
    address: str | None = None


@dataclass(frozen=True)
class Target:
    base_url: str
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    @cached_property
    def url(self) -> httpx.URL:
        return httpx.URL(self.base_url)


TransportFactory = Callable[[Vantage], httpx.AsyncBaseTransport]


@dataclass(frozen=True)
class ProbeOptions:
    concurrency: int = 8
    rate: float = 50.0             # requests per second over the whole run (bursts excepted)
    timeout: float = 5.0           # per request
    pipeline: int = 1              # HTTP/1.1 requests in flight per connection (1: no pipelining)
    client: Literal["stream", "httpx"] = "stream"  # httpx: AsyncClient (slower; never pipelines)
    max_time: float | None = 120.0  # whole run; None: derived from the plan's lower bound
                                    # (scanner.probe.pace.time_limit: probe --max-time auto)
    auto_floor_s: float = 0.0      # ... and then at least this long (verify --max-time auto: 300)
    allow_state_changes: bool = False
    checks: tuple[str, ...] = ()   # empty: every registered check
    catalog_dir: str | None = None  # known-route sweep: directory of catalog JSON files
    max_burst: int = 1000          # hard cap on one rate-limit burst
    max_body_bytes: int = 32 * 1024 * 1024  # body-limit checks above this are skipped
    max_tries: int = 3             # sends per case while its answer is inconclusive
    witness: str | None = None     # base URL of the upstream witness (stand-in), if any
    # the witness secret (probe --witness-secret): the witness is then the middleware inside vLLM
    # (scanner/witness_asgi.py): each request is tagged with it, the records read back sealed
    witness_secret: str = field(default="", repr=False, compare=False)
    upstream_key: str = ""         # fingerprint of vLLM's own key, when known (verify): the one the
                                   # witness must see with the plan's upstream.api_key_file
    stop_on_failure: bool = False  # stop sending at the first failed case (mutation runs)
    lead_check: str = ""           # this check's cases first in every lane (mutation runs: the one
                                   # expected to catch the mutant; every other check still runs)
    # the policy's cache_salt secret (--salt-secret-file; verify: its throwaway one): the salt a
    # salted route must write is known only with it
    salt_secret: str = field(default="", repr=False, compare=False)
    # the policy's responses secret (responses: owned; --responses-secret-file; verify: its
    # throwaway one): with it the ownership check also verifies every seal it is handed
    owner_secret: str = field(default="", repr=False, compare=False)
    # the issuer's private key (PEM file; probe --jwt-signing-key, verify: its test issuer's): the
    # identity check signs its token cases with it; without it only refusals are proven
    jwt_signing_key: str = field(default="", repr=False, compare=False)
    # a CA whose certificate is the listener's client CA, "CERT,KEY" PEM files (probe --cert-ca,
    # verify: its test CA's): the mtls check then issues its own client certificates (an expired
    # one, an unknown name, each certificate principal's); without it only --cert ones are sent
    cert_ca: str = field(default="", repr=False, compare=False)
    # the running SSRF canary (probe --ssrf-canary; scanner.probe.canary), None: not probed
    canary: Canary | None = field(default=None, compare=False, repr=False)
    # a fleet (verify --replicas): the other replicas' base URLs; the rate, concurrency and token
    # budget cases are spread over the target and these (scanner.probe.fleet): limits of the sum
    replicas: tuple[str, ...] = ()
    # Tests inject transports; a custom transport also carries the raw-request cases.
    transport_factory: TransportFactory | None = field(default=None, compare=False)


@dataclass(frozen=True)
class WitnessRecord:
    """What the upstream witness recorded for one probe request (credentials as fingerprints)."""

    __pydantic_config__: ClassVar = CONFIG
    method: Str
    path: Str                      # the raw path the proxy sent
    query: Str = ""                # without the probe's own parameters
    headers: tuple[tuple[Str, Str], ...] = ()   # the watched ones (scanner.probe.witness.WATCHED)
    body_bytes: Int = 0
    body_sha256: Str = ""
    body: Str | None = None        # JSON object bodies up to 64 KiB
    # a larger JSON object: its top-level names and the members of at most 1 KiB (not reported)
    outline: Annotated[Mapping[str, Any] | None, Field(exclude=True)] = field(default=None, compare=False)
    held_ms: Num = 0.0           # how long the witness held it (vp_hold); > 0: in flight during the hold
    # how many times it reached the upstream (> 1: the proxy resent it; 1 is left out of a document)
    arrivals: Annotated[Int, Field(exclude_if=lambda v: v == 1)] = 1

    def header(self, name: str) -> str | None:
        """The value of ``name`` (lower case) if it reached the upstream (several: joined)."""
        values = [v for k, v in self.headers if k == name]
        return ", ".join(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out



@dataclass(frozen=True)
class Attempt:
    """One request and what came back. Never holds a key value."""

    __pydantic_config__: ClassVar = CONFIG
    check: Str
    method: Str
    path: Str                      # the route template the case is about
    request_line: Str              # what was sent: "POST /v1/../invocations HTTP/1.1"
    credential: Str                # credential label
    fingerprint: Str               # of the key used, "" if none
    vantage: Str
    expected: Literal["allow", "deny"]
    status: Int | None = None
    error: Str = ""                # timeout, connect-refused, tls: ..., skipped: ...
    layer: Layer = "none"
    decision: Str = ""             # the marker header's value when the proxy answered
    outcome: Outcome = "error"
    latency_ms: Num = 0.0
    sent_at: Num = 0.0           # monotonic clock when sent (durations within one run only)
    note: Str = ""                 # which variant, which limit, ...
    reason: Str = ""               # X-Perimeter-Reason of a proxy answer
    reasons: tuple[Str, ...] = ()  # the reasons that prove the expected denial (scanner.reasons)
    verdict: Verdict = "inconclusive"
    why: Str = ""                  # what the verdict rests on, for the report
    tries: Int = 1                 # 1 for the first send of a case, 2.. for retries
    probe_id: Str = ""             # correlates the request with the upstream witness's record
    subject: Str = ""              # the plan decision or limit this attempt is evidence for
    upstream: WitnessRecord | None = None  # what reached the upstream (a witness run only)
    answer_body: Str = ""          # the answer's body (latin-1) of a case with ``answer`` (first 8 KiB)
                                   # or ``read_answer`` (first 64 KiB)
    open_ms: Num = 0.0           # a stream held by the client (Case.stream_hold): how long its answer was
                                   # still coming from the upstream when the client closed it (0: ended first)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out


@dataclass(frozen=True)
class Evidence:
    __pydantic_config__: ClassVar = CONFIG
    request_line: Str
    credential: Str
    vantage: Str
    status: Int | None
    layer: Layer
    outcome: Outcome
    note: Str = ""
    reason: Str = ""               # X-Perimeter-Reason of a proxy answer
    why: Str = ""                  # what the verdict rests on

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out

    @staticmethod
    def of(a: Attempt) -> Evidence:
        return Evidence(a.request_line, a.credential, a.vantage, a.status, a.layer, a.outcome, a.note,
                        a.reason, a.why)


CoverageStatus = Literal["proved", "failed", "not-proven", "not-applicable"]
COVERAGE_STATUSES: tuple[CoverageStatus, ...] = ("proved", "failed", "not-proven", "not-applicable")


@dataclass(frozen=True)
class Coverage:
    """What one check established about one plan decision or limit (its subject)."""

    __pydantic_config__: ClassVar = CONFIG
    check: Str
    subject: Str                   # "POST /v1/chat/completions", "json-cap max_tokens: POST /v1/...", ...
    status: CoverageStatus
    why: Str = ""                  # for not-proven and not-applicable: why; else a short summary
    attempts: Int = 0
    method: Str = ""               # the decision's method and path ("*" for several)
    path: Str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out



@dataclass(frozen=True)
class Finding:
    __pydantic_config__: ClassVar = CONFIG
    id: Str                        # stable: rule + method + path + vantage
    rule: Str                      # e.g. VP001
    severity: Severity
    title: Str
    method: Str
    path: Str
    vantage: Str
    detail: Str
    remediation: Str
    check: Str = ""                # the check that found it
    evidence: tuple[Evidence, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsondoc.dump(self)
        return out



# --- events --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    target: str
    plan_digest: str
    policy: str
    total: int                     # cases planned
    vantages: tuple[str, ...]
    credentials: tuple[tuple[str, str], ...]  # (label, fingerprint)
    started_at: float
    # the run's lower bound from the plan, before anything is sent (scanner.probe.pace.Bound)
    to_send: int = 0               # cases to send (the others are skipped)
    bound_s: float = 0.0           # the run takes at least this long ...
    bound_by: str = ""             # ... set by "rate" (the global --rate) or a lane's key
    lanes: int = 0                 # rate-limited pacing lanes
    rate: float = 0.0              # the global rate (0: unpaced)
    max_time_s: float = 0.0        # the run's time limit (given, or derived from the bound)


@dataclass(frozen=True)
class AttemptDone:
    attempt: Attempt
    # progress when it settled
    done: int = 0                  # cases decided (a retried case counts once, when it settles)
    sent: int = 0                  # requests sent (retries included)
    lanes_left: int = 0            # rate-limited lanes with cases still to send or settle
    eta_s: float = 0.0             # the least time the unsent cases still need


@dataclass(frozen=True)
class Witnessed:
    """An attempt already reported, restated with what the upstream witness saw (its
    ``upstream`` record, and the verdict that follows): it replaces the attempt of that probe id."""

    attempt: Attempt


@dataclass(frozen=True)
class FindingFound:
    finding: Finding


@dataclass(frozen=True)
class Covered:
    coverage: Coverage


@dataclass(frozen=True)
class Interrupted:
    """The run stopped early (Ctrl-C, --max-time): what was proven so far is still reported."""

    reason: str


@dataclass(frozen=True)
class Errored:
    """A check failed with an internal error: the other checks' results still stand."""

    check: str
    message: str


@dataclass(frozen=True)
class Finished:
    elapsed_s: float
    sent: int
    unreachable: bool              # nothing answered, the run was cut short, or TLS failed
    reason: str = ""               # why unreachable or partial, for the user


Event = Started | AttemptDone | Witnessed | FindingFound | Covered | Interrupted | Errored | Finished


@dataclass(frozen=True)
class ProbeResult:
    target: str
    plan_digest: str
    policy: str
    vantages: tuple[str, ...]
    credentials: tuple[tuple[str, str], ...]
    attempts: tuple[Attempt, ...]
    findings: tuple[Finding, ...]
    elapsed_s: float
    unreachable: bool
    reason: str = ""
    coverage: tuple[Coverage, ...] = ()

    def exit_code(self, fail_on: Severity = FAIL_ON_DEFAULT, require_proof: bool = False) -> int:
        """The one exit code of a run: 3 unreachable/partial; 1 a deviation from the plan (any
        finding but "not proven", at or above ``fail_on``), or with ``require_proof`` a subject
        not proven; else 0: the plan holds."""
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_FINDINGS if fails(((f.rule, f.severity) for f in self.findings), fail_on,
                                      require_proof) else EXIT_OK

    @property
    def deviations(self) -> tuple[Finding, ...]:
        """The findings that are deviations from the plan (all but "not proven")."""
        return tuple(f for f in self.findings if f.rule != "VP011")

    def counts(self) -> dict[Severity, int]:
        out: dict[Severity, int] = {s: 0 for s in SEVERITIES}
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out

    def checks(self) -> frozenset[str]:
        """The checks this run ran (an older result without coverage: those with attempts)."""
        return frozenset(c.check for c in self.coverage) | frozenset(a.check for a in self.attempts)

    def coverage_counts(self) -> dict[str, dict[str, int]]:
        """check -> status -> number of subjects, in registry order of first appearance."""
        out: dict[str, dict[str, int]] = {}
        for c in self.coverage:
            row = out.setdefault(c.check, {s: 0 for s in COVERAGE_STATUSES})
            row[c.status] += 1
        return out
