"""Credentials and vantages from the command line: keys by reference only, never by value."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace

import jwt as pyjwt

from scanner.errors import UsageError
from scanner.output import read_text
from scanner.plan import jwt as plan_jwt
from scanner.plan.model import Plan
from scanner.policy.keys import fingerprint, new_key
from scanner.probe.interface import Credential, Vantage


def parse_key(spec: str, environ: Mapping[str, str] | None = None, option: str = "--key") -> Credential:
    """``ROLE=env:VAR`` or ``ROLE=file:PATH`` -> a role credential. The value is never echoed.

    Whitespace around the key (a trailing newline, CRLF, spaces) is ignored; what remains must be
    one token of visible ASCII (it goes into an ``Authorization`` header as it is)."""
    env = os.environ if environ is None else environ
    role, sep, ref = spec.partition("=")
    if not sep or not role or not ref:
        raise UsageError(f"{option} expects ROLE=env:VAR or ROLE=file:PATH")
    kind, sep, where = ref.partition(":")
    if kind == "env" and sep and where:
        value = env.get(where, "").strip()
        if not value:
            raise UsageError(f"{option} {role}=env:{where}: the environment variable is unset or empty")
    elif kind == "file" and sep and where:
        value = read_text(where, "key file", lambda msg: UsageError(f"{option} {role}=file:{msg}")).strip()
        if not value:
            raise UsageError(f"{option} {role}=file:{where}: the file is empty")
    else:
        raise UsageError(f"{option} {role}=...: give the key by reference, env:VAR or file:PATH "
                         "(never the key itself on the command line)")
    if any(not "!" <= c <= "~" for c in value):
        raise UsageError(f"{option} {role}={ref}: the key must be one line of visible ASCII characters "
                         "without spaces")
    return Credential(label=f"role:{role}", kind="role", role=role, secret=value,
                      fingerprint=fingerprint(value))


def credentials(specs: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[Credential, ...]:
    """The fixed credentials (none, malformed, wrong) and one per ``--key``. Several keys of
    one role are several principals: each has its own limiter buckets, so the probe spreads
    its cases over them and runs them in parallel (labels ``role:user``, ``role:user#2``, ...)."""
    wrong = new_key()
    out = [Credential("none", "none"), Credential("malformed-bearer", "malformed"),
           Credential("wrong-key", "wrong", secret=wrong, fingerprint=fingerprint(wrong))]
    count: dict[str, int] = {}
    seen: set[str] = set()
    for spec in specs:
        cred = parse_key(spec, environ)
        if cred.fingerprint in seen:
            raise UsageError(f"--key {cred.role}=...: the same key is given twice")
        seen.add(cred.fingerprint)
        count[cred.role] = count.get(cred.role, 0) + 1
        if count[cred.role] > 1:
            cred = replace(cred, label=f"{cred.label}#{count[cred.role]}")
        out.append(cred)
    return tuple(out)


def parse_vantage(spec: str) -> Vantage:
    """``NAME=SOURCE_ADDRESS``: requests from this vantage bind that local address."""
    name, sep, addr = spec.partition("=")
    if not sep or not name or not addr:
        raise UsageError(f"--vantage expects NAME=SOURCE_ADDRESS, got {spec!r}")
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        raise UsageError(f"--vantage {name}={addr}: not an IP address") from None
    return Vantage(name=name, address=addr)


def vantages(specs: Sequence[str]) -> tuple[Vantage, ...]:
    out = tuple(parse_vantage(s) for s in specs)
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise UsageError("--vantage: names must be unique")
    return out or (Vantage(),)


def token_credential(role: str, token: str, plan: Plan, label: str = "") -> Credential:
    """A bearer token as a credential: the auth "jwt" audiences of ``plan`` whose issuers and
    audiences its (unverified) claims name, and the principal it names there. Never echoed."""
    try:
        claims = pyjwt.decode(token, options={"verify_signature": False})
    except pyjwt.PyJWTError:
        raise UsageError(f"--token {role}=...: not a JWT") from None
    auds = claims.get("aud")
    auds = auds if isinstance(auds, list) else [auds]
    found: dict[str, str] = {}
    for d in plan.allowed:
        t = d.jwt
        if t is not None and claims.get("iss") in t.issuers and any(a in t.audiences for a in auds):
            who = claims.get(t.principal_claim)
            named = plan_jwt.principal(t, str(claims["iss"]), who) if isinstance(who, str) else ""
            found.setdefault(d.audience, named)
    return Credential(label=label or f"token:{role}", kind="token", role=role, secret=token,
                      fingerprint=fingerprint(token), audiences=tuple(sorted(found)),
                      principal=next(iter(found.values()), ""))


def tokens(specs: Sequence[str], plan: Plan,
           environ: Mapping[str, str] | None = None) -> tuple[Credential, ...]:
    """``--token ROLE=env:VAR`` / ``ROLE=file:PATH``: bearer tokens of the plan's auth "jwt"
    audiences, read like keys (never echoed); several of a role are labelled ``token:ROLE#2``..."""
    out: list[Credential] = []
    count: dict[str, int] = {}
    for spec in specs:
        key = parse_key(spec, environ, "--token")
        count[key.role] = count.get(key.role, 0) + 1
        n = count[key.role]
        out.append(token_credential(key.role, key.secret, plan,
                                    f"token:{key.role}" + (f"#{n}" if n > 1 else "")))
    return tuple(out)
