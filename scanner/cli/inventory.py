"""``vllm-perimeter inventory ...``: list the routes an app really serves."""

from __future__ import annotations

import sys

import click

from scanner.cli.options import output_options, parse_env_pairs
from scanner.inventory import vllm_app
from scanner.output import write_text
from scanner.report import inventory as render_inventory


@click.group("inventory")
def group() -> None:
    """List the routes an app serves (real vLLM app, any ASGI app, a live server)."""


@group.command("vllm", context_settings={"ignore_unknown_options": True})
@click.option("--python", "python", default=None, metavar="PATH",
              help="Python interpreter that has vLLM installed (default: this one).")
@click.option("--task", "tasks", multiple=True, metavar="TASK",
              help="Supported task (repeatable): generate, transcription, realtime, embed, "
                   "classify, token_embed, token_classify, render. Default: generate.")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V",
              help="Environment variable for the build (repeatable), e.g. VLLM_SERVER_DEV_MODE=1.")
@click.option("--isolated-env", is_flag=True,
              help="Start from an empty environment (PATH, HOME, LANG kept) plus --env; "
                   "otherwise the caller's environment applies.")
@click.option("--model-config", type=click.Choice(vllm_app.MODEL_CONFIG_CHOICES), default="auto",
              show_default=True,
              help="Model config for pooling routes: a local model directory (--model DIR), "
                   "an offline stand-in, or none. auto picks local if --model is a directory "
                   "with config.json, else the stand-in, and only for pooling tasks.")
@click.option("--allow-unsupported", is_flag=True,
              help="Try a vLLM version outside the tested 0.28-0.33 range.")
@output_options
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED, metavar="-- [VLLM SERVE ARGS]...")
def vllm_cmd(python: str | None, tasks: tuple[str, ...], env_pairs: tuple[str, ...],
             isolated_env: bool, model_config: str, allow_unsupported: bool,
             fmt: str, output: str | None, serve_args: tuple[str, ...]) -> None:
    """Routes of the real vLLM app for the exact serve arguments, env and tasks.

    Builds the app with vLLM's own build_app() in vLLM's Python: no GPU, no
    engine, no model download. Everything after `--` is passed to vLLM's serve
    argument parser exactly as `vllm serve` would see it.

    \b
    Examples:
      vllm-perimeter inventory vllm --python ~/venvs/vllm/bin/python -- --model my-model
      vllm-perimeter inventory vllm --python PY --env VLLM_SERVER_DEV_MODE=1 \\
          --task generate --task embed -o inv.json --format json -- --model m --enable-lora
    """
    spec = vllm_app.VllmExtraction(
        python=python or sys.executable,
        serve_args=serve_args,
        tasks=tasks or ("generate",),
        env=parse_env_pairs(env_pairs),
        isolated_env=isolated_env,
        model_config=model_config,
        allow_unsupported=allow_unsupported,
    )
    inv, _ = vllm_app.extract(spec)
    write_text(output, render_inventory.render(inv, fmt))
