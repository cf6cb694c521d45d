"""``vllm-perimeter inventory live URL``: the routes a running server answers, measured."""

from __future__ import annotations

import click

from scanner import canonical
from scanner.cli.options import output_options
from scanner.inventory import live, rust
from scanner.output import write_text
from scanner.report import inventory as render_inventory


@click.command("live")
@click.argument("url")
@click.option("--key", "key_file", default=None, metavar="FILE",
              help="File holding the server's API key (never printed): every probe carries it, "
                   "each served route is asked again without it to measure the guard.")
@click.option("--vllm-rs", "binaries", multiple=True, metavar="FILE",
              help="A vllm-rs binary whose own route list adds candidates (repeatable).")
@click.option("--python", "pythons", multiple=True, metavar="PATH",
              help="Python of a vLLM install: its vllm/vllm-rs binary's route list adds candidates "
                   "(repeatable; vLLM is not imported).")
@click.option("--catalog", "catalogs", multiple=True, metavar="NAME|FILE",
              help="Take candidates from these bundled catalogs or inventory files only "
                   "(repeatable; default: every bundled catalog).")
@click.option("--path", "extra_paths", multiple=True, metavar="PATH",
              help="One more candidate path (repeatable); its methods come from the server's Allow.")
@click.option("--no-openapi", is_flag=True, help="Do not read the server's /openapi.json.")
@click.option("--allow-state-changes", is_flag=True,
              help="Also send the declared method (empty body) to state-changing routes (/pause, "
                   "/sleep, /collective_rpc ...) and PUT/PATCH/DELETE routes. Staging only: it "
                   "may pause, sleep or reset the server.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              metavar="SECONDS", help="Per request.")
@click.option("--max-time", type=click.FloatRange(min=1), default=120.0, show_default=True,
              metavar="SECONDS", help="For the whole run; beyond it, exit 3.")
@click.option("--max-requests", type=click.IntRange(min=20), default=3000, show_default=True,
              help="For the whole run; beyond it, exit 3.")
@click.option("--concurrency", type=click.IntRange(1, 16), default=4, show_default=True)
@click.option("--ca-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="PEM bundle of CAs to verify the server's TLS certificate with.")
@click.option("--insecure", is_flag=True, help="Do not verify the TLS certificate.")
@click.option("--probes", "probes_out", default=None, metavar="FILE",
              help="Also write every candidate's verdict and what was seen (JSON).")
@output_options
def live_cmd(url: str, key_file: str | None, binaries: tuple[str, ...], pythons: tuple[str, ...],
             catalogs: tuple[str, ...], extra_paths: tuple[str, ...], no_openapi: bool,
             allow_state_changes: bool, timeout: float, max_time: float, max_requests: int,
             concurrency: int, ca_file: str | None, insecure: bool, probes_out: str | None,
             fmt: str, output: str | None) -> None:
    """Black-box inventory of a running server (vLLM's Python app, vllm-rs, a proxy).

    Every method x path of the bundled catalogs, of --vllm-rs/--python binaries' own
    route lists and of the server's OpenAPI document is classified served or absent
    by the server's own answers, after calibrating what an absent path looks like
    there. Nothing that could act is sent by default: GET/HEAD/OPTIONS, and POST with
    an empty non-JSON body; state-changing routes are seen through the router's 405
    Allow answer. Same inventory format; source kind `live`, each route's origin says
    how it was seen. A summary goes to stderr.

    \b
    Examples:
      vllm-perimeter inventory live http://127.0.0.1:8000 --key ./vllm.key
      vllm-perimeter inventory live http://127.0.0.1:8000 --python ~/venvs/vllm/bin/python \\
          --format json -o live.json --probes probes.json
    """
    spec = live.LiveInventory(
        url=url,
        key=live.read_key(key_file) if key_file else None,
        timeout=timeout, max_time=max_time, max_requests=max_requests, concurrency=concurrency,
        verify=not insecure, ca_file=ca_file, allow_state_changes=allow_state_changes,
        catalogs=catalogs or None,
        binaries=(*binaries, *(str(rust.locate(p)) for p in pythons)),
        openapi=not no_openapi, extra_paths=extra_paths,
    )
    result = live.run(spec)
    write_text(output, render_inventory.render(result.inventory, fmt))
    if probes_out:
        write_text(probes_out, canonical.dumps(result.to_dict()))
    click.echo(result.summary(), err=True)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
