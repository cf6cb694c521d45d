"""``vllm-perimeter witness``: ship the witness that runs inside vLLM (scanner/witness_asgi.py).

``witness export DIR`` writes the one stdlib-only file vLLM loads with ``--middleware``;
``witness secret --out FILE`` makes the secret it and the prober share.
"""

from __future__ import annotations

from pathlib import Path

import click

from scanner import witness_asgi
from scanner.errors import UsageError
from scanner.output import write_text

MODULE = "vllm_perimeter_witness"
MIDDLEWARE = f"{MODULE}.Witness"


def export(directory: str | Path) -> Path:
    """Write the witness as ``DIR/vllm_perimeter_witness.py``; its path."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{directory}: not a directory")
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{MODULE}.py"
    write_text(target, Path(witness_asgi.__file__).read_text(encoding="utf-8"), mode=0o644)
    return target


@click.group("witness")
def group() -> None:
    """The witness inside vLLM: proof of what reached vLLM on a real deployment.

    \b
    vllm-perimeter witness export /opt/vllm-perimeter
    vllm-perimeter witness secret --out /etc/vllm-perimeter/witness.secret
    PYTHONPATH=/opt/vllm-perimeter VLLM_PERIMETER_WITNESS_SECRET_FILE=/etc/vllm-perimeter/witness.secret \\
        vllm serve MODEL --middleware vllm_perimeter_witness.Witness
    vllm-perimeter probe https://proxy ... --witness http://VLLM:8000 \\
        --witness-secret /etc/vllm-perimeter/witness.secret
    """


@group.command("export")
@click.argument("directory")
def export_cmd(directory: str) -> None:
    """Write DIRECTORY/vllm_perimeter_witness.py (standard library only) for vLLM's --middleware."""
    path = export(directory)
    click.echo(f"wrote {path}; start vLLM with PYTHONPATH={path.parent} "
               f"{witness_asgi.ENV_SECRET_FILE}=SECRET_FILE and --middleware {MIDDLEWARE}", err=True)


@group.command("secret")
@click.option("--out", "path", required=True, metavar="FILE",
              help="Secret file to create (mode 0600): vLLM's witness and the prober read it.")
def secret_cmd(path: str) -> None:
    """Make the secret the witness and `probe --witness-secret` share (never printed)."""
    from scanner.policy import salt

    salt.new_secret(path)
    click.echo(f"wrote {path} (0600, secret)", err=True)
