"""The operator model: families, the registry, targets picked from the plan, and the plan
transforms both proxies share (each proxy renders the weakened plan with its own generator)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

from scanner.plan.model import GOVERNED_FIELDS, Decision, Plan
from scanner.policy.keys import new_key
from scanner.policy.model import FieldRules, Limits, Rate
from scanner.probe.checks.load import stream_body
from scanner.probe.checks.timeouts import provable
from scanner.rules import BudgetStep, Keys, Step

# remove: a check or limit gone; raise: a limit x10 / x100 / x1000; widen: a network wider;
# add: a role, a method admitted; move: a denied field (or unknown fields) allowed on one route;
# switch: a limit left in place but not enforced (dry run, shadow, thresholds at their maximum);
# source: a fact taken from the client (address, Host, the zone key); loosen: a match wider (a
# route's: anchors, parameters, case; the key's: its digest, a prefix); expose: something outside
# the allowlist reachable;
# forward: something the client sent, or the perimeter owes, reaching vLLM wrongly
FAMILIES: tuple[str, ...] = ("remove", "raise", "widen", "add", "move", "switch", "source", "loosen",
                             "expose", "forward")


class NotApplicable(Exception):
    """The plan has nothing this operator could weaken (e.g. no rate limit at all)."""


Apply = Callable[[Path, Plan], str]


@dataclass(frozen=True)
class Operator:
    id: str                        # "nginx.rate-raised-x10"
    kind: str                      # "nginx" or "envoy"
    family: str                    # one of FAMILIES
    target: str                    # what it weakens, picked from the plan when applied
    title: str
    # the checks that must catch it (the first leads its run), or a rule of caught_by (e.g.
    # "unreachable": the mutant proxy answers no HTTP/1.1 at all)
    catches: tuple[str, ...]
    apply: Apply                   # (directory of the generated files, plan) -> what changed
    needs: str = ""                # the policy setting it needs ("" none): else NotApplicable

    @property
    def name(self) -> str:
        """The id without the proxy kind (the same weakening on both proxies)."""
        return self.id.partition(".")[2]


OPERATORS: dict[str, Operator] = {}


def register(op: Operator) -> Operator:
    if op.id in OPERATORS:
        raise ValueError(f"mutation operator {op.id} registered twice")
    if op.family not in FAMILIES or not op.catches:
        raise ValueError(f"mutation operator {op.id}: family {op.family!r}, catches {op.catches!r}")
    OPERATORS[op.id] = op
    return op


def operators(kind: str) -> tuple[Operator, ...]:
    return tuple(op for op in OPERATORS.values() if op.kind == kind)


# --- targets: which route of the plan an operator weakens ------------------------------------

Pick = Callable[[Plan], Decision]


def pick(plan: Plan, what: str, test: Callable[[Decision], bool], last: bool = False) -> Decision:
    """The first (or ``last``) allowed HTTP decision, by path and method, that ``test`` accepts."""
    ordered = sorted(plan.allowed, key=lambda d: (d.path, d.method))
    found = [d for d in ordered if d.kind == "http" and test(d)]
    if not found:
        raise NotApplicable(f"no allowed route {what}")
    return found[-1] if last else found[0]


EVERYWHERE = ("0.0.0.0/0", "::/0")


def keyed(plan: Plan) -> Decision:
    return pick(plan, "that needs a key", lambda d: d.auth == "key" and not d.state_changing)


def roled(plan: Plan) -> Decision:
    roles = {p.role for p in plan.principals}
    return pick(plan, "limited to some roles",
                lambda d: d.auth == "key" and bool(d.roles) and bool(roles - set(d.roles)))


def roled_other(plan: Plan) -> Decision:
    """A route limited to roles other than :func:`roled`'s."""
    first = roled(plan)
    roles = {p.role for p in plan.principals}
    return pick(plan, "limited to another set of roles",
                lambda d: d.auth == "key" and bool(d.roles) and bool(roles - set(d.roles))
                and set(d.roles) != set(first.roles))


def networked(plan: Plan) -> Decision:
    return pick(plan, "limited to some networks", lambda d: not set(d.networks) & set(EVERYWHERE))


def network_sets(plan: Plan) -> list[tuple[str, ...]]:
    """The distinct network sets of the allowed routes limited to some networks, sorted."""
    return sorted({d.networks for d in plan.allowed if d.kind == "http" and d.networks
                   and not set(d.networks) & set(EVERYWHERE)})


def on_network_set(n: int) -> Pick:
    def target(plan: Plan) -> Decision:
        sets = network_sets(plan)
        if len(sets) <= n:
            raise NotApplicable(f"fewer than {n + 1} network sets among the allowed routes")
        return pick(plan, f"on network set {n + 1}", lambda d: d.networks == sets[n])
    return target


def bodied(plan: Plan) -> Decision:
    return pick(plan, "with a body limit", lambda d: d.method == "POST" and d.limits.body_bytes is not None)


def capped(plan: Plan) -> Decision:
    return pick(plan, "with JSON caps", lambda d: d.method == "POST" and bool(d.limits.json_caps))


def counted(plan: Plan) -> Decision:
    return pick(plan, "with count caps", lambda d: d.method == "POST" and bool(d.fields.counts), last=True)


def budgeted(plan: Plan) -> Decision:
    return pick(plan, "with an output budget", lambda d: d.enforced_budget is not None)


def budget_written(plan: Plan) -> Decision:
    """A route whose output budget the perimeter writes into bodies without one (inject)."""
    return pick(plan, "with an output budget written in",
                lambda d: d.enforced_budget is not None and d.enforced_budget.write_cap > 0)


