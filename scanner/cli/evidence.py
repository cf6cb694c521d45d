"""``evidence build`` / ``evidence verify``: a signed pack of a run's inputs and results."""

from __future__ import annotations

from pathlib import Path

import click

from scanner import canonical
from scanner.errors import EXIT_FINDINGS, EXIT_OK
from scanner.evidence import pack


@click.group("evidence")
def group() -> None:
    """Signed evidence packs: inputs and results, sha256 per file, Ed25519 over the manifest."""


@group.command("build")
@click.argument("directory")
@click.option("--inventory", required=True, metavar="FILE", help="Inventory JSON.")
@click.option("--policy", required=True, metavar="FILE",
              help="Policy YAML (its principals_file, key hashes only, is included too).")
@click.option("--plan", default=None, metavar="FILE", help="Plan output.")
@click.option("--config", "configs", multiple=True, metavar="FILE",
              help="Generated proxy config file (repeatable).")
@click.option("--probe", default=None, metavar="FILE", help="Probe result JSON.")
@click.option("--netscan", default=None, metavar="FILE", help="Netscan result JSON.")
@click.option("--signing-key", required=True, metavar="KEY",
              help="Ed25519 private key (0600) from `keys signing-key`; never copied into the pack.")
def build_cmd(directory: str, inventory: str, policy: str, plan: str | None, configs: tuple[str, ...],
              probe: str | None, netscan: str | None, signing_key: str) -> None:
    """Copy the files into DIRECTORY (new or empty) with a signed manifest.

    \b
    Example:
      vllm-perimeter evidence build pack/ --inventory inv.json --policy policy.yaml \\
          --probe probe.json --netscan netscan.json --signing-key evidence.key
    """
    given: list[tuple[pack.Role, str | None]] = [
        ("inventory", inventory), ("policy", policy), ("plan", plan), ("probe", probe), ("netscan", netscan),
        *(("config", c) for c in configs)]
    inputs = [pack.Input(role, Path(path)) for role, path in given if path is not None]
    manifest = pack.build(directory, inputs, signing_key)
    for f in manifest["files"]:
        click.echo(f"{f['sha256'][:23]}  {f['path']}")
    click.echo(f"wrote {directory}: {len(manifest['files'])} files, vLLM "
               f"{manifest['vllm_version'] or 'unknown'}, signed by {manifest['public_key_fingerprint']}",
               err=True)


@group.command("verify")
@click.argument("directory")
@click.option("--public-key", default=None, metavar="FILE",
              help="The signer's public key (FILE.pub of `keys signing-key`). Without it the pack's "
                   "own signing-key.pub is used, which proves integrity but not who signed.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def verify_cmd(directory: str, public_key: str | None, fmt: str) -> int:
    """Check every file's sha256 and the manifest's signature.

    Exit 0 verified, 1 verification failed (the first file that does not match is
    named), 2 not a pack or a bad --public-key.
    """
    result = pack.verify(directory, public_key)
    first = result.first_failure
    if fmt == "json":
        click.echo(canonical.dumps({
            "pack": result.pack, "ok": result.ok, "signer": result.signer, "key": result.key_source,
            "first_failure": first.path if first else None,
            "checks": [{"path": c.path, "ok": c.ok, "detail": c.detail} for c in result.checks],
        }), nl=False)
    else:
        for c in result.checks:
            click.echo(f"{'ok  ' if c.ok else 'FAIL'}  {c.path}: {c.detail}")
        click.echo(f"key: {result.key_source}")
        click.echo(f"VERIFIED {result.pack}" if first is None
                   else f"VERIFICATION FAILED {result.pack}: first mismatch {first.path}: {first.detail}")
    return EXIT_OK if result.ok else EXIT_FINDINGS
