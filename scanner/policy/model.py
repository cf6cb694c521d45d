"""Policy models: validated, frozen, versioned data (see ``policies/vllm-default.yaml``).

Each class states one section of the policy YAML once: its keys (the fields), defaults, checks
(validators) and JSON Schema (``schemas/policy.schema.json`` is generated from these);
``scanner.policy.load`` reads the YAML into them, ``scanner.policy.base`` is what they share."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import field, fields
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, Strict, ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass

from scanner import patterns
from scanner import store_url as redis_url
from scanner.errors import ConfigError
from scanner.jsondoc import absent
from scanner.policy.base import (
    CONFIG,
    Base,
    Flag,
    Hidden,
    Int,
    Internal,
    Line,
    Num,
    Str,
    Text,
    YamlMap,
    absolute_file,
    base_dir,
    fail,
    hint,
    line_of,
    reading,
    replace,
    sub,
)
from scanner.policy.certs import MAX_VERIFY_DEPTH, read_ca_bundle, san_problem, subject_problem
from scanner.policy.jwt import JwtAuth
from scanner.policy.media import END_USER_DEFAULT, MediaRules

AudienceKind = Literal["end-user", "service", "operator", "monitoring", "none"]
AUDIENCE_KINDS: tuple[str, ...] = ("end-user", "service", "operator", "monitoring", "none")
CacheSalt = Literal["pass", "reject", "strip", "per-principal", "per-audience"]
ChatTemplate = Literal["pass", "reject", "strip"]
CACHE_SALT_CHOICES: tuple[str, ...] = ("pass", "reject", "strip", "per-principal", "per-audience")
# Tenant-scoped prefix cache: the perimeter writes its own cache_salt, HMAC-SHA256(secret, subject),
# over any client's (vLLM shares prefix-cache hits only among requests with one salt).
SALTED: tuple[str, ...] = ("per-principal", "per-audience")
CHAT_TEMPLATE_CHOICES: tuple[str, ...] = ("pass", "reject", "strip")
# Stored responses: "shared" (vLLM's own behaviour: any caller naming an id reaches it) or "owned"
# (each id the perimeter hands out is bound to its principal: scanner/plan/owner.py)
Responses = Literal["shared", "owned"]
RESPONSES_CHOICES: tuple[str, ...] = ("shared", "owned")
# What the perimeter does when a request omits the field its route reads its output budget from
# (vLLM then generates up to the rest of the context window): write the cap in, refuse, or pass.
WhenAbsent = Literal["inject", "reject", "pass"]
WHEN_ABSENT_CHOICES: tuple[str, ...] = ("inject", "reject", "pass")
# Top-level request fields whose numeric value a policy may cap.
CAPPABLE_FIELDS: tuple[str, ...] = (
    "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of",
    "logprobs", "top_logprobs", "prompt_logprobs",
)
# The largest JSON cap both proxies compare exactly: njs and Lua read numbers as doubles, which
# hold every integer up to 2^53, so no integer over such a cap reads as within it.
MAX_JSON_CAP = 2 ** 53 - 1
# What an audience does with a top-level request-body field it names, and with those it does not.
FIELD_MODES: tuple[str, ...] = ("allow", "reject", "strip")
UNKNOWN_FIELD_CHOICES: tuple[str, ...] = ("reject", "strip", "pass")
# The largest per-request envelope cap (limits.max_sequences, max_request_tokens) either proxy can
# take: Envoy's hits_addend is a 32-bit count; njs and Lua count in doubles.
MAX_COUNT = (1 << 31) - 1
METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
SCHEMA_VERSION = 1


def default_tokens_burst(tokens_per_minute: int) -> int:
    """A token budget's capacity when the policy names none: a quarter of the minute, rounded up,
    so any 60 s window admits at most 1.25 x tokens_per_minute (the bucket full, then its refill)."""
    return -(-tokens_per_minute // 4)


Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
Count = Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
_ROLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# a key or certificate principal's name: what both generators write (scanner.generate.common.NAME),
# never a ':', so no token principal (scanner.plan.jwt: jwt:ID:CLAIM) can be named like one
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_FIELD_LISTS = {"allow": "allow", "deny": "reject", "strip": "strip"}
_GRPC_METHOD = re.compile(r"^/[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*/([A-Za-z_][A-Za-z0-9_]*|\*)$")


@dataclass(frozen=True, config=CONFIG)
class Rate(Base):
    rps: Annotated[float, Strict(), Field(gt=0)]
    burst: Int = Field(default=0, ge=0)


@dataclass(frozen=True, config=CONFIG)
class Limits(Base):
    """Limits for a route and audience. None means "not limited by this policy"."""

    body_bytes: Int | None = Field(default=None, ge=1)
    json_caps: Mapping[str, Annotated[int, Strict(), Field(ge=0, le=MAX_JSON_CAP)]] = Field(
        default_factory=dict, description="the most a numeric top-level field may hold: "
        + ", ".join(CAPPABLE_FIELDS))
    rate: Rate | None = None
    concurrency: Int | None = Field(default=None, ge=1)
    timeout_s: Num | None = Field(default=None, gt=0)
    when_absent: WhenAbsent | None = Field(   # None: not set here ("inject" when nothing sets it)
        default=None, description="when a request omits the field its route reads its output budget from "
        "(max_tokens, max_completion_tokens, max_output_tokens): write the cap in (default), refuse, or pass")
    # per principal (per client address on auth "none"), charged at admission: the request's
    # output budget + body bytes / 4 (scanner.plan.body.token_cost); None: no token budget
    tokens_per_minute: Int | None = Field(
        default=None, ge=1, description="token budget per principal (per client address on auth: none) and "
        "minute, charged at admission: the request's admitted envelope (sequences x output budget per "
        "sequence, as sent or the cap written in, plus its body bytes); over it: 429 token-budget with "
        "Retry-After")
    # the most of that budget one principal may spend at once (the bucket's capacity, refilled at
    # tokens_per_minute / 60 a second): None here means the default, ceil(tokens_per_minute / 4)
    # (default_tokens_burst); in a plan's Decision.limits, the capacity the plan decided
    # (scanner/plan/build.py request_token_cap)
    tokens_burst: Count | None = Field(
        default=None, description="the most of tokens_per_minute one principal may spend at once (the "
        "budget's bucket capacity, refilled at tokens_per_minute / 60 a second; at most tokens_per_minute): "
        "any 60 s window admits at most tokens_burst + tokens_per_minute; default "
        "ceil(tokens_per_minute / 4) (1.25 x the minute). A request costing more than the capacity is "
        "refused 400 envelope-tokens")
    # per request, the admitted envelope (scanner/plan/envelope.py): the most sequences one body
    # may run, and the most tokens (sequences x output budget per sequence + input estimate)
    max_sequences: Count | None = Field(
        default=None, description="the most sequences one request may run (its prompts, conversations, "
        "inputs or pairs x n / best_of); over it: 400 envelope-sequences")
    max_request_tokens: Count | None = Field(
        default=None, description="the most tokens one request may ask for (sequences x output budget per "
        "sequence + body bytes); over it: 400 envelope-tokens")

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Limits:
        for name in self.json_caps if reading(info) else ():
            if name not in CAPPABLE_FIELDS:
                raise fail(f"cannot cap {name!r}; cappable fields: {', '.join(CAPPABLE_FIELDS)}"
                           + hint(name, CAPPABLE_FIELDS), "json_caps", name)
        return self

    def merged(self, override: Limits | None) -> Limits:
        """This audience's limits with a route's ``override``: each value the override sets (not
        None) wins; JSON caps merge, the override's per field."""
        if override is None:
            return self
        values = {f.name: getattr(override, f.name) if getattr(override, f.name) is not None
                  else getattr(self, f.name) for f in fields(self)}
        return Limits(**{**values, "json_caps": {**self.json_caps, **override.json_caps}})