def written_x10(step: Step) -> Step:
    """A rule program's budget step writing ten times its cap (the caps on the fields unchanged)."""
    assert isinstance(step, BudgetStep)
    return step.model_copy(update={"cap": step.cap * 10})


def listed(plan: Plan) -> Decision:
    return pick(plan, "with listed values (fields.values)", lambda d: bool(d.fields.values))


def salted(plan: Plan) -> Decision:
    return pick(plan, "with a cache salt (cache_salt: per-principal / per-audience)", lambda d: bool(d.salt))


def rated(plan: Plan) -> Decision:
    return pick(plan, "with a rate limit", lambda d: d.limits.rate is not None)


def rated_by_principal(plan: Plan) -> Decision:
    return pick(plan, "with a rate limit per principal",
                lambda d: d.limits.rate is not None and d.auth == "key", last=True)


def rated_by_address(plan: Plan) -> Decision:
    return pick(plan, "with a rate limit per client address",
                lambda d: d.limits.rate is not None and d.auth == "none")


def cert_checked(plan: Plan) -> Decision:
    """A route of an ``auth: cert`` audience (client certificates) with an admitted certificate
    principal (the mtls check's admitted case)."""
    return pick(plan, "with auth: cert and a certificate principal it admits",
                lambda d: d.auth == "cert" and any(not d.roles or c.role in d.roles for c in plan.certs))


def cert_role(plan: Plan, d: Decision) -> str:
    """A role ``d`` admits that a certificate principal has."""
    return next(c.role for c in plan.certs if not d.roles or c.role in d.roles)


def token_checked(plan: Plan) -> Decision:
    """A route of an ``auth: jwt`` audience (bearer tokens verified)."""
    return pick(plan, "with auth: jwt", lambda d: d.jwt is not None)


def token_budgeted(plan: Plan) -> Decision:
    return pick(plan, "with a token budget", lambda d: bool(d.token_zone))


def multiplied(plan: Plan) -> Decision:
    """A route whose per-request envelope caps count a sequences-per-item multiplier (``n``,
    ``best_of``) and that has an output budget: the CVE-2026-34756 shape (n x max_tokens); one
    whose items it multiplies (a list of prompts or conversations), so that a multiplier capped
    under max_sequences still shows when ignored (/inference/v1/generate's sampling_params.n alone
    never exceeds its caps)."""
    return pick(plan, "with envelope caps and n / best_of",
                lambda d: d.envelope_capped and bool(d.envelope_spec.per_item) and d.budget is not None
                and bool(d.envelope_spec.items))


def envelope_capped(plan: Plan) -> Decision:
    """The last route with per-request envelope caps that counts a list of prompts, conversations
    or inputs (one body: many sequences, each with the output budget)."""
    return pick(plan, "with envelope caps and a list multiplier",
                lambda d: d.envelope_capped and d.limits.max_sequences is not None
                and bool(d.envelope_spec.items) and d.budget is not None, last=True)


def outlastable(d: Decision) -> bool:
    """Has ``d`` an upstream timeout the timeout check's witness can outlast?"""
    return d.limits.timeout_s is not None and provable(d.limits.timeout_s) and not d.state_changing


def timed(plan: Plan) -> Decision:
    return pick(plan, "with an upstream timeout the witness can outlast", outlastable)


def limited(plan: Plan) -> Decision:
    return pick(plan, "with a concurrency limit", lambda d: d.limits.concurrency is not None)


def limited_generation(plan: Plan) -> Decision:
    """A route with a concurrency limit, one whose streams the plan admits first (the client can
    hold a generation open there without a witness: scanner.probe.checks.load.stream_body)."""
    try:
        return pick(plan, "with a concurrency limit and streams", lambda d: d.limits.concurrency is not None
                    and not d.state_changing and stream_body(d) is not None)
    except NotApplicable:
        return limited(plan)


def plain_get(plan: Plan) -> Decision:
    return pick(plan, "with GET", lambda d: d.method == "GET" and "{" not in d.path)


def template(plan: Plan) -> Decision:
    return pick(plan, "with a path parameter", lambda d: "{" in d.path)


def template_last(plan: Plan) -> Decision:
    return pick(plan, "with a path parameter", lambda d: "{" in d.path, last=True)


def exact_get(plan: Plan) -> Decision:
    return pick(plan, "with GET on an exact path", lambda d: d.method == "GET" and "{" not in d.path,
                last=True)


def denied_path(plan: Plan) -> str:
    """A path every method of which is denied (the proxy answers it itself)."""
    allowed = {d.path for d in plan.allowed}
    for d in sorted(plan.decisions, key=lambda d: d.path):
        if d.kind == "http" and d.path not in allowed and "{" not in d.path:
            return d.path
    raise NotApplicable("no denied route")


def field_checked(plan: Plan) -> Decision:
    """A route whose field rules act on bodies (and with JSON caps: its body is always read)."""
    return pick(plan, "with field rules and JSON caps",
                lambda d: d.fields.decided and bool(d.limits.json_caps))


def media_checked(plan: Plan) -> Decision:
    """A route whose media rules act on bodies."""
    return pick(plan, "with media rules", lambda d: d.media.active)


def media_listed(plan: Plan) -> Decision:
    """A route whose media rules list an exact host of three labels or more (a wildcard of its
    parent is then wider and still not everything)."""
    return pick(plan, "with an exact media domain under a parent domain",
                lambda d: d.media.active and any(exact_child(e) for e in d.media.domains))


def exact_child(entry: str) -> bool:
    return not entry.startswith("*.") and entry.partition(":")[0].count(".") >= 2


