"""Load a policy YAML into validated models; every error names its file and line."""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import yaml

from scanner import patterns
from scanner import store_url as redis_url
from scanner.errors import ConfigError, PolicyError
from scanner.output import read_text
from scanner.policy.certs import MAX_VERIFY_DEPTH, read_ca_bundle, san_problem, subject_problem
from scanner.policy.jwt import (
    ALGORITHMS,
    CLAIM_NAME,
    CLAIM_VALUE,
    DEFAULT_ALGORITHMS,
    MAX_TOKEN_BYTES,
    JwtAuth,
    read_jwks,
)
from scanner.policy.media import EMBED_MODES, END_USER_DEFAULT, URL_MODES, MediaRules, entry_problem
from scanner.policy.model import (
    AUDIENCE_KINDS,
    BALANCE,
    CACHE_SALT_CHOICES,
    CAPPABLE_FIELDS,
    CHAT_TEMPLATE_CHOICES,
    LIMITER_PORT,
    MAX_COUNT,
    MAX_JSON_CAP,
    MAX_REPLICAS,
    METHODS,
    ON_UNAVAILABLE_CHOICES,
    PIN_STRING,
    RESPONSES_CHOICES,
    SALTED,
    SCHEMA_VERSION,
    UNKNOWN_FIELD_CHOICES,
    WHEN_ABSENT_CHOICES,
    Audience,
    AudienceKind,
    BodyPolicy,
    CertPrincipal,
    FieldRules,
    GrpcPolicy,
    GrpcRule,
    Health,
    Limits,
    Listen,
    Pin,
    Policy,
    PortPolicy,
    PortRule,
    Principal,
    Rate,
    RouteRule,
    Shared,
    TlsServer,
    TlsUpstream,
    Upstream,
    valid_cidr,
    valid_host,
)


class Node:
    """A YAML node with its line, and typed, line-numbered accessors."""

    def __init__(self, node: yaml.Node, where: str, source: str) -> None:
        self.node, self.where, self.source = node, where, source
        self.line = node.start_mark.line + 1

    def fail(self, msg: str) -> PolicyError:
        where = f"{self.where}: " if self.where else ""
        return PolicyError(f"{self.source}:{self.line}: {where}{msg}")

    # --- scalars
    def _scalar(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.fail("expected a single value")
        try:
            return yaml.safe_load(yaml.serialize(self.node))
        except yaml.YAMLError as exc:  # an unknown tag (!foo) or a bad !!binary
            raise self.fail(f"not a plain value: {getattr(exc, 'problem', None) or exc}") from None

    def text(self) -> str:
        value = self._scalar()
        if not isinstance(value, str) or not value:
            raise self.fail(f"expected a non-empty string, got {value!r}")
        return value

    def whole(self, minimum: int = 0) -> int:
        value = self._scalar()
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"expected a whole number >= {minimum}, got {value!r}")
        return value

    def number(self) -> float:
        value = self._scalar()
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fail(f"expected a positive number, got {value!r}")
        return float(value)

    def flag(self) -> bool:
        value = self._scalar()
        if not isinstance(value, bool):
            raise self.fail(f"expected true or false, got {value!r}")
        return value

    def choice(self, choices: Sequence[str]) -> str:
        value = self.text()
        if value not in choices:
            raise self.fail(f"{value!r} is not one of {', '.join(choices)}" + _hint(value, choices))
        return value

    # --- collections
    def items(self) -> Iterator[Node]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.fail("expected a list")
        for i, child in enumerate(self.node.value):
            yield Node(child, f"{self.where}[{i}]", self.source)

    def texts(self) -> tuple[str, ...]:
        return tuple(n.text() for n in self.items())

    def mapping(self, allowed: Sequence[str], required: Sequence[str] = ()) -> dict[str, Node]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.fail("expected a mapping (key: value)")
        out: dict[str, Node] = {}
        for key_node, value_node in self.node.value:
            key = str(key_node.value)
            where = f"{self.where}.{key}" if self.where else key
            if key not in allowed:
                bad = Node(key_node, where, self.source)
                raise bad.fail(f"unknown key {key!r}" + _hint(key, allowed))
            if key in out:
                raise Node(key_node, where, self.source).fail("duplicate key")
            out[key] = Node(value_node, where, self.source)
        for key in required:
            if key not in out:
                raise self.fail(f"missing required key {key!r}")
        return out

    def entries(self) -> Iterator[tuple[str, Node]]:
        """A free-form mapping (names chosen by the user)."""
        if not isinstance(self.node, yaml.MappingNode):
            raise self.fail("expected a mapping (name: value)")
        seen: set[str] = set()
        for key_node, value_node in self.node.value:
            key = str(key_node.value)
            where = f"{self.where}.{key}"
            if key in seen:
                raise Node(key_node, where, self.source).fail("duplicate name")
            seen.add(key)
            yield key, Node(value_node, where, self.source)


