"""``vllm-perimeter inventory ...``: list the routes an app really serves."""

from __future__ import annotations

import sys

import click

from scanner.cli.options import output_options, parse_pairs
from scanner.inventory import asgi, catalog, openapi, vllm_app
from scanner.inventory import diff as inv_diff
from scanner.inventory.interface import InventorySource
from scanner.output import write_text
from scanner.report import inventory as render_inventory
from scanner.report import inventory_diff as render_diff


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
    argument parser exactly as `vllm serve` would see it. Each route records the
    request body model its code validates and that model's fields (JSON output;
    the table shows the count).

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
        env=parse_pairs("--env", env_pairs),
        isolated_env=isolated_env,
        model_config=model_config,
        allow_unsupported=allow_unsupported,
    )
    _write(spec, fmt, output)


@group.command("asgi")
@click.argument("target", metavar="MODULE:ATTR")
@click.option("--python", "python", default=None, metavar="PATH",
              help="Python interpreter to import the app in (default: this one).")
@click.option("--app-dir", default=".", show_default=True, metavar="DIR",
              help="Directory put first on sys.path before importing MODULE.")
@click.option("--factory", is_flag=True,
              help="ATTR is a zero-argument function returning the app (plain functions "
                   "are detected without this flag).")
@output_options
def asgi_cmd(target: str, python: str | None, app_dir: str, factory: bool,
             fmt: str, output: str | None) -> None:
    """Routes of any Starlette/FastAPI app, e.g. `myservice.main:app`.

    The app is imported in a subprocess of --python; ATTR may be an app, an app
    wrapped in ASGI middleware, or a zero-argument factory. `api-key guard` is
    computed with vLLM's default guarded prefixes.
    """
    spec = asgi.AsgiExtraction(target=target, python=python or sys.executable,
                               app_dir=app_dir, factory=factory)
    _write(spec, fmt, output)


@group.command("openapi")
@click.argument("url")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              metavar="SECONDS", help="Connect and read timeout.")
@click.option("--ca-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="PEM bundle of CAs to verify the server's TLS certificate with.")
@click.option("--insecure", is_flag=True, help="Do not verify the TLS certificate.")
@output_options
def openapi_cmd(url: str, timeout: float, ca_file: str | None, insecure: bool,
                fmt: str, output: str | None) -> None:
    """Routes a live server declares in its OpenAPI document.

    URL is the server's base URL (`/openapi.json` is added) or the spec's own
    URL. The spec omits /docs, mounts such as /metrics and WebSocket routes, so
    this is a lower bound; `inventory vllm` is complete.
    """
    spec = openapi.OpenApiFetch(url=url, timeout=timeout, verify=not insecure, ca_file=ca_file)
    _write(spec, fmt, output)


def _write(source: InventorySource, fmt: str, output: str | None) -> None:
    write_text(output, render_inventory.render(source.inventory(), fmt))


@group.command("diff")
@click.argument("old", metavar="OLD")
@click.argument("new", metavar="NEW")
@click.option("--fields/--no-fields", default=True, show_default=True,
              help="Also compare the request fields of the routes both sides serve.")
@output_options
def diff_cmd(old: str, new: str, fields: bool, fmt: str, output: str | None) -> None:
    """Routes added, removed and changed between two inventories, and the request
    fields added, removed and changed per route.

    OLD and NEW are inventory files or bundled catalog names (see `inventory
    catalog list`). Changes outside vLLM's --api-key guard are listed first.
    A diff is information: the exit code is 0.

    \b
    Example:
      vllm-perimeter inventory diff vllm-0.28.0-everything vllm-0.29.0-everything
    """
    result = inv_diff.diff(catalog.load_ref(old), catalog.load_ref(new), old, new)
    write_text(output, render_diff.render(result, fmt, fields=fields))


@group.group("catalog")
def catalog_group() -> None:
    """Bundled inventories of real vLLM releases (policies/catalog)."""


@catalog_group.command("list")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format.")
def catalog_list_cmd(fmt: str) -> None:
    """List the bundled catalogs."""
    write_text(None, render_inventory.catalog_list(catalog.entries(), fmt))


@catalog_group.command("show")
@click.argument("name")
@output_options
def catalog_show_cmd(name: str, fmt: str, output: str | None) -> None:
    """Show one bundled catalog, e.g. `vllm-0.29.0-default`."""
    write_text(output, render_inventory.render(catalog.load_catalog(name), fmt))


@catalog_group.command("build")
@click.option("--python", "python", required=True, metavar="PATH",
              help="Python interpreter of the vLLM release to catalog.")
@click.option("--profile", "profile_name", type=click.Choice(list(catalog.PROFILES)),
              required=True, help="Which surface to build (see `catalog profiles`).")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write the catalog JSON to FILE (atomically) instead of stdout.")
def catalog_build_cmd(python: str, profile_name: str, output: str | None) -> None:
    """Build a catalog from a real vLLM release (isolated env: same bytes each run).

    \b
    Example (how the bundled catalogs are made):
      vllm-perimeter inventory catalog build --python ~/venvs/vllm-0.29.0/bin/python \\
          --profile everything -o policies/catalog/vllm-0.29.0-everything.json
    """
    write_text(output, catalog.build(python, profile_name).to_json())


@catalog_group.command("profiles")
def catalog_profiles_cmd() -> None:
    """Show what each build profile passes to vLLM."""
    write_text(None, render_inventory.profiles(catalog.PROFILES.values()))


from scanner.cli.inventory_live import live_cmd  # noqa: E402  (registered last: inventory live)

group.add_command(live_cmd)

from scanner.cli.inventory_grpc import grpc_cmd  # noqa: E402  (registered after the group exists)

group.add_command(grpc_cmd)
