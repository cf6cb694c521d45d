"""``vllm-perimeter init``: a deployment's policy and secrets, secure by default."""

from __future__ import annotations

from pathlib import Path

import click

from scanner.policy import starter


@click.command("init")
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--secrets-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where the proxy reads the secrets at run time (default: DIRECTORY).")
@click.option("--force", is_flag=True, help="Write policy.yaml over an existing one (secrets and "
              "principals are never overwritten).")
def command(directory: Path, secrets_dir: Path | None, force: bool) -> None:
    """Write DIRECTORY/policy.yaml (the bundled policy with owned responses and per-principal
    cache salts) and make the files it names: both secrets and an empty principals file, 0600.

    Existing secrets and principals are kept. Secrets are never printed.

    \b
    Example:
      vllm-perimeter init perimeter/
      vllm-perimeter keys new alice --role user --file perimeter/principals.yaml > alice.key
    """
    for w in starter.write_starter(directory, secrets_dir, force):
        click.echo(f"{w.action} {w.path} ({w.what})", err=True)
    policy, principals = directory / starter.POLICY, directory / starter.PRINCIPALS
    roles = ", ".join(starter.key_roles(policy))
    click.echo(f"next: set your networks in {policy}; a key per role ({roles}): vllm-perimeter keys new "
               f"NAME --role ROLE --file {principals} > NAME.key; then plan, verify, generate", err=True)
