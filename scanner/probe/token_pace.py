"""Token pacing: what each case costs the token budget the plan charges it to, and a model of
that budget, so that checks not about the budget never meet it (scanner/probe/pace.py paces the
rate buckets; this paces the token budgets).

A request is charged at admission (the proxies: once every other check passed) the plan's cost
(:func:`scanner.plan.body.token_cost`, its admitted envelope's tokens) against one budget per
:attr:`Decision.token_zone` and principal (``auth: key``) or source address (``auth: none``):
:func:`charge_of` says which budget and how much, from the plan alone. The plan caps that cost at
the budget's capacity (``max_request_tokens`` <= ``tokens_burst``, scanner/plan/build.py): a body
over it is refused with its envelope reason, never charged.

:class:`TokenModel` holds what the run has charged to one budget and answers "when does a request
of this cost fit", with the one counting every enforcer shares (Envoy's local_ratelimit, njs's
bucket, the fleet's limiter): a bucket of the budget's capacity (Decision.token_capacity)
refilled continuously with ``limit`` per minute, of which the model counts on a share
(:data:`REFILL_SHARE`). Refunds from usage (settlement) are not counted: the model never holds
more than the proxies. A request refused before admission gives its charge back; a case paced by
the model and still refused for ``token-budget`` means the budget held less than the model (it
is then counted as spent, and the case waits again: scanner/probe/runner.py).

Cases about the budget itself (those accepting a ``token-budget`` refusal: the token-budget
check) are charged but not held back: meeting the budget is their point.

:func:`light` makes a body cheap where the output budget is not what the case proves: a JSON
body without any of its route's budget fields gets the smallest one (``max_tokens: 1`` and the
like) written in, when the route's rules let that field through, so a fields, media, upstream or
rate case costs its bytes, not the 4096 tokens the proxy would write in. Bodies that carry a
budget (caps at their value) and cases marked ``Case.as_sent`` are sent as they are.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from scanner.plan import body as plan_body
from scanner.plan import settle
from scanner.plan.model import Decision, Plan
from scanner.probe.cases import Case
from scanner.probe.expect import expect
from scanner.probe.interface import Attempt, Credential, Vantage

# Checks whose cases prove nothing by which of the keys a route admits sends them (the plan
# expects the same of each): :func:`balance` may move them.
MOVABLE = frozenset({"limits", "media", "upstream"})
REFILL_SHARE = 0.95      # of a budget's refill the bucket model counts on
WINDOW_S = 60.0          # a budget's refill: limit per minute
MARGIN_S = 0.25          # the proxy charges when the request arrives: a little after it was sent
LIGHT = 1                # the output budget written into a body the case does not prove it by


def token_key(d: Decision, case: Case, source_address: str | None) -> str:
    """The budget ``case`` is charged to on ``d`` ("" none)."""
    subject = case.credential.label if d.auth == "key" and case.credential.kind == "role" \
        else (source_address or case.vantage.name)
    return f"{d.token_zone}|{subject}"


@dataclass(frozen=True)
class Charge:
    """What the plan says one case costs a token budget at admission."""

    key: str = ""                  # the budget: token zone | principal or address ("" none)
    cost: int = 0
    limit: int = 0                 # its tokens per minute
    capacity: int = 0              # its bucket (Decision.token_capacity)


def charge_of(plan: Plan, case: Case, source_address: str | None) -> Charge:
    """The budget ``case`` is charged to at admission and how much; none (``Charge()``) when it is
    not charged: skipped, on a route without a token budget, or refused before admission (the plan
    expects it denied: network, key, role, body rules, its envelope over the route's caps)."""
    d = plan.decision(case.send_method, case.path)
    if case.skip or d is None or not d.token_zone or case.expected != "allow":
        return Charge()
    if expect(d, case.credential, source_address).denied:
        return Charge()
    body = case.body or b""
    if d.envelope_capped and plan_body.envelope_refusal(d, body):
        return Charge()
    capacity = d.token_capacity
    return Charge(token_key(d, case, source_address), min(plan_body.token_cost(d, body), capacity),
                  d.limits.tokens_per_minute or 0, capacity)


def about_budget(case: Case) -> bool:
    """Is ``case`` about its token budget (a refusal for it proves something): charged, never held
    back by the model?"""
    return "token-budget" in case.reasons


@dataclass
class TokenModel:
    """One budget of ``capacity`` tokens refilled with ``limit`` a minute, as the run has spent it
    (times: wall-clock seconds)."""

    limit: int
    capacity: int
    level: float | None = None     # the bucket (None: full, not used yet; below 0: overdrawn)
    at: float = 0.0                # ... at this time
    hold: float = 0.0              # nothing before this time (the proxy's Retry-After)

    @property
    def rate(self) -> float:
        """The refill the model counts on: a share of the budget's (Envoy's refill lags a little)."""
        return REFILL_SHARE * self.limit / WINDOW_S

    def bucket(self, t: float) -> float:
        if self.level is None:
            return float(self.capacity)
        return min(float(self.capacity), self.level + max(0.0, t - self.at) * self.rate)

    def wait(self, cost: float, t: float) -> float:
        """Seconds from ``t`` until a request of ``cost`` fits (0: now)."""
        if cost <= 0:
            return 0.0
        short = min(cost, self.capacity) - self.bucket(t)
        out = max(short / self.rate if short > 0 else 0.0, self.hold - t)
        return out + MARGIN_S if out > 0 else 0.0

    def charge(self, cost: float, t: float) -> None:
        if cost <= 0:
            return
        self.level, self.at = self.bucket(t) - cost, t

    def give_back(self, cost: float, t: float, sent: float) -> None:
        """A request of ``cost`` sent at ``sent`` was not admitted: it was never charged."""
        if cost <= 0:
            return
        self.level, self.at = min(float(self.capacity), self.bucket(t) + cost), t

    def spent(self, t: float, cost: float = 0.0, retry: float | None = None) -> None:
        """The proxy refused a request of ``cost`` the model had room for: the budget holds less.
        With the proxy's ``retry`` (its Retry-After, seconds): nothing before then, and the bucket
        has room for ``cost`` no sooner; without: the budget counted spent now."""
        if retry is not None:
            self.hold = max(self.hold, t + retry)
            self.level, self.at = min(self.bucket(t), cost - retry * self.rate), t
            return
        self.level, self.at = 0.0, t


def refill_seconds(capacity: int, limit: int) -> float:
    """Seconds an emptied bucket of ``capacity`` takes to refill whole at ``limit`` a minute (the
    proxies' rate, not the model's share), plus the margin of the proxy's clock."""
    return capacity * WINDOW_S / limit + MARGIN_S if limit > 0 else 0.0


@dataclass(frozen=True)
class TokenBound:
    """The least time one budget's cases need: what they cost beyond the full bucket, at the refill
    rate."""

    key: str
    limit: int
    tokens: int                    # the plan's cost of every case charged to it
    seconds: float


def token_bound(key: str, limit: int, capacity: int, tokens: int) -> TokenBound:
    over = tokens - capacity
    seconds = over / (limit / WINDOW_S) if over > 0 and limit > 0 else 0.0
    return TokenBound(key, limit, tokens, round(seconds, 1))


def written(body: bytes, name: str, value: int) -> bytes:
    """A JSON object ``body`` with ``"name": value`` first, every other byte as it was."""
    start = body.index(b"{") + 1
    rest = body[start:].lstrip()
    member = json.dumps({name: value})[1:-1].encode()
    return body[:start] + member + (b"," if not rest.startswith(b"}") else b"") + body[start:]


def light_body(d: Decision, body: bytes) -> bytes | None:
    """``body`` (a JSON object) with the smallest output budget of ``d`` written in, on a route with
    a token budget whose rules let that field through; None: it carries a budget already, is not
    a JSON object, or the result would be over the route's body or envelope caps."""
    budget = d.budget
    if not d.token_zone or budget is None or "." in budget.field:
        return None
    rules = d.fields
    if rules.mode(budget.field) != "allow" or budget.field in rules.pins:
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or any(f.split(".")[0] in obj for f in budget.fields):
        return None
    out = written(body, budget.field, LIGHT)
    if d.limits.body_bytes is not None and len(out) > d.limits.body_bytes:
        return None
    if d.envelope_capped and plan_body.envelope_refusal(d, out):
        return None
    return out


def light(plan: Plan, case: Case) -> Case:
    """``case`` with the smallest output budget written into its body where it proves nothing by
    it (see the module docstring); else as it is."""
    d = plan.decision(case.send_method, case.path)
    if (case.as_sent or case.skip or case.expected != "allow" or d is None or not case.body
            or about_budget(case)):
        return case
    body = light_body(d, case.body)
    if body is None:
        return case
    budget = d.budget
    assert budget is not None
    said = f"{budget.field}={LIGHT}: light on its token budget"
    return replace(case, body=body, note=f"{case.note} ({said})" if case.note else said)


def planned_spend(cases: Sequence[Case], charges: Sequence[Charge]) -> dict[str, int]:
    """The tokens ``cases`` spend of each budget, as planned: their costs, where the cases about
    the budget (:func:`about_budget`) count its capacity at most (they spend it once: the rest
    is refused, or given back by their answers' usage)."""
    spend: dict[str, int] = defaultdict(int)
    meet: dict[str, int] = defaultdict(int)
    limits: dict[str, int] = {}
    for c, ch in zip(cases, charges, strict=True):
        if ch.key:
            (meet if about_budget(c) else spend)[ch.key] += ch.cost
            limits[ch.key] = ch.capacity
    for k, n in meet.items():
        spend[k] += min(n, limits[k])
    return dict(spend)


def balance(plan: Plan, cases: Sequence[Case], credentials: Sequence[Credential],
            source_address: Callable[[Vantage], str | None]) -> list[Case]:
    """``cases`` with the charged ordinary cases of :data:`MOVABLE` checks spread over the keys
    the plan expects the same of (from the same vantage: the roles it admits), costliest first,
    each to the key whose budget the run has planned the least for so far: several keys of a role
    are several budgets, and the cases at a cap's value (one may cost the whole budget) are not
    all sent by one. The other cases stay with their key and count first."""
    charges = [charge_of(plan, c, source_address(c.vantage)) for c in cases]
    movable = [i for i, (c, ch) in enumerate(zip(cases, charges, strict=True)) if ch.key and
               c.check in MOVABLE and c.credential.kind == "role" and c.phase == 0 and not c.first]
    stay = [i for i in range(len(cases)) if i not in set(movable)]
    planned: dict[str, int] = defaultdict(int, planned_spend([cases[i] for i in stay],
                                                             [charges[i] for i in stay]))
    out = list(cases)
    for i in sorted(movable, key=lambda i: (-charges[i].cost, i)):
        c, ch = cases[i], charges[i]
        d = plan.decision(c.send_method, c.path)
        assert d is not None
        addr = source_address(c.vantage)
        same = expect(d, c.credential, addr)
        keys = [k for k in credentials if k.kind == "role" and expect(d, k, addr) == same]
        where = {k.label: token_key(d, replace(c, credential=k), source_address(c.vantage)) for k in keys}
        best = min(keys, key=lambda k: (planned[where[k.label]], k.label != c.credential.label, k.label))
        planned[where[best.label]] += ch.cost
        if best.label != c.credential.label:
            out[i] = replace(c, credential=best)
    return out


def settled(cost: int, case: Case, attempt: Attempt) -> int:
    """The tokens the proxy gives back once ``attempt``'s JSON answer reports its usage
    (scanner/plan/settle.py refund); 0: not read, or no usage."""
    if attempt.outcome != "reached" or not attempt.answer_body:
        return 0
    try:
        answer, body = json.loads(attempt.answer_body), json.loads(case.body or b"null")
    except ValueError:
        return 0
    return settle.refund(cost, settle.usage_of(answer), body if isinstance(body, dict) else None)
