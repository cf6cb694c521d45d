"""The probe's cases on routes that name stored responses (``responses: owned``): the path's id,
``probe-x1`` in a case of any other check, is sent sealed to the case's sender
(scanner/plan/owner.py), so the perimeter admits it to its own checks and forwards vLLM's id, the
``probe-x1`` the witness expects. The seal needs the policy's responses secret
(``--responses-secret-file``; verify makes one); without it such a case proves nothing and is not
sent (its subject: not proven). The ownership check makes its own ids."""

from __future__ import annotations

from dataclasses import replace

from scanner.plan import owner
from scanner.probe.cases import PARAM_VALUE, Case, concrete
from scanner.probe.interface import Credential
from scanner.probe.registry import CheckContext

NO_SECRET = ("the route names a stored response (responses: owned): its id must be sealed for the "
             "sender, which needs the policy's responses secret (--responses-secret-file)")


def principal_of(ctx: CheckContext, cred: Credential) -> str:
    """The principal the perimeter names for ``cred`` ("" unknown)."""
    if cred.kind in ("token", "cert"):
        return cred.principal
    return next((p.name for p in ctx.plan.principals if p.fingerprint == cred.fingerprint), "")


def sealed_target(ctx: CheckContext, case: Case) -> Case:
    """``case`` with its owned path id sealed for its sender (unchanged where nothing is owned)."""
    d = ctx.decision(case.method, case.path)
    if d is None or not d.allowed or not d.owner_param or case.skip:
        return case
    plain = concrete(case.path)
    if plain not in case.target:
        return case
    secret = ctx.options.owner_secret.encode()
    if not secret:
        return case if case.expected == "deny" else replace(case, skip=NO_SECRET)
    parts = plain.split("/")
    at = d.owner_segment
    if at >= len(parts) or parts[at] != PARAM_VALUE:
        return case
    parts[at] = owner.seal(secret, principal_of(ctx, case.credential), PARAM_VALUE)
    return replace(case, target=case.target.replace(plain, "/".join(parts), 1))