Pin = int | float | str | bool | None
PIN_STRING = re.compile(r"^[A-Za-z0-9_.:/-]{0,64}$")   # a pinned string: written into configs as is
_NAMES = {"type": "array", "items": {"type": "string", "pattern": _FIELD_NAME.pattern}}


def _pin(value: object, *at: str | int) -> None:
    if isinstance(value, list | dict):
        raise fail("expected a single value", *at)
    if isinstance(value, str) and not PIN_STRING.match(value):
        raise fail(f"a pinned string may hold letters, digits and _.:/- (at most 64), got {value!r}", *at)
    if value is not None and not isinstance(value, bool | int | float | str):
        raise fail(f"a pin is a number, a string, true, false or null, got {value!r}", *at)
    if isinstance(value, float) and value != value:
        raise fail("a pin cannot be NaN", *at)


@dataclass(frozen=True, config=CONFIG)
class FieldRules(Base):
    """What requests may carry at the top level of a JSON body: each named field allowed,
    rejected (400) or stripped, and one choice for every field not named (``unknown``).
    Without a ``fields:`` section nothing is named and unknown fields pass (only the body
    policy's governed fields are decided); with one, unknown fields are rejected unless it
    says otherwise: a field new in a vLLM upgrade stays closed until reviewed."""

    _renames: ClassVar[Mapping[str, str]] = {"pin": "pins"}
    _inputs: ClassVar[Mapping[str, Any]] = {
        "unknown": {"default": "reject", "description": "fields not named here (default reject: new fields "
                    "stay closed)"},
        "allow": _NAMES, "deny": {**_NAMES, "description": "refused: 400 forbidden-field:NAME"},
        "strip": {**_NAMES, "description": "removed before vLLM sees the body"}}

    # field -> allow | reject | strip (the lists allow, deny, strip as written)
    named: Annotated[Mapping[str, str], Internal, Hidden] = field(default_factory=dict)
    unknown: Literal["reject", "strip", "pass"] = "pass"
    # field -> the most items it may hold (a list's length, an object's keys; a string is one)
    counts: Mapping[str, Annotated[int, Strict(), Field(ge=0)]] = Field(
        default_factory=dict, description="the most items a field may hold (a list's length, an object's "
        "keys; a string is one): 400 json-cap:NAME:count-over-N")
    # field -> the value every body leaves with (number, string, boolean or null), the client's replaced
    pins: Mapping[str, Pin] = Field(default_factory=dict, description="the value a field leaves with, the "
                                    "client's replaced (strings: letters, digits, _.:/-)")
    # field -> the values it may hold when present and not null (JSON equality: 1 is not "1")
    values: Mapping[str, tuple[Pin, ...]] = Field(
        default_factory=dict, description="the values a field may hold when present and not null (JSON "
        "equality: 1 is not \"1\"): 400 json-cap:NAME:not-listed")
    line: Line = 0
    # field name -> the policy line naming it (errors only)
    lines: Annotated[Mapping[str, int], Internal, Hidden] = field(default_factory=dict, compare=False,
                                                                  repr=False)

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        """``{unknown, allow: [...], deny: [...], strip: [...], counts, pin, values}``: each field in
        one list; a pinned, counted or listed field in none of deny and strip."""
        named: dict[str, str] = {}
        lines: dict[str, int] = {}
        for key, mode in _FIELD_LISTS.items():
            items = out.pop(key, [])
            if not isinstance(items, list):
                raise fail("expected a list", key)
            for i, name in enumerate(items):
                if not isinstance(name, str) or not _FIELD_NAME.match(name):
                    raise fail(f"{name!r} is not a request field name (letters, digits, '_')", key, i)
                if name in named:
                    raise fail(f"field {name!r} is decided twice", key, i)
                named[name] = mode
                lines[name] = line_of(info, (*raw.path, key, i))
        for key, why in (("counts", "a count cap applies to fields that pass"),
                         ("pin", "a pinned field reaches vLLM with its pin"),
                         ("values", "values apply to allowed fields")):
            entries = raw.get(key, {})
            for name, value in entries.items() if isinstance(entries, dict) else ():
                if not _FIELD_NAME.match(name):
                    raise fail(f"{name!r} is not a request field name (letters, digits, '_')", key, name)
                if named.get(name, "allow") != "allow" or (key == "values" and name in raw.get("pin", {})):
                    raise fail(f"field {name!r} is {named.get(name, 'pinn')}ed: {why}", key, name)
                if key == "pin":
                    _pin(value, key, name)
                for i, pin in enumerate(value) if key == "values" and isinstance(value, list) else ():
                    _pin(pin, key, name, i)
                if key == "values" and isinstance(value, list) and not value:
                    raise fail(f"field {name!r}: list at least one value", key, name)
                lines.setdefault(name, line_of(info, (*raw.path, key, name)))
        for key in ("counts", "pins", "values"):
            if isinstance(out.get(key), dict):
                out[key] = dict(sorted(out[key].items()))
        return {"unknown": "reject", **out, "named": dict(sorted(named.items())), "lines": lines}

    def mode(self, name: str) -> str:
        """allow, reject or strip: what happens to ``name`` when a request carries it (a pinned
        field is allowed: its value is the perimeter's)."""
        if name in self.pins:
            return "allow"
        return self.named.get(name) or ("allow" if self.unknown == "pass" else self.unknown)

    def names(self, mode: str) -> tuple[str, ...]:
        return tuple(sorted(f for f, m in self.named.items() if m == mode))

    @property
    def decided(self) -> bool:
        """Does anything here act on a body (a field not allowed, or unknown ones not passed, a
        count or a pin)?"""
        return (self.unknown != "pass" or any(m != "allow" for m in self.named.values())
                or bool(self.counts) or bool(self.pins) or bool(self.values))