def domain_widened(d: Decision) -> tuple[Decision, str]:
    """The route's first exact media domain (``media.example.com``) -> a wildcard of its parent
    (``*.example.com``): every sibling host passes the proxy."""
    entry = next(e for e in d.media.domains if exact_child(e))
    name, _, port = entry.partition(":")
    wide = "*." + name.partition(".")[2] + (f":{port}" if port else "")
    domains = tuple(wide if e == entry else e for e in d.media.domains)
    return replace(d, media=replace(d.media, domains=domains)), f"media domain {entry} -> {wide}"


def where(d: Decision) -> str:
    return f"{d.method} {d.path}"


def owned(plan: Plan) -> Decision:
    """A route that names stored responses (responses: owned): the path's id or a body field."""
    return pick(plan, "naming stored responses (responses: owned)",
                lambda d: bool(d.owner_param or d.owner_fields))


def ownership_unchecked(plan: Plan) -> tuple[Plan, str]:
    """Every route naming stored responses forwards the id as sent: no seal checked or removed on
    the way in (answers still sealed)."""
    owned(plan)
    ds = [d for d in plan.decisions if d.owner_param or d.owner_fields]
    new = replace(plan, decisions=tuple(replace(d, owner_param="", owner_fields=())
                                        if d in ds else d for d in plan.decisions))
    return new, "no seal checked on the way in: " + ", ".join(where(d) for d in ds)


# --- plan transforms: one decision weakened, the plan rendered again --------------------------

Weaken = Callable[[Plan], tuple[Plan, str]]


def with_decision(plan: Plan, old: Decision, new: Decision) -> Plan:
    return replace(plan, decisions=tuple(new if d is old else d for d in plan.decisions))


def on(target: Pick, change: Callable[[Decision], tuple[Decision, str]]) -> Weaken:
    """Weaken the decision ``target`` picks with ``change`` (-> the new decision, what changed)."""
    def weaken(plan: Plan) -> tuple[Plan, str]:
        d = target(plan)
        new, what = change(d)
        if new == d:
            raise NotApplicable(f"{where(d)}: nothing to change")
        return with_decision(plan, d, new), f"{where(d)}: {what}"
    return weaken


def limits(d: Decision, **changes: object) -> Decision:
    return replace(d, limits=replace(d.limits, **changes))  # type: ignore[arg-type]


def raised(limit: str, factor: int) -> Callable[[Decision], tuple[Decision, str]]:
    """``limit`` (rate, burst, concurrency, json_caps, counts, body_bytes, tokens_per_minute,
    timeout_s) x factor."""
    def change(d: Decision) -> tuple[Decision, str]:
        lim: Limits = d.limits
        if limit in ("rate", "burst"):
            assert lim.rate is not None
            rate = (Rate(lim.rate.rps * factor, lim.rate.burst) if limit == "rate"
                    else Rate(lim.rate.rps, lim.rate.burst * factor))
            return limits(d, rate=rate), f"{limit} x{factor}"
        if limit == "json_caps":
            caps = {k: v * factor for k, v in lim.json_caps.items()}
            return limits(d, json_caps=caps), f"JSON caps x{factor}"
        if limit == "counts":
            counts = {k: v * factor for k, v in d.fields.counts.items()}
            return replace(d, fields=replace(d.fields, counts=counts)), f"count caps x{factor}"
        value = getattr(lim, limit)
        if limit == "timeout_s":
            assert isinstance(value, float | int)
            return limits(d, timeout_s=value * factor), f"timeout_s {value:g} -> {value * factor:g}"
        assert isinstance(value, int)
        return limits(d, **{limit: value * factor}), f"{limit} {value} -> {value * factor}"
    return change


def bucket_doubled(plan: Plan) -> tuple[Plan, str]:
    """Every route of one token zone with its bucket's capacity doubled (limits.tokens_burst), the
    refill (tokens_per_minute) and the per-request cap as planned: any minute then admits up to
    2 C + N instead of C + N."""
    d = token_budgeted(plan)
    zone, capacity = d.token_zone, d.token_capacity
    decisions = tuple(limits(x, tokens_burst=2 * x.token_capacity) if x.token_zone == zone else x
                      for x in plan.decisions)
    return replace(plan, decisions=decisions), f"{zone}: bucket {capacity} -> {2 * capacity}"


def multiplier_dropped(d: Decision) -> tuple[Decision, str]:
    """The route's envelope spec without one multiplier (its first sequences-per-item field, else
    its first item field, else its first pair): the proxy counts one sequence where vLLM runs
    several. Only the rendered proxy has it; the plan (and the probe) still count it."""
    spec = d.envelope_spec
    if spec.per_item:
        name, new = spec.per_item[0], replace(spec, per_item=spec.per_item[1:])
    elif spec.items:
        name, new = f"{spec.items[0][0]} list", replace(spec, items=spec.items[1:])
    elif spec.pairs:
        name, new = ":".join(spec.pairs[0]) + " pairs", replace(spec, pairs=spec.pairs[1:])
    else:
        raise NotApplicable(f"{where(d)}: no multiplier in its envelope")
    return replace(d, envelope_spec=new), f"envelope ignores {name} ({spec.text} -> {new.text})"


