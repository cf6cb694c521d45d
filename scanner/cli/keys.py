"""``keys``: API keys for principals (only their hashes are stored), evidence signing keys."""

from __future__ import annotations

import click

from scanner.policy import keys as policy_keys


@click.group("keys")
def keys_group() -> None:
    """Make API keys for principals (only their hashes are stored), and evidence signing keys."""


@keys_group.command("new")
@click.argument("name")
@click.option("--role", required=True, help="Role of the principal (e.g. user, service, operator).")
@click.option("--file", "path", required=True, metavar="FILE",
              help="Principals YAML to append to (created 0600 if missing); reference it from "
                   "the policy with `principals_file:`.")
def keys_new(name: str, role: str, path: str) -> None:
    """Create a key for NAME, print it ONCE on stdout, and record only its hash.

    \b
    Example:
      vllm-perimeter keys new alice --role user --file principals.yaml > alice.key
    """
    key = policy_keys.new_key()
    policy_keys.append_principal(path, name, role, key)
    click.echo(f"recorded {name} ({role}) {policy_keys.fingerprint(key)} in {path}; "
               "the key is printed once on stdout", err=True)
    click.echo(key)


@keys_group.command("signing-key")
@click.option("--out", "path", required=True, metavar="FILE",
              help="Private key file to create (mode 0600); the public key goes to FILE.pub.")
def keys_signing_key(path: str) -> None:
    """Make an Ed25519 key for signing evidence packs; print its public fingerprint.

    The private key is never printed. Keep FILE secret; hand FILE.pub to verifiers.

    \b
    Example:
      vllm-perimeter keys signing-key --out evidence.key
    """
    from scanner.evidence import keys as evidence_keys

    pub, fingerprint = evidence_keys.new_signing_key(path)
    click.echo(f"wrote {path} (0600, private) and {pub} (public)", err=True)
    click.echo(fingerprint)
