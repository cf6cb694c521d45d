"""``keys``: API keys for principals (only their hashes are stored), evidence signing keys."""

from __future__ import annotations

import click

from scanner.policy import keys as policy_keys


@click.group("keys")
def keys_group() -> None:
    """Make, rotate and revoke API keys for principals (only their hashes are stored), and
    evidence signing keys.

    A changed principals file takes effect when the proxy config is generated again
    and the proxy reloaded (NGINX: `nginx -s reload`; Envoy: a hot restart).
    """


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


_FILE_HELP = "Principals YAML to change (rewritten atomically, mode 0600; comments and other entries kept)."
_AFTER = ("regenerate the proxy config and reload it (nginx -s reload, or an Envoy hot restart): "
          "docs/generate.md, Key files and reload")


def _role_note(change: policy_keys.Changed) -> None:
    if not change.left_in_role:
        click.echo(f"note: role {change.role!r} has no principal left in this file: a policy whose audiences "
                   "name it will not plan until you add one (keys new) or drop the role", err=True)


@keys_group.command("rotate")
@click.argument("name")
@click.option("--file", "path", required=True, metavar="FILE", help=_FILE_HELP)
def keys_rotate(name: str, path: str) -> None:
    """Give NAME a new key: print it ONCE on stdout, replace the old hash (role kept).

    The old key works until the proxy is regenerated and reloaded; requests and
    streams already in flight finish. stderr names the old and new fingerprints.

    \b
    Example:
      vllm-perimeter keys rotate alice --file principals.yaml > alice.key
      vllm-perimeter generate nginx --inventory inv.json --policy policy.yaml -o nginx/
      nginx -s reload
    """
    key = policy_keys.new_key()
    change = policy_keys.rotate_principal(path, name, key)
    old, new = policy_keys.hash_fingerprint(change.old_sha256), policy_keys.fingerprint(key)
    click.echo(f"rotated {name} ({change.role}) in {path}: {old} -> {new}; the new key is printed "
               f"once on stdout; {_AFTER}", err=True)
    click.echo(key)


@keys_group.command("revoke")
@click.argument("name")
@click.option("--file", "path", required=True, metavar="FILE", help=_FILE_HELP)
def keys_revoke(name: str, path: str) -> None:
    """Remove NAME (and its key hash) from a principals file.

    The key works until the proxy is regenerated and reloaded; requests and
    streams already in flight finish, new ones get 401 (unknown-key).

    \b
    Example:
      vllm-perimeter keys revoke alice --file principals.yaml
      vllm-perimeter generate envoy --inventory inv.json --policy policy.yaml -o envoy/
      envoy -c envoy/envoy.yaml --restart-epoch 1 --base-id 7   # hot restart (docs/generate.md)
    """
    change = policy_keys.revoke_principal(path, name)
    click.echo(f"revoked {name} ({change.role}) {policy_keys.hash_fingerprint(change.old_sha256)} "
               f"in {path}; {_AFTER}", err=True)
    _role_note(change)


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


@keys_group.command("salt-secret")
@click.option("--out", "path", required=True, metavar="FILE",
              help="Secret file to create (mode 0600); name it in the policy as "
                   "`body: cache_salt_secret_file:`.")
def keys_salt_secret(path: str) -> None:
    """Make the secret of a tenant-scoped prefix cache (`cache_salt: per-principal`).

    The perimeter writes cache_salt = HMAC-SHA256(secret, principal) over any client's. The
    secret is never printed and never written into a generated config.

    \b
    Example:
      vllm-perimeter keys salt-secret --out /etc/vllm-perimeter/salt.secret
    """
    from scanner.policy import salt

    salt.new_secret(path)
    click.echo(f"wrote {path} (0600, secret)", err=True)