def envelope_caps_raised(factor: int) -> Callable[[Decision], tuple[Decision, str]]:
    """The route's per-request envelope caps (max_sequences, max_request_tokens) x factor."""
    def change(d: Decision) -> tuple[Decision, str]:
        lim = d.limits
        seq = lim.max_sequences * factor if lim.max_sequences is not None else None
        tok = lim.max_request_tokens * factor if lim.max_request_tokens is not None else None
        caps = (("max_sequences", lim.max_sequences, seq),
                ("max_request_tokens", lim.max_request_tokens, tok))
        said = [f"{name} {old} -> {new}" for name, old, new in caps if old is not None]
        return limits(d, max_sequences=seq, max_request_tokens=tok), ", ".join(said)
    return change


def removed(what: str) -> Callable[[Decision], tuple[Decision, str]]:
    def change(d: Decision) -> tuple[Decision, str]:
        if what == "key":
            return replace(d, auth="none", roles=()), "no key needed"
        if what == "roles":
            return replace(d, roles=()), f"roles {', '.join(d.roles)} -> any principal"
        if what == "networks":
            return replace(d, networks=EVERYWHERE), f"networks {', '.join(d.networks)} -> any address"
        if what == "rate":
            return limits(d, rate=None), "no rate limit"
        if what == "concurrency":
            return limits(d, concurrency=None), "no concurrency limit"
        if what == "json_caps":
            return limits(d, json_caps={}), "no JSON caps"
        if what == "counts":
            return replace(d, fields=replace(d.fields, counts={})), "no count caps"
        raise ValueError(what)
    return change


def widened(prefix: int) -> Callable[[Decision], tuple[Decision, str]]:
    """The route's first network widened to /prefix (the outside vantage then falls inside)."""
    def change(d: Decision) -> tuple[Decision, str]:
        first = ipaddress.ip_network(d.networks[0], strict=False)
        wide = first.supernet(new_prefix=min(prefix, first.prefixlen)) if prefix else (
            ipaddress.ip_network("0.0.0.0/0") if first.version == 4 else ipaddress.ip_network("::/0"))
        return replace(d, networks=(str(wide), *d.networks[1:])), f"{first} -> {wide}"
    return change


def role_added(plan: Plan) -> Callable[[Decision], tuple[Decision, str]]:
    def change(d: Decision) -> tuple[Decision, str]:
        other = sorted({p.role for p in plan.principals} - set(d.roles))
        return replace(d, roles=(*d.roles, other[0])), f"role {other[0]} admitted"
    return change


def method_added(method: str) -> Weaken:
    """``method`` answered on a route that allows another one only (a GET on a POST route, ...)."""
    def weaken(plan: Plan) -> tuple[Plan, str]:
        paths = plan.routes()
        d = pick(plan, f"without {method}", lambda d: "{" not in d.path and d.method != method
                 and all(o.method != method for o in paths.get(d.path, ())))
        extra = replace(d, method=method)
        return replace(plan, decisions=(*plan.decisions, extra)), f"{method} {d.path} allowed as {d.method}"
    return weaken


