"""The plan document (``plan --format json``): what the plan decided, as a CI system or a
reviewer reads it. The plan's own classes (:mod:`scanner.plan.model`) hold what the generators
and the prober need; a decision's document is a view of one (its limits with the cap paths the
plan derived, its field rules by mode, its budget, media and ownership) that
``Decision.to_dict`` and ``Plan.to_json`` build and :func:`scanner.jsondoc.dump` writes. These
classes are the one statement of that view's shape: ``schemas/plan.schema.json`` is generated
from them. A part the plan holds whole is its own class here: the envelope
(:class:`~scanner.plan.envelope.EnvelopeSpec`), the output budget
(:class:`~scanner.plan.model.Budget`, there), a rate and the body policy (the policy's
:class:`~scanner.policy.model.Rate`, :class:`~scanner.policy.model.BodyPolicy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from scanner.inventory.model import RouteKind
from scanner.jsondoc import CONFIG, Flag, Int, Num, Str, Version1, absent, empty
from scanner.plan.budget import Budget
from scanner.plan.envelope import EnvelopeSpec
from scanner.policy.media import UrlMode
from scanner.policy.model import AudienceKind, BodyPolicy, Pin, Rate

Auth = Literal["key", "none", "jwt", "cert"]
Unknown = Literal["reject", "strip", "pass"]


@dataclass(frozen=True)
class LimitsView:
    """A decision's limits: the audience's, with the positions its json caps apply at."""

    __pydantic_config__: ClassVar = CONFIG
    body_bytes: Int | None
    json_caps: Mapping[Str, Int]
    rate: Rate | None
    concurrency: Int | None
    timeout_s: Num | None
    cap_paths: Annotated[Mapping[Str, Int] | None, Field(
        exclude_if=absent, description="every position a json cap applies at (a dotted path: nested in the "
        "request model), where the model has one nested (Decision.cap_paths)")] = None
    tokens_per_minute: Annotated[Int | None, Field(exclude_if=absent)] = None
    tokens_burst: Annotated[Int | None, Field(
        exclude_if=absent, description="the token budget's capacity the plan decided (tokens_burst, default "
        "ceil(tokens_per_minute / 4); at least the policy's own max_request_tokens when that is within "
        "tokens_per_minute): at most tokens_burst + tokens_per_minute x t / 60 in any t seconds")] = None
    max_sequences: Annotated[Int | None, Field(exclude_if=absent)] = None
    max_request_tokens: Annotated[Int | None, Field(exclude_if=absent)] = None
    max_request_tokens_by: Annotated[Literal["tokens_burst"] | None, Field(
        exclude_if=absent, description="tokens_burst: the token budget's capacity set max_request_tokens (a "
        "request whose envelope is over the bucket's capacity can never be admitted: refused 400 "
        "envelope-tokens)")] = None


@dataclass(frozen=True)
class FieldsView:
    """A decision's top-level body fields by mode, and the values it checks or writes."""

    __pydantic_config__: ClassVar = CONFIG
    allow: tuple[Str, ...]
    reject: tuple[Str, ...]
    strip: tuple[Str, ...]
    unknown: Unknown
    counts: Annotated[Mapping[Str, Int], Field(
        exclude_if=empty, description="most items per field (list, object keys)")] = field(
        default_factory=dict)
    pins: Annotated[Mapping[Str, Pin], Field(
        exclude_if=empty, description="values every body leaves with")] = field(default_factory=dict)
    values: Annotated[Mapping[Str, tuple[Pin, ...]], Field(
        exclude_if=empty, description="the values a field may hold when present and not null")] = field(
        default_factory=dict)
    salt: Annotated[Literal["principal", "audience"] | None, Field(
        exclude_if=absent, description="every JSON body leaves with the perimeter's cache_salt of the "
        "principal (or audience), the client's replaced")] = None


