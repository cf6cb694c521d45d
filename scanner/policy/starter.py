"""A deployment's starting files (``vllm-perimeter init``): secure by default.

The bundled policy (``policies/vllm-default.yaml``) decides routes, fields and limits; a
deployment also needs what no bundled file can hold, because it is secret and its own:

- ``responses: owned`` (docs/ownership.md): every stored response id sealed to the principal
  that received it, with ``responses_secret_file``;
- ``cache_salt: per-principal`` (docs/policy-and-plan.md): each principal its own prefix cache,
  with ``cache_salt_secret_file``;
- a principals file (key hashes only) for ``keys new``.

:func:`write_starter` writes the policy with both turned on and makes the files it names
(0600). An existing secret or principals file is kept (a second ``init`` never rotates a secret
behind the proxy's back); an existing policy is kept unless ``force``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scanner.errors import UsageError
from scanner.output import read_text, write_text
from scanner.policy import salt
from scanner.policy.load import load
from scanner.resources import data_file

POLICY = "policy.yaml"
PRINCIPALS = "principals.yaml"
SALT_SECRET = "cache-salt.secret"
RESPONSES_SECRET = "responses.secret"

# The bundled policy's line that init replaces, and the name line principals_file follows.
_SALT_LINE = "  cache_salt: reject        # a client-chosen salt can probe other tenants' prefix cache\n"
_NAME_LINE = "name: vllm-default\n"


@dataclass(frozen=True)
class Written:
    """What :func:`write_starter` did with each file: ``wrote`` or ``kept`` (it existed)."""

    path: Path
    action: str
    what: str


def starter_policy(secrets_dir: Path) -> str:
    """The bundled policy with owned responses, per-principal salts (their secrets in
    ``secrets_dir``, an absolute path: the proxy opens the responses secret at run time) and a
    principals file beside the policy."""
    text = read_text(data_file("policies", "vllm-default.yaml"), "the bundled policy")
    if _SALT_LINE not in text or _NAME_LINE not in text:
        raise UsageError("the bundled policy has changed shape; init cannot place its settings")
    body = ("  # secure defaults (vllm-perimeter init): each principal its own prefix cache, and\n"
            "  # stored responses sealed to the principal that made them (403 not-owner to others)\n"
            "  cache_salt: per-principal\n"
            f"  cache_salt_secret_file: {secrets_dir / SALT_SECRET}\n"
            "  responses: owned\n"
            f"  responses_secret_file: {secrets_dir / RESPONSES_SECRET}\n")
    principals = (f"{_NAME_LINE}# `vllm-perimeter keys new NAME --role ROLE --file {PRINCIPALS}` adds a "
                  "principal (its key hash)\n"
                  f"principals_file: {PRINCIPALS}\n")
    return text.replace(_SALT_LINE, body, 1).replace(_NAME_LINE, principals, 1)


def key_roles(policy: Path) -> tuple[str, ...]:
    """The roles the policy's key audiences admit: each needs a principal once any exists."""
    return tuple(sorted({r for a in load(policy).audiences.values() if a.auth == "key" for r in a.roles}))


def write_starter(directory: Path, secrets_dir: Path | None = None,
                  force: bool = False) -> tuple[Written, ...]:
    """Write the starter policy into ``directory`` and make the files it names (0600)."""
    directory = directory.absolute()
    secrets_dir = (secrets_dir or directory).absolute()
    for d in (directory, secrets_dir):
        if not d.is_dir():
            raise UsageError(f"{d}: no such directory; create it first")
    policy = directory / POLICY
    if policy.exists() and not force:
        raise UsageError(f"{policy} exists; keep it, or write a new one with --force "
                         "(secrets and principals are kept either way)")
    done = [Written(policy, "wrote", "policy: owned responses, per-principal cache salts")]
    write_text(policy, starter_policy(secrets_dir))
    for path, what in ((secrets_dir / SALT_SECRET, "cache_salt secret"),
                       (secrets_dir / RESPONSES_SECRET, "responses secret")):
        if path.exists():
            salt.read_secret(str(path), what)      # kept only if usable: 0600, one line
            done.append(Written(path, "kept", what))
        else:
            salt.new_secret(path)
            done.append(Written(path, "wrote", what + " (0600)"))
    principals = directory / PRINCIPALS
    if principals.exists():
        done.append(Written(principals, "kept", "principals"))
    else:
        write_text(principals, "# Principals for vllm-perimeter: key hashes only, never keys.\n"
                   "principals: []\n", mode=0o600)
        done.append(Written(principals, "wrote", "principals (0600, none yet)"))
    return tuple(done)
