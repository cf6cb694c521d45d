"""What one answer proves against the plan's expectation for its case.

* expected **allow**: proved when the upstream answered (anything but its own key guard or
  a 404); refused by the perimeter for a reason the case accepts (a burst meeting its rate
  limit) is proved too; throttled otherwise, a proxy 5xx or no answer is *inconclusive*;
  any other refusal *failed* (the plan's route is blocked).
* expected **deny**: proved only when the perimeter answered with the status and
  ``X-Perimeter-Reason`` of one of the case's reasons. A throttled answer, a refusal for
  another reason, a proxy 5xx or no answer is *inconclusive*: the denial the case is about
  was never exercised; but a refusal only a later check gives (an unknown key refused for its
  role, a denied network for its body: scanner.reasons.past; a body over the envelope caps
  refused by the token budget, which charges only what passed them) *failed*: the check under
  test let it through. The upstream answering (whatever it said) *failed*: the perimeter let the
  request through.

Inconclusive attempts are retried (scanner.probe.pace); what stays inconclusive is
reported as not proven, never as passed.
"""

from __future__ import annotations

from scanner import reasons as R
from scanner.probe.interface import Attempt, Verdict

# What a TLS client sees when the server refuses its certificate: an alert (unknown CA, expired,
# bad certificate; TLS 1.3 sends it after the client's Finished, so it arrives on the first read).
HANDSHAKE_ALERTS: tuple[str, ...] = ("alert unknown ca", "alert certificate expired", "alert bad certificate",
                                     "alert certificate unknown", "alert decrypt error",
                                     "alert certificate required", "alert handshake failure")


# The sender's error for a handshake the listener refused (scanner.probe.send._offer); a case
# about the listener's TLS versions and suites expects it (its reasons hold TLS_OFFER).
TLS_REFUSED = "TLS handshake refused"
TLS_OFFER = "tls"


def handshake_refused(error: str) -> bool:
    """Did the server refuse the client's certificate in the TLS handshake (``error`` the
    attempt's)? Only a TLS alert naming the certificate counts; a reset or timeout does not."""
    text = error.lower().replace("_", " ")
    return any(alert in text for alert in HANDSHAKE_ALERTS)


def verdict(expected: str, accepted: tuple[str, ...], a: Attempt) -> tuple[Verdict, str]:
    """(verdict, why) for one attempt of a case expecting ``expected`` with ``accepted`` reasons."""
    if a.outcome == "skipped":
        return "skipped", a.error.removeprefix("skipped: ")
    if TLS_OFFER in accepted and a.status is not None:   # any answer: the handshake was accepted
        return "failed", f"the listener completed the handshake and answered {a.status}"
    if a.status is None:
        if "cert-invalid" in accepted and handshake_refused(a.error):
            return "proved", f"the listener refused the certificate in the TLS handshake ({a.error})"
        if TLS_OFFER in accepted and a.error.startswith(TLS_REFUSED):
            return "proved", a.error
        return "inconclusive", f"no answer ({a.error or 'unknown error'})"
    proxy = a.layer == "proxy"
    kind, _detail = R.parse(a.reason)
    if proxy and a.status >= 500:
        if a.reason and a.reason in accepted:    # the 5xx the case is about (an upstream timeout)
            return "proved", f"{a.status} {a.reason}"
        return "inconclusive", f"the proxy failed: {a.status} {a.reason or a.decision or ''}".rstrip()
    if proxy and a.outcome != "reached":
        if any(R.proves(r, a.status, a.reason) for r in accepted):
            return "proved", f"{a.status} {a.reason}"
        if kind == "token-budget" and expected == "deny" and any(r.startswith("envelope-") for r in accepted):
            return "failed", (f"refused only by its token budget ({a.status} {a.reason}), which charges what "
                              "passed the envelope caps: the perimeter let it past the cap that refuses it "
                              f"({' or '.join(accepted)}: 400, for good)")
        if kind in R.THROTTLE:
            return "inconclusive", f"throttled ({a.status} {a.reason}) before the case was decided"
        if expected == "allow":
            return "failed", f"refused by the perimeter: {a.status} {a.reason or 'no reason given'}"
        want = " or ".join(accepted) or "a reason"
        if R.past(accepted, a.reason):
            return "failed", (f"refused only by a later check ({a.status} {a.reason}): the perimeter let it "
                              f"past the check that refuses it ({want})")
        return "inconclusive", (f"refused for another reason ({a.status} {a.reason or 'no reason given'}) "
                                f"than the one under test ({want})")
    # the upstream answered
    if expected == "allow":
        if a.outcome == "reached":
            return "proved", f"{a.status} from the upstream"
        return "failed", f"{a.status} from the upstream ({a.outcome})"
    return "failed", f"the perimeter let it through: {a.status} from the upstream ({a.outcome})"