@dataclass(frozen=True)
class MediaView:
    """The media rules enforced on a route (the audience's, scanner.policy.media.MediaRules),
    and where its request model can carry media."""

    __pydantic_config__: ClassVar = CONFIG
    urls: UrlMode
    domains: tuple[Str, ...]
    data_max_bytes: Int | None
    max_items: Int | None
    embeds: Literal["deny", "allow"]
    at: Annotated[tuple[Str, ...], Field(description="where the route's request model can carry media "
                                                     "(inventory paths)")]


@dataclass(frozen=True)
class OwnerView:
    """Ownership of stored responses on a route (body: responses: owned)."""

    __pydantic_config__: ClassVar = CONFIG
    param: Annotated[Str, Field(description="the path parameter naming a stored response: its seal checked, "
                                            "removed")]
    fields: Annotated[tuple[Str, ...], Field(description="top-level body fields naming a stored response: "
                                                         "the same")]
    seal: Annotated[Flag, Field(description="response ids in the route's answers are sealed to the "
                                            "principal")]


@dataclass(frozen=True)
class DecisionView:
    """What the perimeter does with one method on one route (scanner.plan.model.Decision)."""

    __pydantic_config__: ClassVar = CONFIG
    method: Str
    path: Str
    kind: RouteKind                  # grpc: a decision of the gRPC listener (GrpcView)
    action: Literal["allow", "deny"]
    reason: Str
    audience: Str
    audience_kind: AudienceKind
    auth: Auth
    roles: tuple[Str, ...]
    networks: tuple[Str, ...]
    limits: LimitsView
    budget: Budget | None
    fields: FieldsView
    media: Annotated[MediaView | None, Field(description="the media rules enforced on this route")]
    state_changing: Flag
    state_changing_by: Str
    upstream_guarded: Flag
    rule_line: Int
    jwt: Annotated[Mapping[Str, Any] | None, Field(
        exclude_if=absent, description="auth jwt: the token rules and the JWKS keys' kid, type and "
        "algorithms")] = None
    envelope: Annotated[EnvelopeSpec | None, Field(
        exclude_if=absent, description="the fields multiplying its work, where it caps or charges "
        "them")] = None
    owner: Annotated[OwnerView | None, Field(
        exclude_if=absent, description="ownership of stored responses (body: responses: owned)")] = None


@dataclass(frozen=True)
class GrpcView:
    """The gRPC listener's decisions (scanner.plan.model.GrpcPlan): one per method, kind grpc."""

    __pydantic_config__: ClassVar = CONFIG
    listen: Mapping[Str, Any]
    upstream: Str
    inventory: Str
    decisions: tuple[DecisionView, ...]
    uncovered: tuple[Str, ...]
    unused_rules: tuple[Str, ...]
    unenforced: tuple[Str, ...]


@dataclass(frozen=True)
class PlanView:
    """One decision per method and path (``plan --format json``)."""

    __pydantic_config__: ClassVar = CONFIG
    schema_version: Version1
    policy: Mapping[Str, Str]
    inventory_hash: Str
    vllm_version: Str
    listen: Mapping[Str, Any]
    upstream: Mapping[Str, Any]
    body: BodyPolicy
    trusted_proxies: tuple[Str, ...]
    networks: Mapping[Str, tuple[Str, ...]]
    principals: tuple[Mapping[Str, Str], ...]
    decisions: tuple[DecisionView, ...]
    uncovered: tuple[Str, ...]
    unused_rules: tuple[Str, ...]
    unnamed_fields: tuple[Str, ...]
    digest: Str
    cert_principals: Annotated[tuple[Mapping[Str, Str], ...], Field(
        exclude_if=empty, description="auth cert: principals by a client certificate's URI SAN or "
        "subject")] = ()
    responses_shared: Annotated[tuple[Str, ...], Field(
        exclude_if=empty, description="end users' routes taking a stored response's id while stored "
        "responses are shared (body: responses: shared)")] = ()
    grpc: Annotated[GrpcView | None, Field(
        exclude_if=absent, description="the gRPC listener's decisions")] = None
    shared: Annotated[Mapping[Str, Any] | None, Field(
        exclude_if=absent, description="the fleet's shared limits (zones, local shares)")] = None
