"""``vllm-perimeter standin``: a vLLM-shaped upstream on loopback for proxy CI, no GPU."""

from __future__ import annotations

import os
import sys

import click

from scanner.cli.options import parse_pairs
from scanner.errors import UsageError
from scanner.inventory.vllm_app import VllmExtraction
from scanner.plan.inputs import load_inventory
from scanner.standin import serve
from scanner.standin.openai_answers import STREAM_DELAY_S


@click.command("standin", context_settings={"ignore_unknown_options": True})
@click.option("--inventory", default=None, metavar="FILE|CATALOG",
              help="Serve this route table (inventory JSON or bundled catalog name).")
@click.option("--real", "real_python", default=None, metavar="PYTHON",
              help="Instead, serve the real vLLM app engine-less from this vLLM Python "
                   "(serve arguments after --).")
@click.option("--task", "tasks", multiple=True, help="With --real: supported task (repeatable).")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="With --real: build env.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--api-key-env", default=None, metavar="VAR",
              help="Stand-in only: guard vLLM's prefixes with the key in env var VAR, as vLLM's "
                   "--api-key would (the key is never taken on the command line).")
@click.option("--fetch-media", is_flag=True,
              help="Stand-in only: GET each http(s) media URL of a JSON body before answering, as "
                   "vLLM does (for a probe --ssrf-canary rehearsal; loopback canaries only).")
@click.option("--stream-delay-ms", default=round(STREAM_DELAY_S * 1000), show_default=True,
              type=click.IntRange(0, 10_000),
              help="Stand-in only: milliseconds between the events of a streamed answer.")
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def command(inventory: str | None, real_python: str | None, tasks: tuple[str, ...],
            env_pairs: tuple[str, ...], host: str, port: int, api_key_env: str | None,
            fetch_media: bool, stream_delay_ms: int, serve_args: tuple[str, ...]) -> None:
    """Serve a vLLM-shaped upstream on loopback until Ctrl-C.

    With --inventory: a stand-in that answers every route of the table (200 with a
    small JSON; chat, completions, embeddings and Responses bodies get OpenAI-shaped
    answers, streams too), 404/405 like FastAPI, vLLM's --api-key semantics, and counts
    each request that would have changed state (GET /__standin__/stats).
    With --real: vLLM's own app from its venv, engine-less (engine handlers answer 500).

    \b
    Examples:
      vllm-perimeter standin --inventory vllm-0.29.0-everything --port 8000
      VLLM_KEY=... vllm-perimeter standin --inventory inv.json --api-key-env VLLM_KEY
      vllm-perimeter standin --real ~/venvs/vllm/bin/python -- --model m
    """
    announce = lambda msg: click.echo(msg, err=True)  # noqa: E731
    if (inventory is None) == (real_python is None):
        raise UsageError("give exactly one of --inventory or --real")
    if real_python is not None:
        spec = VllmExtraction(python=real_python, serve_args=serve_args or ("--model", "m"),
                              tasks=tasks or ("generate",), env=parse_pairs("--env", env_pairs))
        serve.serve_real(spec, host, port, announce)
        return
    keys: tuple[str, ...] = ()
    if api_key_env:
        value = os.environ.get(api_key_env)
        if not value:
            raise UsageError(f"--api-key-env {api_key_env}: that variable is empty or unset")
        keys = (value,)
    assert inventory is not None
    serve.serve_inventory(load_inventory(inventory), host, port, keys, announce, fetch_media,
                          stream_delay_ms / 1000)
    sys.stdout.flush()
