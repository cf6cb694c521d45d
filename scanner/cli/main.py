"""Entry point ``vllm-perimeter``: one place decides the exit code.

0 clean, 1 findings at or above ``--fail-on``, 2 usage or config error,
3 target unreachable or internal error.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

import click

from scanner import __version__, stop
from scanner.errors import EXIT_UNREACHABLE, EXIT_USAGE, PerimeterError

_EPILOG = """\b
Stages:  inventory -> plan -> generate | probe -> report
Exit codes: 0 the plan holds, 1 a deviation from it (with --require-proof also
            a subject not proven), 2 usage/config error, 3 target unreachable,
            partial run or internal error.
Set VLLM_PERIMETER_DEBUG=1 to see tracebacks of internal errors."""


@click.group(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vllm-perimeter")
def cli() -> None:
    """Default-deny perimeter for vLLM's OpenAI-compatible server.

    vLLM's --api-key guards only /v1, /v2, /inference and /cohere; many other
    routes answer without a key. This tool lists the routes a deployment really
    serves, turns a policy into exact NGINX/Envoy allowlists, and proves every
    denial with live requests.
    """


def _register() -> None:
    from scanner.cli import (
        audit,
        demo,
        evidence,
        init,
        inventory,
        keys,
        limiter,
        netscan,
        plan,
        probe,
        schema,
        standin,
        verify,
        witness,
    )

    cli.add_command(demo.command)
    cli.add_command(init.command)
    cli.add_command(inventory.group)
    cli.add_command(plan.plan_cmd)
    cli.add_command(plan.generate_cmd)
    cli.add_command(probe.command)
    cli.add_command(verify.command)
    cli.add_command(audit.command)
    cli.add_command(netscan.command)
    cli.add_command(evidence.group)
    cli.add_command(standin.command)
    cli.add_command(keys.keys_group)
    cli.add_command(schema.command)
    cli.add_command(limiter.command)
    cli.add_command(witness.group)


_register()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI and exit with the one exit code the run earned."""
    signal.signal(signal.SIGTERM, stop.on_sigterm)
    stop.reset()
    try:
        rc = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except click.exceptions.Abort:   # click's name for a KeyboardInterrupt
        click.echo("terminated" if stop.terminated() else "aborted", err=True)
        rc = 143 if stop.terminated() else 130
    except click.ClickException as exc:
        exc.show()
        rc = EXIT_USAGE
    except PerimeterError as exc:
        click.echo(f"error: {exc.message}", err=True)
        rc = exc.exit_code
    except KeyboardInterrupt:
        click.echo("terminated" if stop.terminated() else "interrupted", err=True)
        rc = 143 if stop.terminated() else 130
    except Exception as exc:  # the one place a bug becomes exit 3 instead of a traceback
        if os.environ.get("VLLM_PERIMETER_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} "
                   "(set VLLM_PERIMETER_DEBUG=1 for a traceback)", err=True)
        rc = EXIT_UNREACHABLE
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