def field_moved(nth_route: int) -> Callable[[Plan], tuple[Plan, str]]:
    """One field the plan rejects allowed on one route only (routes with rejected fields, by
    path: the ``nth_route``-th from the end; fields: one not governed by the body policy)."""
    def weaken(plan: Plan) -> tuple[Plan, str]:
        routes = [d for d in sorted(plan.allowed, key=lambda d: (d.path, d.method))
                  if d.kind == "http" and d.fields.names("reject")]
        if len(routes) <= nth_route:
            raise NotApplicable("too few routes that reject a field")
        d = routes[-1 - nth_route]
        governed = {f for fs in GOVERNED_FIELDS.values() for f in fs}
        names = [f for f in d.fields.names("reject") if f not in governed] or list(d.fields.names("reject"))
        name = names[len(names) // 2]
        new = replace(d, fields=replace(d.fields, named={**d.fields.named, name: "allow"}))
        return with_decision(plan, d, new), f"{where(d)}: {name} allowed"
    return weaken


def governed_moved(plan: Plan) -> tuple[Plan, str]:
    """A field the body policy governs (chat_template) allowed on one route of another audience
    than :func:`field_moved`'s."""
    routes = [d for d in sorted(plan.allowed, key=lambda d: (d.path, d.method))
              if d.kind == "http" and d.fields.mode("chat_template") == "reject"]
    if not routes:
        raise NotApplicable("no route rejects chat_template")
    first = routes[-1].audience
    d = next((r for r in reversed(routes) if r.audience != first), routes[-1])
    new = replace(d, fields=replace(d.fields, named={**d.fields.named, "chat_template": "allow"}))
    return with_decision(plan, d, new), f"{where(d)}: chat_template allowed"


def unknown_moved(plan: Plan) -> tuple[Plan, str]:
    """The unknown-field rule relaxed on one route: reject -> strip (an unknown field is dropped
    silently and the request forwarded). Not "pass": NGINX's fast path would then list every
    rejected field in one regex, longer than a config parameter may be."""
    d = pick(plan, "that rejects unknown fields", lambda d: d.fields.unknown == "reject", last=True)
    new = replace(d, fields=replace(d.fields, unknown="strip"))
    return with_decision(plan, d, new), f"{where(d)}: unknown fields stripped, not refused"


def values_unlisted(d: Decision) -> tuple[Decision, str]:
    return replace(d, fields=replace(d.fields, values={})), f"any value of {', '.join(d.fields.values)}"


def fields_cleared(d: Decision) -> tuple[Decision, str]:
    return replace(d, fields=FieldRules()), "no field rules"


# --- one definition per operator: the same weakening on both proxies ---------------------------

def _true(plan: Plan, d: Decision | None) -> object:
    return True


@dataclass(frozen=True)
class Setting:
    """A switch of the weakening of both proxies' models (a field of the same name on NGINX's
    ``Weakening`` and ``EnvoyWeakening``) set on the whole config to ``value`` (of the plan and
    the route ``pick`` chose before anything is rendered; None: no route picked)."""

    field: str
    what: str
    pick: Callable[[Plan], Decision | None] | None = None
    value: Callable[[Plan, Decision | None], object] = _true

    def said(self, d: Decision | None, value: object) -> str:
        """What changed: ``what`` (its ``{value}`` the switch's value) on the route ``d`` picked."""
        what = self.what.format(value=value)
        return f"{where(d)}: {what}" if d is not None else what


@dataclass(frozen=True)
class RuleEdit:
    """The rule program of the body check of the route ``pick`` chooses, changed by ``change``
    (a new program for that route; the other routes keep theirs)."""

    pick: Pick
    change: Callable[[list[Step]], list[Step]]
    what: str


@dataclass(frozen=True)
class Edit:
    """A change of the proxy's own model where the two models differ in shape (a location's
    blocks or a route's filters, a header list): each proxy module holds it under the operator's
    name (its ``EDITS``)."""


Switch = Weaken | Setting | RuleEdit | Edit   # Weaken: a plan transform both generators render


@dataclass(frozen=True)
class Definition:
    """One operator, the same on both proxies: registered as ``nginx.NAME`` and ``envoy.NAME``."""

    name: str
    family: str
    target: str
    title: str
    catches: tuple[str, ...]
    switch: Switch
    needs: str = ""


M = TypeVar("M")   # a proxy's generator model
ModelEdit = Callable[[M, Plan], tuple[M, str]]   # (its model, the plan) -> (the changed model, what changed)


@dataclass(frozen=True)
class Applier(Generic[M]):
    """How one proxy applies each kind of switch to its model, and renders it."""

    kind: str
    render: Callable[[Path, Plan, ModelEdit[M] | None], str]   # the plan, its model changed by the edit
    switch: Callable[[M, str, object], M]         # the model with one weakening switch set
    guards: Mapping[str, Callable[[M], str]]      # why a switch cannot apply to a model ("" it can)
    rules: Callable[[RuleEdit], ModelEdit[M]]
    edits: Mapping[str, ModelEdit[M]]             # the Edit definitions, by name


def register_definitions(applier: Applier[M]) -> None:
    """Register every :data:`DEFINITIONS` entry for ``applier.kind``."""
    missing = {d.name for d in DEFINITIONS if isinstance(d.switch, Edit)} - set(applier.edits)
    if missing:
        raise ValueError(f"{applier.kind}: no model edit for {', '.join(sorted(missing))}")
    for d in DEFINITIONS:
        register(Operator(f"{applier.kind}.{d.name}", applier.kind, d.family, d.target, d.title, d.catches,
                          _applied(applier, d), d.needs))


def setting(applier: Applier[M], s: Setting, d: Decision | None) -> ModelEdit[M]:
    """The model edit setting ``s`` (``d``: the route it picked), unless a guard says why not."""
    def edit(model: M, plan: Plan) -> tuple[M, str]:
        guard = applier.guards.get(s.field)
        why = guard(model) if guard is not None else ""
        if why:
            raise NotApplicable(why)
        value = s.value(plan, d)
        return applier.switch(model, s.field, value), s.said(d, value)
    return edit


def _applied(applier: Applier[M], definition: Definition) -> Apply:
    s = definition.switch

    def apply(directory: Path, plan: Plan) -> str:
        if isinstance(s, Setting):   # its route picked before anything is rendered
            return applier.render(directory, plan, setting(applier, s, s.pick(plan) if s.pick else None))
        if isinstance(s, RuleEdit):
            return applier.render(directory, plan, applier.rules(s))
        if isinstance(s, Edit):
            return applier.render(directory, plan, applier.edits[definition.name])
        weak, what = s(plan)
        applier.render(directory, weak, None)
        return what
    return apply


def weakening(name: str) -> Weaken:
    """The plan transform of the operator ``name``."""
    s = next(d.switch for d in DEFINITIONS if d.name == name)
    if isinstance(s, Setting | RuleEdit | Edit):
        raise ValueError(f"{name} is no plan transform")
    return s


# the switches' values and the rule programs' changes

def first_principal(plan: Plan, d: Decision | None) -> tuple[str, str]:
    """(name, role) of the first key principal by name: the one an unknown key is taken for."""
    first = sorted(plan.principals, key=lambda p: p.name)
    if not first:
        raise NotApplicable("no principals")
    return first[0].name, first[0].role


def key_checked(plan: Plan) -> None:
    if not plan.principals:
        raise NotApplicable("no key principals")


# the length of every key vllm-perimeter makes (keys new, verify's keys): "vp_" + 43 characters
KEY_LEN = len(new_key())


def key_length(plan: Plan, d: Decision | None) -> int:
    return KEY_LEN


def cert_anyone(plan: Plan, d: Decision | None) -> str:
    assert d is not None
    return cert_role(plan, d)


def upstream_keyed(plan: Plan) -> None:
    if not plan.upstream.api_key_file:
        raise NotApplicable("the policy sets no upstream.api_key_file")


def listened_tls(plan: Plan) -> None:
    if plan.listen.tls is None:
        raise NotApplicable("the listener speaks plain HTTP (no listen.tls)")


def without(op: str) -> Callable[[list[Step]], list[Step]]:
    return lambda steps: [s for s in steps if s.op != op]


def budget_x10(steps: list[Step]) -> list[Step]:
    return [written_x10(s) if s.op == "budget" else s for s in steps]


def unsalted(steps: list[Step]) -> list[Step]:
    """No salt step, and the client's cache_salt allowed through the field rules."""
    return [s.model_copy(update={"modes": {**s.modes, "cache_salt": "allow"}}) if isinstance(s, Keys) else s
            for s in without("salt")(steps)]


JWT_NEEDS = "auth: jwt"
CERT_NEEDS = "auth: cert"
TLS_NEEDS = "listen.tls"


def _jwt(name: str, target: str, title: str, field: str, what: str) -> Definition:
    """A check of every auth: jwt route's token verification weakened."""
    return Definition(name, "source" if name == "principal-namespace-collision" else "remove", target, title,
                      ("identity",), Setting(field, f"(every auth: jwt route) {what}", token_checked),
                      JWT_NEEDS)


def _cert(name: str, title: str, field: str, what: str,
          value: Callable[[Plan, Decision | None], object] = _true) -> Definition:
    """A check of every auth: cert route's client certificate weakened."""
    target = ("the client certificate's verification" if field == "cert_any_ca"
              else "the client certificate's name")
    return Definition(name, "remove", target, title, ("mtls",),
                      Setting(field, f"(every auth: cert route) {what}", cert_checked, value), CERT_NEEDS)


def _definitions() -> tuple[Definition, ...]:
    """Every operator both proxies have: the plan transforms, then the switches of their models."""
    def role_add(target: Pick) -> Weaken:
        return lambda plan: on(target, role_added(plan))(plan)

    return (
        Definition("key-check-removed", "remove", "a route that needs a key",
                   "one route's key check removed",
                   ("matrix",), on(keyed, removed("key"))),
        Definition("role-check-removed", "remove", "a route limited to some roles",
                   "one route's role check removed (any principal)",
                   ("matrix",), on(roled, removed("roles"))),
        Definition("network-check-removed", "remove", "a route limited to some networks",
                   "one route's network check removed", ("matrix",), on(networked, removed("networks"))),
        Definition("rate-limit-removed", "remove", "a rate-limited route", "one route's rate limit removed",
                   ("rate",), on(rated, removed("rate"))),
        Definition("concurrency-limit-removed", "remove", "a route with a concurrency limit",
                   "one route's concurrency limit removed",
                   ("concurrency",), on(limited, removed("concurrency"))),
        Definition("json-cap-removed", "remove", "a route with JSON caps", "one route's JSON caps removed",
                   ("limits",), on(capped, removed("json_caps"))),
        Definition("count-caps-removed", "remove", "a route with count caps",
                   "one route's count caps removed",
                   ("limits",), on(counted, removed("counts"))),
        Definition("field-rules-removed", "remove", "a route with field rules",
                   "one route's field rules removed (every field passes)", ("limits",),
                   on(lambda p: pick(p, "with field rules", lambda d: d.fields.decided, last=True),
                      fields_cleared)),
        Definition("values-check-removed", "remove", "a route with listed values",
                   "one route lets any value of its listed-values fields through", ("limits",),
                   on(listed, values_unlisted), needs="fields.values"),
        Definition("multiplier-ignored", "remove", "a route with envelope caps and n / best_of",
                   "one route's envelope ignores a multiplier (n): caps and budget count fewer sequences",
                   ("limits", "token-budget"), on(multiplied, multiplier_dropped)),
        Definition("ownership-unchecked", "remove", "the routes naming stored responses",
                   "stored responses' seals not checked on the way in (any principal names any id)",
                   ("ownership",), ownership_unchecked, needs="body.responses"),
        Definition("rate-raised-x10", "raise", "a rate-limited route", "one route's rate x10", ("rate",),
                   on(rated_by_principal, raised("rate", 10))),
        Definition("burst-raised-x100", "raise", "a rate-limited route",
                   "one route's burst x100", ("rate",),
                   on(rated, raised("burst", 100))),
        Definition("concurrency-raised-x10", "raise", "a route with a concurrency limit",
                   "one route's concurrency x10", ("concurrency",),
                   on(limited_generation, raised("concurrency", 10))),
        Definition("json-cap-raised-x100", "raise", "a route with JSON caps", "one route's JSON caps x100",
                   ("limits",), on(capped, raised("json_caps", 100))),
        Definition("count-caps-raised-x10", "raise", "a route with count caps",
                   "one route's count caps x10",
                   ("limits",), on(counted, raised("counts", 10))),
        Definition("timeout-raised-x10", "raise",
                   "a route with an upstream timeout the witness can outlast",
                   "one route's upstream timeout x10", ("timeout",), on(timed, raised("timeout_s", 10))),
        Definition("body-limit-raised", "raise", "a route with a body limit", "one route's body limit x100",
                   ("limits",), on(bodied, raised("body_bytes", 100))),
        Definition("token-budget-raised-x1000", "raise", "a route with a token budget",
                   "one route's token budget x1000", ("token-budget",),
                   on(token_budgeted, raised("tokens_per_minute", 1000)), needs="limits.tokens_per_minute"),
        Definition("bucket-two-minutes", "raise", "a token zone",
                   "one token zone's bucket holds twice its capacity (the refill unchanged: up to 2 C + N "
                   "a minute)", ("token-budget",), bucket_doubled, needs="limits.tokens_per_minute"),
        Definition("envelope-cap-raised", "raise", "a route with envelope caps and a list multiplier",
                   "one route's max_sequences and max_request_tokens x10", ("limits",),
                   on(envelope_capped, envelope_caps_raised(10))),
        Definition("media-domain-widened", "widen", "a route's exact media domain",
                   "one route's listed media domain widened to a wildcard of its parent", ("media",),
                   on(media_listed, domain_widened), needs="media.domains"),
        Definition("network-widened-24", "widen", "a route on the first network set",
                   "one route's network widened to its /24",
                   ("matrix",), on(on_network_set(0), widened(24))),
        Definition("network-widened-8", "widen", "a route on the second network set",
                   "one route's network widened to its /8", ("matrix",), on(on_network_set(1), widened(8))),
        Definition("network-widened-everywhere", "widen", "a route on the third network set",
                   "one route's network widened to 0.0.0.0/0",
                   ("matrix",), on(on_network_set(2), widened(0))),
        Definition("role-added", "add", "a route limited to some roles", "a role admitted to one route",
                   ("matrix",), role_add(roled)),
        Definition("role-added-other", "add", "a route limited to other roles",
                   "a role admitted to a route of another role set", ("matrix",), role_add(roled_other)),
        Definition("method-added-get", "add", "a route without GET", "GET answered on a route without it",
                   ("matrix",), method_added("GET")),
        Definition("method-added-delete", "add", "a route without DELETE",
                   "DELETE answered on a route without it", ("matrix",), method_added("DELETE")),
        Definition("field-allowed-on-one-route", "move", "the last route rejecting a field",
                   "one rejected field allowed on one route", ("limits",), field_moved(0)),
        Definition("field-allowed-on-another-route", "move", "another route rejecting a field",
                   "one rejected field allowed on another route", ("limits",), field_moved(3)),
        Definition("chat-template-allowed-on-one-route", "move", "a route rejecting chat_template",
                   "a client chat_template allowed on one route", ("limits",), governed_moved),
        Definition("unknown-fields-allowed-on-one-route", "move", "a route rejecting unknown fields",
                   "the unknown-field rule relaxed on one route", ("limits",), unknown_moved),
        # remove: a check the plan has no word for
        Definition("forbidden-field-check-removed", "remove", "a route with field rules and JSON caps",
                   "one route passes the fields the policy forbids", ("limits",),
                   RuleEdit(field_checked, without("keys"), "rule program without keys")),
        Definition("media-check-removed", "remove", "a route with media rules",
                   "one route passes any media URL, data and embeddings", ("media",),
                   RuleEdit(media_checked, without("media"), "rule program without media")),
        Definition("budget-not-enforced", "remove", "a route with an output budget",
                   "one route forwards bodies without an output budget as sent", ("limits",),
                   RuleEdit(budgeted, without("budget"), "rule program without budget")),
        Definition("written-budget-raised", "raise", "a route with an output budget written in",
                   "one route writes its output budget x10 into the bodies without one (its caps unchanged)",
                   ("limits",), RuleEdit(budget_written, budget_x10, "its budget step writes x10")),
        Definition("token-budget-removed", "remove", "a token zone",
                   "one token zone's budget removed (nothing charged)", ("token-budget",), Edit(),
                   needs="limits.tokens_per_minute"),
        Definition("settlement-skipped", "remove", "a token zone",
                   "answers no longer settle a token zone's charge (its bucket keeps each request's whole "
                   "reservation: the credits of settled answers ignored)", ("token-budget",), Edit(),
                   needs="limits.tokens_per_minute"),
        Definition("ownership-unbound", "remove", "the response seal",
                   "stored responses' seals not bound to the principal (any principal's seal is every "
                   "principal's)", ("ownership",),
                   Setting("owner_unbound", "the seal computed without the principal", owned),
                   needs="body.responses"),
        Definition("any-key-accepted", "remove", "the key lookup", "an unknown key is taken for a principal",
                   ("matrix",), Setting("any_key", "unknown keys -> {value[0]}",
                                        value=first_principal)),
        Definition("upstream-errors-passed", "remove", "a route with an output budget",
                   "vLLM's 5xx bodies reach the client on one route (where it forwards bodies as sent)",
                   ("upstream",), Edit()),
        _jwt("jwt-signature-unchecked", "the token verification",
             "a token that fails verification (its signature, kid or alg) is admitted",
             "jwt_signature_unchecked", "a token failing verification admitted"),
        _jwt("jwt-audience-unchecked", "the token's audience", "a token for another audience is admitted",
             "jwt_audience_unchecked", "the audience check removed"),
        _jwt("jwt-expiry-unchecked", "the token's expiry", "an expired token is admitted",
             "jwt_expiry_unchecked", "the expiry check removed"),
        _jwt("jwt-issuer-unchecked", "the token's issuer", "a token from another issuer is admitted",
             "jwt_issuer_unchecked", "the issuer check removed"),
        _jwt("jwt-issuer-prefix", "the token's issuer",
             "a token whose issuer merely starts with an allowed one is admitted (the exact match loosened "
             "to a prefix: https://idp.example/realms/llm2 passes for .../llm)",
             "jwt_issuer_prefix", "the issuer compared as a prefix"),
        _jwt("jwt-crit-ignored", "the token's crit header",
             "a token naming an extension nobody understands in crit is admitted",
             "jwt_crit_ignored", "the crit check removed"),
        _jwt("jwt-trailing-accepted", "the token's form",
             "a token followed by '.', '..' or '==' is admitted (the trailing characters stripped before its "
             "form is checked, as lax JWT libraries do)",
             "jwt_trailing_accepted", "trailing dots and padding stripped from the token"),
        _jwt("principal-namespace-collision", "the token principal's kind",
             "a token principal named by its claim alone (no jwt:ID: prefix): a subject equal to a key "
             "principal's name is that principal (its header, log name, seals)",
             "jwt_unprefixed", "the token principal's jwt:ID: prefix dropped"),
        _cert("cert-any-ca", "any CA accepted: the client certificate's chain not verified and the "
              "verification result unread (a certificate from another CA, or expired, names its principal)",
              "cert_any_ca", "client certificates not verified"),
        _cert("cert-san-unchecked", "any verified certificate is a principal (its URI SAN and subject not "
              "looked up)", "cert_anyone", "an unknown certificate names 'anyone'", cert_anyone),
        _cert("cert-san-fallback", "a certificate whose URI SAN names nobody (a revoked SPIFFE ID) is named "
              "by its subject instead (the fallback SPIFFE semantics forbid)",
              "cert_subject_fallback", "an unlisted URI SAN falls back to the subject"),
        Definition("cert-revoked-mapped", "remove", "a revoked certificate principal",
                   "a principal the plan no longer lists is still mapped (the principals file not "
                   "regenerated): the probe's unknown name stands for it", ("mtls",), Edit(),
                   needs=CERT_NEEDS),
        # add
        Definition("tls-legacy-versions", "add", "the listener's TLS versions and suites",
                   "TLS 1.0 and 1.1 admitted on the listener, with the legacy (CBC) cipher suites they need",
                   ("tls",), Setting("tls_legacy", "listener from TLS 1.0, legacy cipher suites added",
                                     listened_tls), needs=TLS_NEEDS),
        # source: a fact the perimeter decides taken from the client
        Definition("network-from-forwarding-header", "source", "the listener",
                   "client address taken from X-Forwarded-For", ("spoof", "matrix"),
                   Setting("xff_from_anyone", "the client address from X-Forwarded-For, whoever sends it")),
        Definition("host-from-client", "source", "every proxying route",
                   "the client's Host forwarded upstream", ("upstream",),
                   Setting("host_from_client", "the client's Host forwarded")),
        Definition("principal-header-from-client", "source", "the principal header",
                   "the principal header the client sends is kept (reaches vLLM)", ("upstream",), Edit()),
        Definition("rate-zone-by-address", "source", "a rate limit counted per principal",
                   "a rate limit keyed by client address instead of principal", ("rate",), Edit()),
        # loosen: a route's match wider, the key lookup's
        Definition("parameter-any", "loosen", "a template route's match",
                   "a template parameter matches .+ (any characters, slashes too)", ("bypass", "upstream"),
                   Edit()),
        Definition("case-insensitive", "loosen", "a template route's match",
                   "a template route matches any case", ("bypass", "matrix"), Edit()),
        Definition("exact-to-prefix", "loosen", "an exact GET route's match",
                   "an exact path match made a prefix match", ("bypass", "sweep"), Edit()),
        Definition("key-digest-accepted", "loosen", "the key lookup",
                   "a bearer of 64 hex digits is taken as its own sha256 (pass-the-hash: a key's digest, "
                   "from the principals file, admits as the key)", ("near-miss",),
                   Setting("key_digest_accepted", "(every auth: key route) a key's sha256 hex admitted as "
                           "the key", key_checked)),
        Definition("key-prefix-compared", "loosen", "the key lookup",
                   "only the bearer's first characters (a key's length) are hashed: the key with anything "
                   "appended admits", ("near-miss",),
                   Setting("key_prefix", "(every auth: key route) only the bearer's first {value} characters "
                           "hashed", key_checked, key_length)),
        # expose
        Definition("upgrade-on-plain-route", "expose", "a GET route",
                   "one plain route passes WebSocket upgrades", ("upstream", "matrix"), Edit()),
        # NGINX 1.22's port then speaks HTTP/2 only (unreachable)
        Definition("h2c-accepted", "expose", "the listener",
                   "the listener also speaks HTTP/2 in clear text (prior knowledge)",
                   ("protocol", "unreachable"),
                   Setting("h2c", "HTTP/2 in clear text on the listener")),
        Definition("grpc-accepted", "expose", "the listener",
                   "gRPC-shaped requests (content-type application/grpc) no longer refused", ("protocol",),
                   Setting("grpc_accepted", "the application/grpc refusal dropped")),
        # forward: what reaches vLLM
        Definition("raw-target-forwarded", "forward", "the path forwarded",
                   "the raw request target forwarded, not the normalised path", ("upstream", "bypass"),
                   Edit()),
        Definition("client-key-forwarded", "forward", "every proxying route",
                   "the client's Authorization forwarded upstream", ("upstream",), Edit()),
        Definition("upstream-key-not-presented", "forward", "every proxying route",
                   "vLLM's own key no longer sent upstream", ("upstream",),
                   Setting("upstream_key_dropped", "vLLM's key not added", upstream_keyed),
                   needs="upstream.api_key_file"),
        Definition("client-headers-forwarded", "forward", "every proxying route",
                   "every client header forwarded (no allowlist: hop-by-hop, spoofable)", ("upstream",),
                   Setting("client_headers", "every client header passed on")),
        Definition("vllm-header-forwarded", "forward", "every proxying route",
                   "X-Vllm-Priority from the client forwarded (queue jumping)", ("upstream",), Edit()),
        Definition("request-id-from-client", "forward", "every proxying route",
                   "the client's X-Request-Id reaches vLLM (not the proxy's own)", ("upstream",),
                   Setting("request_id_from_client", "the client's X-Request-Id passed on")),
        Definition("salt-not-rewritten", "forward", "a salted route",
                   "one route forwards the client's cache_salt (no tenant salt)", ("limits",),
                   RuleEdit(salted, unsalted, "rule program without salt"), needs="body.cache_salt"),
    )


DEFINITIONS: tuple[Definition, ...] = _definitions()