def count_of(value: object) -> int:
    """How many items a field holds, as a count cap reads it: a list's length, an object's number
    of keys, one for a string or any other value, none for null."""
    if value is None:
        return 0
    if isinstance(value, list | dict):
        return len(value)
    return 1


@dataclass(frozen=True, config=CONFIG)
class Audience(Base):
    name: Annotated[str, Internal, Hidden]     # its key in ``audiences:``
    kind: AudienceKind
    networks: tuple[Text, ...] = ()   # names of entries in Policy.networks
    roles: tuple[Text, ...] = ()      # empty with auth "key" / "jwt": any principal
    # "key": an API key of the principals file; "jwt": a bearer token verified by ``jwt``; "cert":
    # a client certificate from ``listen.tls.client_ca`` naming a certificate principal (mTLS)
    auth: Literal["key", "none", "jwt", "cert"] = Field(
        default="key", description="default: none with kind none, else key")
    jwt: JwtAuth | None = None
    limits: Limits = Field(default_factory=Limits)
    fields: FieldRules = Field(default_factory=FieldRules)
    media: MediaRules = Field(default_factory=MediaRules, description="default for end-user audiences: "
                              "data: URLs only, at most 8 items, no embeddings; others: not checked")
    line: Line = 0

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        kind = out.get("kind")
        out.setdefault("auth", "none" if kind == "none" else "key")
        if "media" not in out and kind == "end-user":
            out["media"] = replace(END_USER_DEFAULT, line=raw.line)
        return out

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Audience:
        if not reading(info):
            return self
        if self.kind != "none" and not self.networks:
            raise fail("an audience that allows traffic must name its networks")
        if self.auth == "jwt" and self.jwt is None:
            raise fail("auth: jwt needs a jwt: section (issuers, audiences, jwks_file, ...)", "auth")
        if self.jwt is not None and self.auth != "jwt":
            raise fail("a jwt: section is read only with auth: jwt", "jwt")
        if self.jwt is not None:
            given = {*self.jwt.roles.values(), *((self.jwt.role,) if self.jwt.role else ())}
            for role in self.roles:
                if role not in given:
                    raise fail(f"role {role!r}: no token of this audience can have it (its jwt roles give: "
                               + ", ".join(sorted(given)) + ")", "roles")
        return self

    @property
    def allows(self) -> bool:
        return self.kind != "none"


def _principal_name(name: str, info: ValidationInfo) -> str:
    if reading(info) and not _PRINCIPAL.match(name):   # never ':' (token principals are jwt:ISSUER-ID:CLAIM)
        raise fail(f"principal {name!r}: use letters, digits, '_', '.', '@' or '-' (at most 64, starting "
                   "with a letter or digit)")
    return name


