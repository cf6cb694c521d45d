"""``plan`` and ``generate``: from inventory + policy to proxy configs."""

from __future__ import annotations

import click

from scanner.cli.options import output_options, parse_pairs, plan_inputs
from scanner.generate import interface as gen
from scanner.generate.write import write_config
from scanner.output import write_text
from scanner.plan import inputs
from scanner.report import plan as render_plan


@click.command("plan")
@plan_inputs
@output_options
def plan_cmd(inventory: str, policy: str | None, networks: tuple[str, ...],
             fmt: str, output: str | None) -> None:
    """Decide every method and path of an inventory under a policy.

    Each route gets one decision: allow (audience, auth, roles, networks,
    limits) or deny, with the reason and the policy line. Routes no rule
    covers are denied and listed. The plan is what `generate` renders and
    what `probe` expects.

    \b
    Example:
      vllm-perimeter plan --inventory vllm-0.29.0-everything --policy my-policy.yaml
    """
    plan = inputs.make_plan(inventory, policy, inputs.parse_networks(networks))
    write_text(output, render_plan.render(plan, fmt))


@click.command("generate")
@click.argument("proxy", type=click.Choice(sorted(gen.GENERATORS)))
@plan_inputs
@click.option("-o", "--output-dir", required=True, metavar="DIR",
              help="Directory for the config files (created if missing).")
@click.option("--runtime-dir", default=gen.GenerateOptions.runtime_dir, show_default=True,
              help="Where the proxy keeps pid, temp files and the key-hash file at run time.")
@click.option("--access-log", default=gen.GenerateOptions.access_log, show_default=True,
              help="Path of the JSON access log.")
@click.option("--set", "extra", multiple=True, metavar="K=V",
              help="Generator-specific option (see README), e.g. njs_module=/usr/lib/nginx/modules/"
                   "ngx_http_js_module.so.")
def generate_cmd(proxy: str, inventory: str, policy: str | None, networks: tuple[str, ...],
                 output_dir: str, runtime_dir: str, access_log: str, extra: tuple[str, ...]) -> None:
    """Write a default-deny NGINX or Envoy config from the plan.

    Only the plan's allowed method+path pairs reach vLLM; everything else is
    answered by the proxy with `X-Perimeter-Decision: deny`. Key hashes go to a
    separate 0600 file; keys themselves never appear.

    \b
    Example:
      vllm-perimeter generate nginx --inventory inv.json --policy policy.yaml -o out/
    """
    plan = inputs.make_plan(inventory, policy, inputs.parse_networks(networks))
    options = gen.GenerateOptions(runtime_dir=runtime_dir, access_log=access_log,
                                  extra=parse_pairs("--set", extra))
    config = gen.get(proxy).render(plan, options)
    for path in write_config(config, output_dir):
        click.echo(f"wrote {path}", err=True)
