"""A case: one request the prober will send, and what the plan expects of it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from scanner import patterns
from scanner.probe.interface import Credential, Vantage

# A concrete value for every {param}: matches the proxies' narrow parameter regex.
PARAM_VALUE = "probe-x1"
Role = Literal["declared", "undeclared", "variant", "limit", "sweep", "spoof", "witness"]
# When a case may be sent within its pacing lane (scanner.probe.pace): ordinary cases first,
# then the concurrency check (held requests), then the rate burst, which empties the bucket,
# then one request to every other route of the burst's bucket, which must meet it empty.
Phase = Literal[0, 1, 2, 3]


@dataclass(frozen=True)
class Case:
    check: str
    method: str                    # the route's method the case is about
    path: str                      # the route template
    send_method: str               # what goes on the wire
    target: str                    # the request target exactly as sent (path?query, or absolute form)
    credential: Credential
    vantage: Vantage
    expected: Literal["allow", "deny"]
    reasons: tuple[str, ...] = ()  # deny: the reasons that prove it; allow: refusals also accepted
    subject: str = ""              # the plan decision or limit this case is evidence for
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    chunked: bool = False
    raw: bool = False              # send over a plain stream, byte for byte
    h2c: bool = False              # send as HTTP/2 with prior knowledge (the connection preface)
    grpc_port: int = 0             # a gRPC call (HTTP/2, application/grpc) to this port of the target host
    burst: str = ""                # cases of one rate burst share this key; sent unthrottled
    note: str = ""
    skip: str = ""                 # not sent, and why (would change state)
    # what the judge needs to know about this case
    role: Role = "declared"
    state_changing: bool = False
    json_body: bool = False        # the body is JSON the upstream validates (400 JSON = reached)
    phase: Phase = 0
    hold_ms: int = 0               # ask the witness upstream to hold the answer this long
    hold_group: str = ""           # ... counted from the first arrival of this group's requests
    tls_offer: str = ""            # a TLS handshake offering only this (scanner.probe.send.OFFERS),
                                   # on a fresh connection: the listener must refuse it
    dribble: bool = False          # without a witness: held open by the client, its body's last byte
                                   # sent only after hold_ms (or an answer came first; scanner.probe.send)
    stream_hold: bool = False      # without a witness: a stream held open by the client, its answer read
                                   # until hold_ms after the send, then the connection closed (open_ms)
    answer: int = 0                # ask the witness upstream to answer this status itself (vp_answer);
                                   # the answer's body is kept in the attempt (answer_body)
    read_answer: bool = False      # keep the answer's body in the attempt (answer_body, first 64 KiB):
                                   # the judge reads it (a token budget's settlement reads its usage)
    replica: int = 0               # a fleet (ProbeOptions.replicas): which replica it goes through
    before_limits: bool = False    # refused on its head, before any limiter (pacing need not count it)
    first: bool = False            # sent before its lane's other ordinary cases, one at a time (a
                                   # token budget's proof needs the budget before the other checks
                                   # spend it, and each answer settled before the next is admitted)
    as_sent: bool = False          # its body is what it proves (caps at their value, an absent output
                                   # budget): never made lighter on a token budget (probe/token_pace.py)
    lane: str = ""                 # sent in this pacing lane's phases (scanner.probe.pace), not its own:
                                   # another principal's request while the first one's bucket is empty

    def all_headers(self) -> dict[str, str]:
        h = dict(self.credential.headers())
        if self.body is not None and not any(k.lower() == "content-type" for k, _ in self.headers):
            h["Content-Type"] = "application/json"
        h.update(self.headers)
        return h


@lru_cache(maxsize=4096)
def concrete(path: str) -> str:
    """A template path with each {param} replaced by a safe concrete value."""
    segs = patterns.segments(path)
    return "/" + "/".join(PARAM_VALUE if patterns.is_param(s) else s for s in segs)


def with_query(target: str, query: str) -> str:
    if not query:
        return target
    return f"{target}{'&' if '?' in target else '?'}{query}"