@dataclass(frozen=True, config=CONFIG)
class Principal(Base):
    name: Annotated[Text, Field(description="letters, digits, '_', '.', '@' or '-' (at most 64)")]
    role: Text
    key_sha256: Annotated[Text, Field(description="sha256 hex of the key, never the key")]  # never the key

    _name = field_validator("name")(_principal_name)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Principal:
        if not reading(info):
            return self
        digest = self.key_sha256.lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise fail("expected the sha256 hex digest of the key (64 hex digits), never the key itself; use "
                       "`vllm-perimeter keys new`", "key_sha256")
        return replace(self, key_sha256=digest)

    @property
    def fingerprint(self) -> str:
        return "sha256:" + self.key_sha256[:12]




@dataclass(frozen=True, config=CONFIG)
class CertPrincipal(Base):
    """A workload known by its client certificate (``auth: cert``): by the certificate's URI SAN
    (a SPIFFE ID) or its subject DN (RFC 2253, as both proxies print it), never by the certificate
    itself, so a renewed certificate with the same name is the same principal (rotation without a
    restart); revocation: remove the entry, generate, reload."""

    name: Text
    role: Text
    san: Str = Field(default="", description="auth cert: the client certificate's URI SAN "
                     "(spiffe://example.org/ns/app/sa/worker)")
    subject: Str = Field(default="", description="auth cert: the client certificate's subject DN "
                         "(RFC 2253: CN=worker,O=Example)")

    _name = field_validator("name")(_principal_name)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> CertPrincipal:
        if not reading(info):
            return self
        why = san_problem(self.san) if self.san else subject_problem(self.subject)
        if why:
            raise fail(why, "san" if self.san else "subject")
        if not _ROLE.match(self.role):
            raise fail(f"role {self.role!r}: use letters, digits, '.', '_' or '-'", "role")
        return self

    @property
    def identity(self) -> str:
        """What names it: ``san:URI`` or ``subject:DN``."""
        return f"san:{self.san}" if self.san else f"subject:{self.subject}"


_IDENTITIES = ("key_sha256", "san", "subject")


def split_principals(items: object, info: ValidationInfo) -> tuple[list[Principal], list[CertPrincipal]]:
    """The key principals (``key_sha256``) and certificate principals (``san`` or ``subject``) of a
    ``principals:`` list; names unique across both kinds, each certificate name once."""
    if not isinstance(items, list):
        raise fail("expected a list", "principals")
    keys: list[Principal] = []
    certs: list[CertPrincipal] = []
    names: dict[str, int] = {}
    for i, item in enumerate(items):
        if isinstance(item, dict):
            given = [k for k in _IDENTITIES if k in item]
            if len(given) != 1:
                raise fail(f"principal {item.get('name')!r}: give exactly one of key_sha256 (an API key's "
                           "hash), san (a client certificate's URI SAN) or subject (its subject DN)"
                           + (f"; it has {', '.join(given)}" if given else ""), "principals", i)
            item = sub(Principal if given[0] == "key_sha256" else CertPrincipal, item, info, "principals", i)
        if not isinstance(item, Principal | CertPrincipal):
            raise fail("expected a mapping (key: value)", "principals", i)
        if item.name in names:
            raise fail(f"duplicate principal {item.name!r}", "principals", i, "name")
        names[item.name] = i
        if isinstance(item, Principal):
            keys.append(item)
            continue
        other = next((c for c in certs if c.identity == item.identity), None)
        if other is not None:
            at = "san" if item.san else "subject"
            raise fail(f"{at} {getattr(item, at)!r} already names another principal (line "
                       f"{line_of(info, ('principals', names[other.name]))}): one certificate name, one "
                       "principal", "principals", i, at)
        certs.append(item)
    return keys, certs


def _principals(props: dict[str, Any]) -> dict[str, Any]:
    """``principals:`` as written: key and certificate principals in one list."""
    return {"type": "array", "default": [], "description": "key principals (key_sha256) and certificate "
            "principals (san or subject)", "items": {"anyOf": [props["principals"]["items"],
                                                                 props.pop("certs")["items"]]}}


@dataclass(frozen=True, config=CONFIG)
class PrincipalsFile(Base):
    """A principals file (``keys new --file``): key hashes only, mode 0600."""

    _inputs: ClassVar[Mapping[str, Any]] = {"principals": _principals}

    principals: tuple[Principal, ...] = ()
    certs: Annotated[tuple[CertPrincipal, ...], Internal] = ()

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        keys, certs = split_principals(out.get("principals", []), info)
        return {"principals": keys, "certs": certs}


@dataclass(frozen=True, config=CONFIG)
class RouteRule(Base):
    path: Annotated[Text, Field(pattern="^/")]
    audience: Text
    methods: tuple[Text, ...] = ()   # empty: every method the route declares
    limits: Limits | None = None
    state_changing: Flag = False
    note: Str = ""
    line: Line = 0

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> RouteRule:
        if not reading(info):
            return self
        why = patterns.validate(self.path)
        if why:
            raise fail(f"invalid path pattern {self.path!r}: {why}", "path")
        methods = tuple(m.upper() for m in self.methods)
        for meth in methods:
            if meth not in METHODS:
                raise fail(f"unknown method {meth!r}" + hint(meth, METHODS), "methods")
        return replace(self, methods=tuple(sorted(set(methods))))