def _hint(value: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- the document --------------------------------------------------------------------------

_TOP = ("schema_version", "name", "networks", "audiences", "principals", "principals_file",
        "routes", "body", "listen", "upstream", "trusted_proxies", "ports", "grpc", "shared")


def load(path: str | Path) -> Policy:
    p = Path(path)
    return loads(read_text(p, "policy", PolicyError), source=str(p), base_dir=p.parent)


def _compose(text: str, source: str) -> yaml.Node | None:
    """The YAML node tree of one document, or a PolicyError naming ``source`` and the line."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}" if mark is not None else "?"
        raise PolicyError(f"{source}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None


def loads(text: str, source: str = "<policy>", base_dir: Path | None = None) -> Policy:
    root = _compose(text, source)
    if root is None:
        raise PolicyError(f"{source}: the policy is empty")
    top = Node(root, "", source).mapping(_TOP, required=("schema_version", "name", "audiences", "routes"))
    version = top["schema_version"].whole()
    if version != SCHEMA_VERSION:
        raise top["schema_version"].fail(f"this tool reads schema_version {SCHEMA_VERSION}, not {version}")
    networks = _networks(top["networks"]) if "networks" in top else {}
    audiences = _audiences(top["audiences"], networks, base_dir or Path("."))
    principals, certs = _principals(top, base_dir or Path("."), audiences)
    rules = _rules(top["routes"], audiences)
    listen = _listen(top["listen"], base_dir=base_dir or Path(".")) if "listen" in top else Listen()
    _check_certs(audiences, certs, listen, top)
    return Policy(
        name=top["name"].text(),
        networks=networks,
        audiences=audiences,
        principals=principals,
        rules=rules,
        body=_body(top["body"]) if "body" in top else BodyPolicy(),
        listen=listen,
        upstream=_upstream(top["upstream"]) if "upstream" in top else Upstream(),
        trusted_proxies=_cidrs(top["trusted_proxies"]) if "trusted_proxies" in top else (),
        ports=_ports(top["ports"], networks) if "ports" in top else None,
        grpc=_grpc(top["grpc"], audiences, base_dir or Path(".")) if "grpc" in top else None,
        shared=_shared(top["shared"]) if "shared" in top else None,
        certs=certs,
        source=source,
        digest="sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest(),
    )


def _cidrs(node: Node) -> tuple[str, ...]:
    out = []
    for item in node.items():
        cidr = item.text()
        if not valid_cidr(cidr):
            raise item.fail(f"{cidr!r} is not an IP network (CIDR)")
        out.append(cidr)
    return tuple(out)


def _networks(node: Node) -> dict[str, tuple[str, ...]]:
    return {name: _cidrs(value) for name, value in node.entries()}


def _limits(node: Node) -> Limits:
    m = node.mapping(("body_bytes", "json_caps", "rate", "concurrency", "timeout_s", "when_absent",
                      "tokens_per_minute", "tokens_burst", "max_sequences", "max_request_tokens"))
    caps: dict[str, int] = {}
    if "json_caps" in m:
        for field_name, value in m["json_caps"].entries():
            if field_name not in CAPPABLE_FIELDS:
                raise value.fail(f"cannot cap {field_name!r}; cappable fields: {', '.join(CAPPABLE_FIELDS)}"
                                 + _hint(field_name, CAPPABLE_FIELDS))
            caps[field_name] = value.whole()
            if caps[field_name] > MAX_JSON_CAP:
                raise value.fail(f"{caps[field_name]} is more than njs and Lua read exactly (numbers are "
                                 f"doubles there): at most {MAX_JSON_CAP}")
    rate = None
    if "rate" in m:
        r = m["rate"].mapping(("rps", "burst"), required=("rps",))
        rate = Rate(rps=r["rps"].number(), burst=r["burst"].whole() if "burst" in r else 0)
    return Limits(
        body_bytes=m["body_bytes"].whole(minimum=1) if "body_bytes" in m else None,
        json_caps=caps,
        rate=rate,
        concurrency=m["concurrency"].whole(minimum=1) if "concurrency" in m else None,
        timeout_s=m["timeout_s"].number() if "timeout_s" in m else None,
        when_absent=cast(Any, m["when_absent"].choice(WHEN_ABSENT_CHOICES)) if "when_absent" in m else None,
        tokens_per_minute=m["tokens_per_minute"].whole(minimum=1) if "tokens_per_minute" in m else None,
        tokens_burst=_count(m["tokens_burst"]) if "tokens_burst" in m else None,
        max_sequences=_count(m["max_sequences"]) if "max_sequences" in m else None,
        max_request_tokens=_count(m["max_request_tokens"]) if "max_request_tokens" in m else None,
    )


def _count(node: Node) -> int:
    """A per-request envelope cap: a whole number both proxies can hold (1 .. 2^31 - 1; Envoy's
    hits_addend counts in 32 bits)."""
    value = node.whole(minimum=1)
    if value > MAX_COUNT:
        raise node.fail(f"{value} is more than a proxy can count (at most {MAX_COUNT})")
    return value


def _audiences(node: Node, networks: dict[str, tuple[str, ...]], base_dir: Path) -> dict[str, Audience]:
    out: dict[str, Audience] = {}
    for name, value in node.entries():
        m = value.mapping(("kind", "networks", "roles", "auth", "limits", "fields", "media", "jwt"),
                          required=("kind",))
        kind = cast(AudienceKind, m["kind"].choice(AUDIENCE_KINDS))
        nets = m["networks"].texts() if "networks" in m else ()
        for i, net in enumerate(nets):
            if net not in networks:
                raise Node(m["networks"].node.value[i], f"{value.where}.networks[{i}]", node.source).fail(
                    f"unknown network {net!r}" + _hint(net, list(networks)))
        auth = (m["auth"].choice(("key", "none", "jwt", "cert")) if "auth" in m
                else ("none" if kind == "none" else "key"))
        if kind not in ("none",) and not nets:
            raise value.fail("an audience that allows traffic must name its networks")
        if auth == "jwt" and "jwt" not in m:
            raise m["auth"].fail("auth: jwt needs a jwt: section (issuers, audiences, jwks_file, ...)")
        if "jwt" in m and auth != "jwt":
            raise m["jwt"].fail("a jwt: section is read only with auth: jwt")
        token = _jwt(m["jwt"], base_dir) if "jwt" in m else None
        roles = m["roles"].texts() if "roles" in m else ()
        if token is not None:
            given = {*token.roles.values(), *((token.role,) if token.role else ())}
            for role in roles:
                if role not in given:
                    raise m["roles"].fail(f"role {role!r}: no token of this audience can have it (its jwt "
                                          "roles give: " + ", ".join(sorted(given)) + ")")
        out[name] = Audience(
            name=name, kind=kind, networks=nets,
            roles=roles,
            auth=cast(Any, auth), jwt=token,
            limits=_limits(m["limits"]) if "limits" in m else Limits(),
            fields=_fields(m["fields"]) if "fields" in m else FieldRules(),
            media=_media(m["media"]) if "media" in m else (
                replace(END_USER_DEFAULT, line=value.line) if kind == "end-user" else MediaRules()),
            line=value.line,
        )
    return out


_JWT_KEYS = ("issuers", "audiences", "jwks_file", "remote_jwks", "algorithms", "clock_skew_s",
             "required_claims", "principal_claim", "role_claim", "roles", "role", "max_token_bytes")
_ROLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# a key or certificate principal's name: what both generators write (scanner.generate.common.NAME),
# never a ':', so no token principal (scanner.plan.jwt: jwt:ID:CLAIM) can be named like one
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def _jwt(node: Node, base_dir: Path) -> JwtAuth:
    """``jwt: {issuers, audiences, jwks_file, remote_jwks, algorithms, clock_skew_s, required_claims,
    principal_claim, role_claim + roles | role, max_token_bytes}``. The token itself never reaches
    vLLM (both proxies remove Authorization)."""
    m = node.mapping(_JWT_KEYS, required=("issuers", "audiences", "jwks_file"))
    issuers, audiences = m["issuers"].texts(), m["audiences"].texts()
    for what, got in (("issuers", issuers), ("audiences", audiences)):
        if not got:
            raise m[what].fail("name at least one")
        for v in got:
            if not CLAIM_VALUE.match(v):
                raise m[what].fail(f"{v!r}: letters, digits and _.@:+/=|- only (at most 256)")
    algorithms = DEFAULT_ALGORITHMS
    if "algorithms" in m:
        algorithms = m["algorithms"].texts()
        for alg in algorithms:
            if alg.lower() == "none" or alg.upper().startswith("HS"):
                raise m["algorithms"].fail(f"{alg!r} is never allowed: a token signed with no key, or with a "
                                           "shared secret (an HMAC), proves nothing a client cannot forge")
            if alg not in ALGORITHMS:
                raise m["algorithms"].fail(f"{alg!r} is not one of {', '.join(ALGORITHMS)}"
                                           + _hint(alg, ALGORITHMS))
        if not algorithms:
            raise m["algorithms"].fail("name at least one algorithm")
        algorithms = tuple(sorted(set(algorithms), key=ALGORITHMS.index))
    ref = m["jwks_file"]
    path = (base_dir / ref.text()).absolute()
    if any(c in str(path) for c in "\"\\$;{}\n\r\t '"):
        raise ref.fail(f"{str(path)!r}: a path without quotes, spaces, '$', ';' or braces")
    try:
        keys = read_jwks(path, algorithms)
    except ConfigError as exc:
        raise ref.fail(exc.message) from None
    remote = m["remote_jwks"].text() if "remote_jwks" in m else ""
    if remote and not re.fullmatch(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/%-]*)?", remote):
        raise m["remote_jwks"].fail(f"{remote!r} is not an https URL")
    required: dict[str, tuple[str, ...]] = {}
    for claim, value in m["required_claims"].entries() if "required_claims" in m else ():
        if not CLAIM_NAME.match(claim):
            raise value.fail(f"{claim!r} is not a claim name")
        values = value.texts() if isinstance(value.node, yaml.SequenceNode) else (value.text(),)
        for v in values:
            if not CLAIM_VALUE.match(v):
                raise value.fail(f"{v!r}: letters, digits and _.@:+/=|- only (at most 256)")
        required[claim] = tuple(values)
    principal_claim = m["principal_claim"].text() if "principal_claim" in m else "sub"
    role_claim = m["role_claim"].text() if "role_claim" in m else ""
    for what, claim in (("principal_claim", principal_claim), ("role_claim", role_claim)):
        if claim and not CLAIM_NAME.match(claim):
            raise m[what].fail(f"{claim!r} is not a claim name")
    roles: dict[str, str] = {}
    for value_name, role in m["roles"].entries() if "roles" in m else ():
        if not CLAIM_VALUE.match(value_name):
            raise role.fail(f"{value_name!r}: letters, digits and _.@:+/=|- only (at most 256)")
        roles[value_name] = role.text()
        if not _ROLE.match(roles[value_name]):
            raise role.fail(f"role {roles[value_name]!r}: use letters, digits, '.', '_' or '-'")
    fixed = m["role"].text() if "role" in m else ""
    if fixed and not _ROLE.match(fixed):
        raise m["role"].fail(f"role {fixed!r}: use letters, digits, '.', '_' or '-'")
    if bool(role_claim) != bool(roles):
        raise node.fail("role_claim and roles go together: the claim, and its values -> roles")
    if role_claim and fixed:
        raise m["role"].fail("give either a fixed role or role_claim + roles, not both")
    if not role_claim and not fixed:
        raise node.fail("a token's role: role_claim + roles (claim value -> role), or a fixed role")
    size = m["max_token_bytes"].whole(minimum=256) if "max_token_bytes" in m else MAX_TOKEN_BYTES
    if size > 16384:
        raise m["max_token_bytes"].fail(f"{size}: at most 16384")
    return JwtAuth(
        issuers=tuple(sorted(set(issuers))), audiences=tuple(sorted(set(audiences))), jwks_file=str(path),
        keys=keys, algorithms=algorithms, remote_jwks=remote,
        clock_skew_s=m["clock_skew_s"].whole() if "clock_skew_s" in m else 60,
        required_claims=dict(sorted(required.items())), principal_claim=principal_claim,
        role_claim=role_claim, roles=dict(sorted(roles.items())), role=fixed, max_token_bytes=size,
        line=node.line)


_FIELD_LISTS = {"allow": "allow", "deny": "reject", "strip": "strip"}
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _fields(node: Node) -> FieldRules:
    """``fields: {unknown: reject, allow: [...], deny: [...], strip: [...], counts: {NAME: N},
    pin: {NAME: VALUE}, values: {NAME: [VALUE, ...]}}``; each field in one list; a pinned field in
    none of deny and strip."""
    m = node.mapping(("unknown", *_FIELD_LISTS, "counts", "pin", "values"))
    named: dict[str, str] = {}
    lines: dict[str, int] = {}
    for key, mode in _FIELD_LISTS.items():
        if key not in m:
            continue
        for item in m[key].items():
            name = item.text()
            if not _FIELD_NAME.match(name):
                raise item.fail(f"{name!r} is not a request field name (letters, digits, '_')")
            if name in named:
                raise item.fail(f"field {name!r} is decided twice")
            named[name] = mode
            lines[name] = item.line
    unknown = m["unknown"].choice(UNKNOWN_FIELD_CHOICES) if "unknown" in m else "reject"
    counts: dict[str, int] = {}
    for name, value in m["counts"].entries() if "counts" in m else ():
        if not _FIELD_NAME.match(name):
            raise value.fail(f"{name!r} is not a request field name (letters, digits, '_')")
        if named.get(name, "allow") != "allow":
            raise value.fail(f"field {name!r} is {named[name]}ed: a count cap applies to fields that pass")
        counts[name] = value.whole()
        lines.setdefault(name, value.line)
    pins: dict[str, Pin] = {}
    for name, value in m["pin"].entries() if "pin" in m else ():
        if not _FIELD_NAME.match(name):
            raise value.fail(f"{name!r} is not a request field name (letters, digits, '_')")
        if named.get(name, "allow") != "allow":
            raise value.fail(f"field {name!r} is {named[name]}ed: a pinned field reaches vLLM with its pin")
        pins[name] = _pin(value)
        lines.setdefault(name, value.line)
    values: dict[str, tuple[Pin, ...]] = {}
    for name, value in m["values"].entries() if "values" in m else ():
        if not _FIELD_NAME.match(name):
            raise value.fail(f"{name!r} is not a request field name (letters, digits, '_')")
        if named.get(name, "allow") != "allow" or name in pins:
            raise value.fail(f"field {name!r} is not one that passes as sent: values apply to allowed fields")
        listed = tuple(_pin(item) for item in value.items())
        if not listed:
            raise value.fail(f"field {name!r}: list at least one value")
        values[name] = listed
        lines.setdefault(name, value.line)
    return FieldRules(named=dict(sorted(named.items())), unknown=unknown, counts=dict(sorted(counts.items())),
                      pins=dict(sorted(pins.items())), values=dict(sorted(values.items())), line=node.line,
                      lines=lines)


def _pin(node: Node) -> Pin:
    value = node._scalar()
    if isinstance(value, str) and not PIN_STRING.match(value):
        raise node.fail(f"a pinned string may hold letters, digits and _.:/- (at most 64), got {value!r}")
    if value is not None and not isinstance(value, bool | int | float | str):
        raise node.fail(f"a pin is a number, a string, true, false or null, got {value!r}")
    if isinstance(value, float) and value != value:
        raise node.fail("a pin cannot be NaN")
    return value


def _media(node: Node) -> MediaRules:
    """``media: {urls: deny|allow|pass, domains: [...], data_max_bytes, max_items, embeds}``; a key
    left out takes the end-user default (urls: deny, max_items: 8, embeds: deny, no data limit)."""
    m = node.mapping(("urls", "domains", "data_max_bytes", "max_items", "embeds"))
    urls = m["urls"].choice(URL_MODES) if "urls" in m else "deny"
    domains: list[str] = []
    for item in m["domains"].items() if "domains" in m else ():
        entry = item.text()
        why = entry_problem(entry)
        if why:
            raise item.fail(f"{entry!r} is not a media domain: {why}")
        domains.append(entry)
    if domains and urls != "allow":
        raise m["domains"].fail(f"domains are read only with urls: allow (here urls: {urls})")
    return MediaRules(
        urls=cast(Any, urls), domains=tuple(sorted(set(domains))),
        data_max_bytes=m["data_max_bytes"].whole(minimum=1) if "data_max_bytes" in m else None,
        max_items=m["max_items"].whole(minimum=0) if "max_items" in m else END_USER_DEFAULT.max_items,
        embeds=cast(Any, m["embeds"].choice(EMBED_MODES)) if "embeds" in m else "deny",
        line=node.line)


def _principals(
    top: dict[str, Node], base_dir: Path, audiences: dict[str, Audience]
) -> tuple[tuple[Principal, ...], tuple[CertPrincipal, ...]]:
    """The key principals (``key_sha256``) and certificate principals (``san`` or ``subject``) of
    the policy's ``principals:`` and its principals file; names unique across both kinds."""
    nodes: list[Node] = list(top["principals"].items()) if "principals" in top else []
    if "principals_file" in top:
        ref = top["principals_file"]
        path = base_dir / ref.text()
        root = _compose(read_text(path, "principals file", ref.fail), str(path))
        if root is not None:
            doc = Node(root, "", str(path)).mapping(("principals",))
            if "principals" in doc:
                nodes.extend(doc["principals"].items())
    out: list[Principal] = []
    certs: list[CertPrincipal] = []
    seen: set[str] = set()
    named: dict[str, int] = {}   # a certificate's identity -> the line naming it
    for item in nodes:
        m = item.mapping(("name", "role", "key_sha256", "san", "subject"), required=("name", "role"))
        name = m["name"].text()
        if not _PRINCIPAL.match(name):   # never ':' (token principals are jwt:ISSUER-ID:CLAIM)
            raise m["name"].fail(f"principal {name!r}: use letters, digits, '_', '.', '@' or '-' (at most "
                                 "64, starting with a letter or digit)")
        if name in seen:
            raise m["name"].fail(f"duplicate principal {name!r}")
        seen.add(name)
        given = [k for k in ("key_sha256", "san", "subject") if k in m]
        if len(given) != 1:
            raise item.fail(f"principal {name!r}: give exactly one of key_sha256 (an API key's hash), san "
                            "(a client certificate's URI SAN) or subject (its subject DN)"
                            + (f"; it has {', '.join(given)}" if given else ""))
        if given[0] != "key_sha256":
            text = m[given[0]].text()
            why = san_problem(text) if given[0] == "san" else subject_problem(text)
            if why:
                raise m[given[0]].fail(why)
            cert = CertPrincipal(name=name, role=m["role"].text(), **{given[0]: text})
            if cert.identity in named:
                raise m[given[0]].fail(f"{given[0]} {text!r} already names another principal (line "
                                       f"{named[cert.identity]}): one certificate name, one principal")
            named[cert.identity] = item.line
            if not _ROLE.match(cert.role):
                raise m["role"].fail(f"role {cert.role!r}: use letters, digits, '.', '_' or '-'")
            certs.append(cert)
            continue
        digest = m["key_sha256"].text().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise m["key_sha256"].fail("expected the sha256 hex digest of the key (64 hex digits), "
                                       "never the key itself; use `vllm-perimeter keys new`")
        out.append(Principal(name=name, role=m["role"].text(), key_sha256=digest))
    for aud in audiences.values():
        if aud.auth not in ("key", "cert"):
            continue
        roles = {p.role for p in out} if aud.auth == "key" else {c.role for c in certs}
        kind = "certificate principal" if aud.auth == "cert" else "principal"
        for role in aud.roles:
            if (out if aud.auth == "key" else certs) and role not in roles:
                raise PolicyError(f"{top['audiences'].source}:{aud.line}: audiences.{aud.name}: "
                                  f"role {role!r} has no {kind}" + _hint(role, sorted(roles)))
    return tuple(out), tuple(certs)


def _check_certs(audiences: dict[str, Audience], certs: tuple[CertPrincipal, ...], listen: Listen,
                 top: dict[str, Node]) -> None:
    """``auth: cert`` needs the listener's client CA; certificate principals need a cert audience."""
    cert_auds = [a for a in audiences.values() if a.auth == "cert"]
    ca = listen.tls.client_ca if listen.tls else None
    where = top["audiences"].source
    if cert_auds and not ca:
        a = cert_auds[0]
        raise PolicyError(f"{where}:{a.line}: audiences.{a.name}: auth: cert needs listen.tls.client_ca (the "
                          "CA bundle client certificates are verified against)")
    if certs and not cert_auds:
        raise PolicyError(f"{where}: principal {certs[0].name!r} is a certificate (san/subject), but no "
                          "audience has auth: cert")


def _rules(node: Node, audiences: dict[str, Audience]) -> tuple[RouteRule, ...]:
    rules: list[RouteRule] = []
    for item in node.items():
        m = item.mapping(("path", "methods", "audience", "limits", "state_changing", "note"),
                         required=("path", "audience"))
        path = m["path"].text()
        why = patterns.validate(path)
        if why:
            raise m["path"].fail(f"invalid path pattern {path!r}: {why}")
        audience = m["audience"].text()
        if audience not in audiences:
            raise m["audience"].fail(f"unknown audience {audience!r}" + _hint(audience, list(audiences)))
        methods: tuple[str, ...] = ()
        if "methods" in m:
            methods = tuple(s.upper() for s in m["methods"].texts())
            for meth in methods:
                if meth not in METHODS:
                    raise m["methods"].fail(f"unknown method {meth!r}" + _hint(meth, METHODS))
        rule = RouteRule(
            path=path, audience=audience, methods=tuple(sorted(set(methods))),
            limits=_limits(m["limits"]) if "limits" in m else None,
            state_changing=m["state_changing"].flag() if "state_changing" in m else False,
            note=m["note"].text() if "note" in m else "",
            line=item.line,
        )
        _check_overlap(rule, rules, node.source)
        rules.append(rule)
    return tuple(rules)


def _check_overlap(rule: RouteRule, earlier: list[RouteRule], source: str) -> None:
    for other in earlier:
        shared = (set(rule.methods) & set(other.methods)) if rule.methods and other.methods else True
        if shared and patterns.overlaps(rule.path, other.path):
            raise PolicyError(
                f"{source}:{rule.line}: routes: rule {rule.path!r} overlaps rule {other.path!r} "
                f"at line {other.line}; each method and path must be decided by one rule"
            )


def _ports(node: Node, networks: dict[str, tuple[str, ...]]) -> PortPolicy:
    m = node.mapping(("allow",), required=("allow",))
    rules: list[PortRule] = []
    seen: dict[int, int] = {}
    for item in m["allow"].items():
        r = item.mapping(("port", "networks", "note"), required=("port", "networks"))
        port = r["port"].whole(minimum=1)
        if port > 65535:
            raise r["port"].fail(f"expected a TCP port (1-65535), got {port}")
        if port in seen:
            raise r["port"].fail(f"port {port} is already allowed at line {seen[port]}; "
                                 "list its networks in one entry")
        seen[port] = item.line
        nets = r["networks"].texts()
        if not nets:
            raise r["networks"].fail("name at least one network (or remove the entry: default deny)")
        for i, net in enumerate(nets):
            if net not in networks:
                raise Node(r["networks"].node.value[i], f"{r['networks'].where}[{i}]", node.source).fail(
                    f"unknown network {net!r}" + _hint(net, list(networks)))
        rules.append(PortRule(port=port, networks=nets,
                              note=r["note"].text() if "note" in r else "", line=item.line))
    return PortPolicy(allow=tuple(rules))


def _body(node: Node) -> BodyPolicy:
    m = node.mapping(("cache_salt", "chat_template", "cache_salt_secret_file", "responses",
                      "responses_secret_file"))
    salt = m["cache_salt"].choice(CACHE_SALT_CHOICES) if "cache_salt" in m else "reject"
    secret = _absolute_file(m["cache_salt_secret_file"]) if "cache_salt_secret_file" in m else None
    if salt in SALTED and secret is None:
        raise m["cache_salt"].fail(f"cache_salt: {salt} needs cache_salt_secret_file: the file (mode 0600) "
                                   "holding the HMAC secret (`vllm-perimeter keys salt-secret --out FILE`)")
    if salt not in SALTED and secret is not None:
        raise m["cache_salt_secret_file"].fail("only cache_salt: per-principal or per-audience uses a secret")
    responses = m["responses"].choice(RESPONSES_CHOICES) if "responses" in m else "shared"
    owner_secret = _absolute_file(m["responses_secret_file"]) if "responses_secret_file" in m else None
    if responses == "owned" and owner_secret is None:
        raise m["responses"].fail("responses: owned needs responses_secret_file: the file (mode 0600) "
                                  "holding the HMAC secret the proxy seals response ids with "
                                  "(`vllm-perimeter keys salt-secret --out FILE` makes one)")
    if responses != "owned" and owner_secret is not None:
        raise m["responses_secret_file"].fail("only responses: owned uses a secret")
    return BodyPolicy(
        cache_salt=cast(Any, salt),
        chat_template=cast(Any, m["chat_template"].choice(CHAT_TEMPLATE_CHOICES))
        if "chat_template" in m else "reject",
        cache_salt_secret_file=secret,
        responses=cast(Any, responses),
        responses_secret_file=owner_secret,
    )


_GRPC_METHOD = re.compile(r"^/[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*/([A-Za-z_][A-Za-z0-9_]*|\*)$")


def _grpc(node: Node, audiences: dict[str, Audience], base_dir: Path) -> GrpcPolicy:
    """``grpc: {inventory, listen, upstream: {host, port}, methods: [{method, audience, note}]}``."""
    m = node.mapping(("inventory", "listen", "upstream", "methods"), required=("inventory", "methods"))
    ref = m["inventory"].text()
    path = base_dir / ref
    listen = _listen(m["listen"], default_port=50052) if "listen" in m else Listen(port=50052)
    host, port = "127.0.0.1", 50051
    if "upstream" in m:
        u = m["upstream"].mapping(("host", "port"))
        host = u["host"].text() if "host" in u else host
        if not valid_host(host):
            raise u["host"].fail(f"{host!r} is not an IP address or DNS name")
        port = _port(u["port"]) if "port" in u else port
    rules: list[GrpcRule] = []
    for item in m["methods"].items():
        r = item.mapping(("method", "audience", "note"), required=("method", "audience"))
        method = r["method"].text()
        if not _GRPC_METHOD.match(method):
            raise r["method"].fail(f"{method!r} is not a gRPC method: /package.Service/Method, or "
                                   "/package.Service/* for all of a service's")
        audience = r["audience"].text()
        if audience not in audiences:
            raise r["audience"].fail(f"unknown audience {audience!r}" + _hint(audience, list(audiences)))
        rule = GrpcRule(method=method, audience=audience, note=r["note"].text() if "note" in r else "",
                        line=item.line)
        for other in rules:
            if rule.covers(other.method.replace("/*", "/x")) or other.covers(rule.method.replace("/*", "/x")):
                raise item.fail(f"{method!r} overlaps {other.method!r} at line {other.line}; each gRPC "
                                "method must be decided by one rule")
        rules.append(rule)
    return GrpcPolicy(inventory=ref, listen=listen, upstream_host=host, upstream_port=port,
                      rules=tuple(rules), path=str(path) if path.is_file() else "", line=node.line)


def _listen(node: Node, default_port: int = 8080, base_dir: Path | None = None) -> Listen:
    m = node.mapping(("address", "port", "tls"))
    tls = None
    if "tls" in m:
        t = m["tls"].mapping(("cert", "key", "client_ca", "verify_depth"), required=("cert", "key"))
        if "client_ca" in t and base_dir is None:
            raise t["client_ca"].fail("client certificates are taken on the HTTP listener only")
        ca = _client_ca(t["client_ca"], base_dir or Path(".")) if "client_ca" in t else None
        tls = TlsServer(cert=t["cert"].text(), key=t["key"].text(), client_ca=ca,
                        verify_depth=t["verify_depth"].whole(minimum=1) if "verify_depth" in t else 2)
        if tls.verify_depth > MAX_VERIFY_DEPTH:
            raise t["verify_depth"].fail(f"verify_depth {tls.verify_depth}: at most {MAX_VERIFY_DEPTH}")
    return Listen(
        address=m["address"].text() if "address" in m else "0.0.0.0",
        port=m["port"].whole(minimum=1) if "port" in m else default_port,
        tls=tls,
    )


def _upstream(node: Node) -> Upstream:
    m = node.mapping(("host", "port", "servers", "balance", "health", "tls", "api_key_file"))
    tls = None
    if "tls" in m:
        t = m["tls"].mapping(("ca", "client_cert", "client_key", "server_name"))
        tls = TlsUpstream(**{k: v.text() for k, v in t.items()})
    if "servers" in m:
        if "host" in m or "port" in m:
            raise m["servers"].fail("give either servers or host and port, not both")
        servers = _servers(m["servers"])
        if len(servers) > 1 and tls is not None and not tls.server_name:
            raise m["tls"].fail("several servers need tls.server_name: the one name every replica's "
                                "certificate carries (the proxy verifies it on each)")
    else:
        servers = ((m["host"].text() if "host" in m else "127.0.0.1",
                    _port(m["port"]) if "port" in m else 8000),)
    health = Health()
    if "health" in m:
        h = m["health"].mapping(("max_fails", "eject_s"))
        health = Health(max_fails=h["max_fails"].whole(minimum=1) if "max_fails" in h else 1,
                        eject_s=h["eject_s"].whole(minimum=1) if "eject_s" in h else 10)
    (host, port), *replicas = servers
    return Upstream(
        host=host, port=port, tls=tls, use_tls=tls is not None,
        api_key_file=_absolute_file(m["api_key_file"]) if "api_key_file" in m else None,
        replicas=tuple(replicas),
        balance=m["balance"].choice(BALANCE) if "balance" in m else "least_conn",
        health=health,
    )


def _port(node: Node) -> int:
    port = node.whole(minimum=1)
    if port > 65535:
        raise node.fail(f"port {port} is not in 1..65535")
    return port


def _servers(node: Node) -> tuple[tuple[str, int], ...]:
    """``["10.0.0.5:8000", "[fd00::5]:8000", "vllm-1.llm.svc:8000"]``: each once, at least one."""
    out: list[tuple[str, int]] = []
    for item in node.items():
        text = item.text()
        host, sep, port = text.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        host = host[1:-1] if bracketed else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or \
                (":" in host) != bracketed:
            raise item.fail(f"{text!r} is not host:port (IPv6 as [addr]:port)")
        if not valid_host(host):
            raise item.fail(f"{host!r} is not an IP address or a host name")
        if (host, int(port)) in out:
            raise item.fail(f"{text!r} is listed twice")
        out.append((host, int(port)))
    if not out:
        raise node.fail("expected at least one host:port")
    return tuple(out)


def _client_ca(node: Node, base_dir: Path) -> str:
    """``listen.tls.client_ca``: a PEM bundle of CA certificates (relative to the policy), read now
    to check it; the proxies read it by its absolute path at run time."""
    text = node.text()
    path = str((base_dir / text).absolute()) if not text.startswith("/") else text
    if any(c in path for c in "\"\\$;{}\n\r\t "):
        raise node.fail(f"{text!r}: a path without quotes, spaces, '$', ';' or braces (the proxy opens it)")
    try:
        read_ca_bundle(path)
    except ConfigError as exc:
        raise node.fail(str(exc)) from None
    return path


def _absolute_file(node: Node) -> str:
    path = node.text()
    if not path.startswith("/") or any(c in path for c in "\"\\$;{}\n\r\t "):
        raise node.fail(f"{path!r}: give an absolute path without quotes, spaces, '$', ';' or braces "
                        "(the proxy opens it at run time)")
    return path


def _shared(node: Node) -> Shared:
    """``shared: {redis: URL, limiter: HOST:PORT, password_file: FILE, tls: {ca: FILE},
    on_unavailable: deny|local, replicas: N}``."""
    m = node.mapping(("redis", "limiter", "password_file", "tls", "on_unavailable", "replicas"),
                     required=("redis",))
    url = _redis_url(m["redis"])
    tls_ca = None
    if "tls" in m:
        t = m["tls"].mapping(("ca",), required=("ca",))
        tls_ca = _absolute_file(t["ca"])
        if not redis_url.parse_url(url).tls:
            raise m["tls"].fail("tls needs a rediss:// URL (redis:// is plaintext)")
    limiter = ("127.0.0.1", LIMITER_PORT)
    if "limiter" in m:
        limiter = _host_port(m["limiter"])
    replicas = m["replicas"].whole(minimum=1) if "replicas" in m else 2
    if replicas > MAX_REPLICAS:
        raise m["replicas"].fail(f"at most {MAX_REPLICAS} replicas, got {replicas}")
    return Shared(
        redis=url, limiter=limiter,
        password_file=_absolute_file(m["password_file"]) if "password_file" in m else None,
        tls_ca=tls_ca,
        on_unavailable=cast(Any, m["on_unavailable"].choice(ON_UNAVAILABLE_CHOICES))
        if "on_unavailable" in m else "deny",
        replicas=replicas, line=node.line)


def _redis_url(node: Node) -> str:
    """One Redis, Sentinel or Cluster (scanner.store_url: ``redis://HOST[:PORT][/DB]``,
    ``redis+sentinel://HOST:PORT[,...]/MASTER[/DB]``, ``redis+cluster://HOST:PORT[,...]``;
    ``rediss...``: TLS); never a user or password in it."""
    url = node.text()
    if "@" in url:
        raise node.fail("no user or password in the Redis URL: give password_file (read by the limiter)")
    if any(c.isspace() for c in url):
        raise node.fail(f"{url!r}: no spaces in the Redis URL")
    try:
        parsed = redis_url.parse_url(url)
    except redis_url.UrlError as exc:
        raise node.fail(f"{url!r}: {exc}") from None
    for host, port in parsed.hosts:
        if not valid_host(host):
            raise node.fail(f"{host!r} is not an IP address or DNS name")
        if not 0 < port < 65536:
            raise node.fail(f"port {port} is not in 1..65535")
    return url


def _host_port(node: Node) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[addr]:port``)."""
    text = node.text()
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or (":" in host) != bracketed:
        raise node.fail(f"{text!r} is not host:port (IPv6 as [addr]:port)")
    if not valid_host(host):
        raise node.fail(f"{host!r} is not an IP address or a host name")
    return host, int(port)