@dataclass(frozen=True, config=CONFIG)
class BodyPolicy(Base):
    cache_salt: CacheSalt = Field(
        default="reject", description="per-principal / per-audience: the perimeter writes cache_salt = "
        "HMAC-SHA256(secret, the principal or audience) over any client's, so prefix-cache hits stay within "
        "a tenant")
    chat_template: ChatTemplate = "reject"
    # in the plan document (scanner.plan.document), a key not set (or responses: shared) is left out
    cache_salt_secret_file: Text | None = Field(   # with per-principal / per-audience: the HMAC secret
        default=None, pattern=r"^/", exclude_if=absent,
        description="with per-principal / per-audience: the file (absolute "
        "path, mode 0600) holding the HMAC secret; read when the config is generated, never written into it")
    responses: Responses = Field(
        default="shared", exclude_if=lambda v: v == "shared",
        description="owned: every stored response id the perimeter hands out is sealed "
        "to its principal (id~HMAC); GET / cancel / previous_response_id with another principal's id: 403 "
        "not-owner")
    # with responses: owned: the HMAC secret sealing response ids, read by the proxy at run time
    responses_secret_file: Text | None = Field(
        default=None, pattern=r"^/", exclude_if=absent,
        description="with responses: owned: the file (absolute path, mode "
        "0600) holding the HMAC secret; read by the proxy at run time, never written into a generated config")

    @model_validator(mode="before")
    @classmethod
    def _absolute(cls, data: Any) -> Any:
        for key in ("cache_salt_secret_file", "responses_secret_file") if isinstance(data, dict) else ():
            if isinstance(data.get(key), str):
                absolute_file(data[key], key)
        return data

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> BodyPolicy:
        if not reading(info):
            return self
        if self.salted and self.cache_salt_secret_file is None:
            raise fail(f"cache_salt: {self.cache_salt} needs cache_salt_secret_file: the file (mode 0600) "
                       "holding the HMAC secret (`vllm-perimeter keys salt-secret --out FILE`)", "cache_salt")
        if not self.salted and self.cache_salt_secret_file is not None:
            raise fail("only cache_salt: per-principal or per-audience uses a secret",
                       "cache_salt_secret_file")
        if self.owned and self.responses_secret_file is None:
            raise fail("responses: owned needs responses_secret_file: the file (mode 0600) holding the HMAC "
                       "secret the proxy seals response ids with (`vllm-perimeter keys salt-secret --out "
                       "FILE` makes one)", "responses")
        if not self.owned and self.responses_secret_file is not None:
            raise fail("only responses: owned uses a secret", "responses_secret_file")
        return self

    @property
    def salted(self) -> bool:
        return self.cache_salt in SALTED

    @property
    def owned(self) -> bool:
        return self.responses == "owned"


@dataclass(frozen=True, config=CONFIG)
class TlsServer(Base):
    cert: Text
    key: Text
    # mTLS: the CA bundle (absolute path) client certificates are verified against. The listener
    # asks every client for a certificate and verifies one that is presented; only routes of an
    # ``auth: cert`` audience require one (so keys, tokens and certificates share the listener).
    client_ca: Text | None = Field(default=None, description="mTLS: the CA bundle client certificates are "
                                   "verified against, relative to the policy (auth: cert audiences require "
                                   "one)")
    # intermediates between a client certificate and the CA
    verify_depth: Int = Field(default=2, ge=1, le=MAX_VERIFY_DEPTH)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> TlsServer:
        if not reading(info) or self.client_ca is None:
            return self
        text = self.client_ca
        path = str((base_dir(info) / text).absolute()) if not text.startswith("/") else text
        if any(c in path for c in "\"\\$;{}\n\r\t "):
            raise fail(f"{text!r}: a path without quotes, spaces, '$', ';' or braces (the proxy opens it)",
                       "client_ca")
        try:
            read_ca_bundle(path)
        except ConfigError as exc:
            raise fail(str(exc), "client_ca") from None
        return replace(self, client_ca=path)


@dataclass(frozen=True, config=CONFIG)
class TlsUpstream(Base):
    ca: Text | None = None
    client_cert: Text | None = None
    client_key: Text | None = None
    server_name: Text | None = None


@dataclass(frozen=True, config=CONFIG)
class Listen(Base):
    address: Text = "0.0.0.0"
    port: Int = Field(default=8080, ge=1, le=65535)
    tls: TlsServer | None = None


BALANCE = ("least_conn", "round_robin")   # least connections by default: streams are long


@dataclass(frozen=True, config=CONFIG)
class Health(Base):
    """Passive health of the replicas: after ``max_fails`` failed connections (refused, reset,
    timed out) a replica is skipped for ``eject_s`` seconds."""

    max_fails: Int = Field(default=1, ge=1, description="failed connections before a replica is skipped")
    eject_s: Int = Field(default=10, ge=1, description="seconds a failed replica is skipped")


def host_port(text: object, *at: str | int) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[addr]:port``)."""
    if not isinstance(text, str) or not text:
        raise fail(f"expected a non-empty string, got {text!r}", *at)
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or (":" in host) != bracketed:
        raise fail(f"{text!r} is not host:port (IPv6 as [addr]:port)", *at)
    if not valid_host(host):
        raise fail(f"{host!r} is not an IP address or a host name", *at)
    return host, int(port)


@dataclass(frozen=True, config=CONFIG)
class Upstream(Base):
    _inputs: ClassVar[Mapping[str, Any]] = {"servers": {
        "type": "array", "items": {"type": "string"}, "minItems": 1,
        "description": "replicas as host:port ([addr]:port for IPv6), instead of host and port"}}

    host: Text = "127.0.0.1"       # the first (or only) replica
    port: Port = 8000
    tls: TlsUpstream | None = None
    use_tls: Annotated[bool, Internal, Hidden] = False
    # vLLM's own --api-key, presented upstream by the proxy on every allowed request: the file
    # (absolute path, read by the proxy at run time; the key is never in a generated config)
    api_key_file: Text | None = Field(
        default=None, pattern=r"^/",
        description="file holding vLLM's --api-key (absolute path, mode 0600): the proxy presents it "
        "upstream on every allowed request; the key never appears in a generated config")
    # more replicas of the same vLLM (data parallel, several pods); () = host:port alone
    replicas: Annotated[tuple[tuple[str, int], ...], Internal, Hidden] = ()
    balance: Literal["least_conn", "round_robin"] = "least_conn"
    health: Health = Field(default_factory=Health)

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        absolute_file(out.get("api_key_file") if isinstance(out.get("api_key_file"), str) else None,
                      "api_key_file")
        out["use_tls"] = "tls" in out
        if "servers" not in out:
            return out
        if "host" in out or "port" in out:
            raise fail("give either servers or host and port, not both", "servers")
        items = out.pop("servers")
        if not isinstance(items, list):
            raise fail("expected a list", "servers")
        servers: list[tuple[str, int]] = []
        for i, text in enumerate(items):
            server = host_port(text, "servers", i)
            if server in servers:
                raise fail(f"{text!r} is listed twice", "servers", i)
            servers.append(server)
        if not servers:
            raise fail("expected at least one host:port", "servers")
        tls = out.get("tls")
        if len(servers) > 1 and isinstance(tls, dict) and not tls.get("server_name"):
            raise fail("several servers need tls.server_name: the one name every replica's certificate "
                       "carries (the proxy verifies it on each)", "tls")
        (out["host"], out["port"]), *replicas = servers
        return {**out, "replicas": tuple(replicas)}

    @property
    def servers(self) -> tuple[tuple[str, int], ...]:
        """Every replica the proxy balances over, the first being ``host:port``."""
        return ((self.host, self.port), *self.replicas)


@dataclass(frozen=True, config=CONFIG)
class PortRule(Base):
    """A TCP port that may answer, and the networks (policy names) it may answer from."""

    port: Annotated[int, Strict(), Field(ge=1, json_schema_extra={"maximum": 65535})]
    networks: Annotated[tuple[Text, ...], Field(min_length=1)]
    note: Str = ""
    line: Line = 0

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> PortRule:
        if reading(info) and self.port > 65535:
            raise fail(f"expected a TCP port (1-65535), got {self.port}", "port")
        return self


@dataclass(frozen=True, config=CONFIG)
class PortPolicy(Base):
    """The ``ports:`` section: which TCP ports may answer from which network (default deny)."""

    _required: ClassVar[tuple[str, ...]] = ("allow",)

    allow: tuple[PortRule, ...] = ()

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> PortPolicy:
        seen: dict[int, int] = {}
        for i, rule in enumerate(self.allow if reading(info) else ()):
            if rule.port in seen:
                raise fail(f"port {rule.port} is already allowed at line {seen[rule.port]}; list its "
                           "networks in one entry", "allow", i, "port")
            seen[rule.port] = rule.line
        return self

    def allowed_networks(self, port: int) -> tuple[str, ...]:
        return tuple(n for rule in self.allow if rule.port == port for n in rule.networks)


@dataclass(frozen=True, config=CONFIG)
class GrpcRule(Base):
    """Who may call a gRPC method: ``/package.Service/Method``, or ``/package.Service/*`` for
    every method of a service."""

    method: Annotated[Text, Field(description="/package.Service/Method, or /package.Service/* for all of "
                                  "its methods")]
    audience: Text
    note: Str = ""
    line: Line = 0

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> GrpcRule:
        if reading(info) and not _GRPC_METHOD.match(self.method):
            raise fail(f"{self.method!r} is not a gRPC method: /package.Service/Method, or "
                       "/package.Service/* for all of a service's", "method")
        return self

    def covers(self, path: str) -> bool:
        return path == self.method or (self.method.endswith("/*") and path.startswith(self.method[:-1])
                                       and "/" not in path[len(self.method) - 1:])


@dataclass(frozen=True, config=CONFIG)
class GrpcUpstream(Base):
    """Where the perimeter reaches vLLM's gRPC server (``grpc.upstream``)."""

    host: Text = "127.0.0.1"
    port: Port = 50051

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> GrpcUpstream:
        if reading(info) and not valid_host(self.host):
            raise fail(f"{self.host!r} is not an IP address or DNS name", "host")
        return self


@dataclass(frozen=True, config=CONFIG)
class GrpcPolicy(Base):
    """The ``grpc:`` section: vLLM's gRPC server (``vllm serve --grpc``, no key check of its own)
    behind its own listener of the perimeter, default deny per method. ``inventory`` names the
    methods it has: a bundled gRPC catalog (``vllm-0.33.0``) or a file ``inventory grpc`` wrote
    (``path``: resolved against the policy's directory)."""

    _renames: ClassVar[Mapping[str, str]] = {"methods": "rules"}
    _required: ClassVar[tuple[str, ...]] = ("methods",)
    inventory: Text
    listen: Listen = Field(default_factory=lambda: Listen(port=50052))
    upstream: GrpcUpstream = Field(default_factory=lambda: GrpcUpstream())
    rules: tuple[GrpcRule, ...] = ()
    path: Annotated[str, Internal, Hidden] = ""      # the inventory as a file, when it names one
    line: Line = 0

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        listen = out.get("listen")
        if isinstance(listen, dict):
            out["listen"] = YamlMap({"port": 50052, **listen}, getattr(listen, "path", ()),
                                    getattr(listen, "line", 0))
        return out

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> GrpcPolicy:
        if not reading(info):
            return self
        if self.listen.tls and self.listen.tls.client_ca:
            raise fail("client certificates are taken on the HTTP listener only",
                       "listen", "tls", "client_ca")
        for i, rule in enumerate(self.rules):
            for other in self.rules[:i]:
                if (rule.covers(other.method.replace("/*", "/x"))
                        or other.covers(rule.method.replace("/*", "/x"))):
                    raise fail(f"{rule.method!r} overlaps {other.method!r} at line {other.line}; each gRPC "
                               "method must be decided by one rule", "methods", i)
        path = base_dir(info) / self.inventory
        return replace(self, path=str(path) if path.is_file() else "")

    @property
    def upstream_host(self) -> str:
        return self.upstream.host

    @property
    def upstream_port(self) -> int:
        return self.upstream.port


# What a proxy of a fleet does while the shared store (Redis) or the limiter cannot be reached:
# refuse (503 shared-store-unavailable) or enforce its own share of every limit (the policy's
# values divided by the replica count). Never unlimited.
OnUnavailable = Literal["deny", "local"]
ON_UNAVAILABLE_CHOICES: tuple[str, ...] = ("deny", "local")
LIMITER_PORT = 8081
MAX_REPLICAS = 1000


@dataclass(frozen=True, config=CONFIG)
class Shared(Base):
    """The ``shared:`` section: a fleet of ``replicas`` proxies takes every rate, concurrency and
    token-budget limit from one limiter (``vllm-perimeter limiter``) on one Redis, so together
    they admit what the policy says (issue 21)."""

    _inputs: ClassVar[Mapping[str, Any]] = {
        "limiter": {"type": "string", "default": f"127.0.0.1:{LIMITER_PORT}",
                    "description": "HOST:PORT the proxies reach the limiter at"},
        "tls": {"type": "object", "additionalProperties": False, "required": ["ca"], "properties": {
            "ca": {"type": "string", "description": "absolute path of the CA bundle that signs Redis's "
                   "certificate"}}}}

    # one Redis, Sentinel or Cluster (scanner.store_url); no password
    redis: Annotated[Text, Field(description="redis://HOST[:PORT][/DB], redis+sentinel://HOST:PORT[,...]/"
                                 "MASTER[/DB] or redis+cluster://HOST:PORT[,...] (rediss...: TLS); no "
                                 "password")]
    limiter: tuple[str, int] = ("127.0.0.1", LIMITER_PORT)   # where the proxies reach the limiter
    password_file: Text | None = Field(default=None, description="absolute path of the Redis password, "
                                       "read by the limiter")
    # rediss://: the CA bundle that signs Redis's certificate (``tls: {ca: FILE}``)
    tls_ca: Annotated[str | None, Internal, Hidden] = None
    on_unavailable: OnUnavailable = Field(
        default="deny", description="store unreachable: 503 shared-store-unavailable, or each proxy's share "
        "of every limit (the policy's values divided by replicas)")
    replicas: Int = Field(default=2, ge=1, json_schema_extra={"maximum": MAX_REPLICAS},
                          description="proxies in the fleet: the local fallback's divisor")
    line: Line = 0

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        if "limiter" in out:
            out["limiter"] = host_port(out["limiter"], "limiter")
        if "tls" in out:
            tls = out.pop("tls")
            if not isinstance(tls, dict) or set(tls) != {"ca"}:
                raise fail("expected {ca: FILE}", "tls")
            out["tls_ca"] = tls["ca"]
            absolute_file(tls["ca"] if isinstance(tls["ca"], str) else None, "tls", "ca")
        absolute_file(out["password_file"] if isinstance(out.get("password_file"), str) else None,
                      "password_file")
        return out

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Shared:
        if not reading(info):
            return self
        url = self.redis
        if "@" in url:
            raise fail("no user or password in the Redis URL: give password_file (read by the limiter)",
                       "redis")
        if any(c.isspace() for c in url):
            raise fail(f"{url!r}: no spaces in the Redis URL", "redis")
        try:
            parsed = redis_url.parse_url(url)
        except redis_url.UrlError as exc:
            raise fail(f"{url!r}: {exc}", "redis") from None
        for host, port in parsed.hosts:
            if not valid_host(host):
                raise fail(f"{host!r} is not an IP address or DNS name", "redis")
            if not 0 < port < 65536:
                raise fail(f"port {port} is not in 1..65535", "redis")
        if self.tls_ca is not None and not parsed.tls:
            raise fail("tls needs a rediss:// URL (redis:// is plaintext)", "tls")
        if self.replicas > MAX_REPLICAS:
            raise fail(f"at most {MAX_REPLICAS} replicas, got {self.replicas}", "replicas")
        return self


Cidr = Annotated[str, Strict(), Field(min_length=1, description="an IP network (CIDR)")]


def _cidrs(values: tuple[str, ...], *at: str | int) -> None:
    for i, cidr in enumerate(values):
        if not valid_cidr(cidr):
            raise fail(f"{cidr!r} is not an IP network (CIDR)", *at, i)


@dataclass(frozen=True, config=CONFIG)
class Policy(Base):
    """A policy (``policies/vllm-default.yaml``)."""

    _renames: ClassVar[Mapping[str, str]] = {"routes": "rules"}
    _filled: ClassVar[tuple[str, ...]] = ("networks", "principals")
    _required: ClassVar[tuple[str, ...]] = ("schema_version",)
    _inputs: ClassVar[Mapping[str, Any]] = {
        "principals": _principals,
        "principals_file": {"type": "string", "description": "a principals file (keys new --file), relative "
                            "to the policy's directory"}}

    name: Text
    networks: Mapping[str, tuple[Cidr, ...]]
    audiences: Mapping[str, Audience]
    principals: tuple[Principal, ...]
    rules: tuple[RouteRule, ...]
    body: BodyPolicy = Field(default_factory=BodyPolicy)
    listen: Listen = Field(default_factory=Listen)
    upstream: Upstream = Field(default_factory=Upstream)
    trusted_proxies: tuple[Cidr, ...] = ()
    ports: PortPolicy | None = None  # None: no `ports:` section (see scanner.netscan.policy)
    grpc: GrpcPolicy | None = Field(default=None,   # None: no gRPC listener
                                    description="vLLM's gRPC server behind Envoy's HTTP/2 listener")
    shared: Shared | None = Field(default=None,     # None: every limit lives in each proxy (no fleet)
                                  description="a fleet of proxies sharing every limit through Redis")
    # principals known by their client certificate
    certs: Annotated[tuple[CertPrincipal, ...], Internal] = ()
    source: Annotated[str, Internal, Hidden] = "<policy>"
    digest: Annotated[str, Internal, Hidden] = ""
    schema_version: Literal[1] = 1   # SCHEMA_VERSION

    @classmethod
    def _reshape(cls, out: dict[str, Any], raw: YamlMap, info: ValidationInfo) -> dict[str, Any]:
        version = out.get("schema_version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise fail(f"expected a whole number >= 0, got {version!r}", "schema_version")
        if version != SCHEMA_VERSION:
            raise fail(f"this tool reads schema_version {SCHEMA_VERSION}, not {version}", "schema_version")
        audiences = out.get("audiences")
        if isinstance(audiences, dict):
            out["audiences"] = {k: (v if isinstance(v, YamlMap) else YamlMap(v, (), 0)).but(name=k)
                                if isinstance(v, dict) else v for k, v in audiences.items()}
        out.pop("principals_file", None)   # read by the loader: its principals are in ``principals``
        out["principals"], out["certs"] = split_principals(out.get("principals", []), info)
        return {"networks": {}, **out}

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Policy:
        if not reading(info):
            return self
        for name, cidrs in self.networks.items():
            _cidrs(cidrs, "networks", name)
        for aud in self.audiences.values():
            for i, net in enumerate(aud.networks):
                if net not in self.networks:
                    raise fail(f"unknown network {net!r}" + hint(net, list(self.networks)),
                               "audiences", aud.name, "networks", i)
        for i, rule in enumerate(self.rules):
            if rule.audience not in self.audiences:
                raise fail(f"unknown audience {rule.audience!r}" + hint(rule.audience, list(self.audiences)),
                           "routes", i, "audience")
            for other in self.rules[:i]:
                both = (set(rule.methods) & set(other.methods)) if rule.methods and other.methods else True
                if both and patterns.overlaps(rule.path, other.path):
                    raise fail(f"rule {rule.path!r} overlaps rule {other.path!r} at line {other.line}; each "
                               "method and path must be decided by one rule", "routes", i, shown="routes")
        self._check_principals()
        _cidrs(self.trusted_proxies, "trusted_proxies")
        for i, port in enumerate(self.ports.allow if self.ports else ()):
            for j, net in enumerate(port.networks):
                if net not in self.networks:
                    raise fail(f"unknown network {net!r}" + hint(net, list(self.networks)),
                               "ports", "allow", i, "networks", j)
        for i, g in enumerate(self.grpc.rules if self.grpc else ()):
            if g.audience not in self.audiences:
                raise fail(f"unknown audience {g.audience!r}" + hint(g.audience, list(self.audiences)),
                           "grpc", "methods", i, "audience")
        return self

    def _check_principals(self) -> None:
        """Each role an audience names has a principal; ``auth: cert`` needs the listener's client
        CA; certificate principals need a cert audience."""
        for aud in self.audiences.values():
            if aud.auth not in ("key", "cert"):
                continue
            have = self.principals if aud.auth == "key" else self.certs
            roles = {p.role for p in have}
            kind = "certificate principal" if aud.auth == "cert" else "principal"
            for role in aud.roles:
                if have and role not in roles:
                    raise fail(f"role {role!r} has no {kind}" + hint(role, sorted(roles)),
                               "audiences", aud.name)
        cert_auds = [a for a in self.audiences.values() if a.auth == "cert"]
        if cert_auds and not (self.listen.tls and self.listen.tls.client_ca):
            raise fail("auth: cert needs listen.tls.client_ca (the CA bundle client certificates are "
                       "verified against)", "audiences", cert_auds[0].name)
        if self.certs and not cert_auds:
            raise fail(f"principal {self.certs[0].name!r} is a certificate (san/subject), but no audience "
                       "has auth: cert", "principals")

    def roles(self) -> tuple[str, ...]:
        return tuple(sorted({p.role for p in self.principals}))

    def cert_roles(self) -> tuple[str, ...]:
        return tuple(sorted({c.role for c in self.certs}))

    def token_roles(self) -> tuple[str, ...]:
        """Every role a verified token can give (the ``jwt:`` sections' role maps and fixed roles)."""
        return tuple(sorted({r for a in self.audiences.values() if a.jwt
                             for r in (*a.jwt.roles.values(), *((a.jwt.role,) if a.jwt.role else ()))}))


def valid_cidr(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def valid_host(text: str) -> bool:
    """An IP address or a DNS name (letters, digits, '-' and '.'), nothing a config could misread."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(re.fullmatch(r"(?!-)[A-Za-z0-9-]{1,63}(\.(?!-)[A-Za-z0-9-]{1,63})*\.?", text))
    return True
