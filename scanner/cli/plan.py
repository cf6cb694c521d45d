"""``plan`` and ``generate``: from inventory + policy to proxy configs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from scanner.cli import kubernetes as kube_cli
from scanner.cli.options import output_options, parse_pairs, plan_inputs
from scanner.generate import interface as gen
from scanner.generate import kubernetes
from scanner.generate.write import write_config
from scanner.output import write_text
from scanner.plan import inputs
from scanner.plan.model import Plan
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
    _warn(plan)


def _warn(plan: Plan) -> None:
    """What the plan leaves open that `vllm-perimeter init` closes, loudly, on stderr."""
    for line in render_plan.warnings(plan):
        click.secho(f"warning: {line} (vllm-perimeter init writes a policy with both)", fg="yellow", err=True)


@click.command("generate")
@click.argument("proxy", type=click.Choice(sorted(gen.GENERATORS)))
@plan_inputs
@click.option("-o", "--output-dir", required=True, metavar="DIR",
              help="Directory for the config files (created if missing).")
@click.option("--runtime-dir", default=gen.GenerateOptions.runtime_dir, show_default=True,
              help="NGINX: where it keeps its pid and temp files at run time (Envoy keeps none). "
                   "Key files are read from the config directory: --set config_dir=DIR, else -o.")
@click.option("--access-log", default=gen.GenerateOptions.access_log, show_default=True,
              help="Path of the JSON access log.")
@click.option("--set", "extra", multiple=True, metavar="K=V",
              help="Generator-specific option (see README), e.g. njs_module=/usr/lib/nginx/modules/"
                   "ngx_http_js_module.so.")
@kube_cli.kubernetes_options
def generate_cmd(proxy: str, inventory: str, policy: str | None, networks: tuple[str, ...],
                 output_dir: str, runtime_dir: str, access_log: str, extra: tuple[str, ...],
                 **kube: Any) -> None:
    """Write a default-deny NGINX or Envoy config from the plan.

    Only the plan's allowed method+path pairs reach vLLM; everything else is
    answered by the proxy with `X-Perimeter-Decision: deny`. Key hashes go to a
    separate 0600 file; keys themselves never appear.

    The proxy reads its key files at run time from the config directory:
    `--set config_dir=DIR` (where you will deploy the files) if given, else the
    output directory. `generate` prints each path, and what to copy where.
    After `keys rotate` or `keys revoke`: generate again, then `nginx -s reload`
    or an Envoy hot restart (docs/generate.md, "Key files and reload").

    With --kubernetes, DIR/kubernetes/ gets the manifests that deploy it
    (docs/kubernetes.md).

    \b
    Example:
      vllm-perimeter generate nginx --inventory inv.json --policy policy.yaml -o out/
    """
    k8s = kube_cli.settings(kube)   # None without --kubernetes
    plan = inputs.make_plan(inventory, policy, inputs.parse_networks(networks))
    out = Path(os.path.abspath(output_dir))
    options = gen.GenerateOptions(runtime_dir=runtime_dir, access_log=access_log,
                                  extra=parse_pairs("--set", extra), output_dir=str(out))
    if k8s:
        options = kubernetes.proxy_options(proxy, options)
    config = gen.get(proxy).render(plan, options)
    if k8s:
        config = kube_cli.with_bundle(plan, config, options, policy, k8s)
    for path in write_config(config, output_dir):
        click.echo(f"wrote {path}", err=True)
    for line in kube_cli.notes(out) if k8s else runtime_notes(config, out):
        click.echo(line, err=True)
    _warn(plan)   # after what was written: a refusal above stays one line


def runtime_notes(config: gen.GeneratedConfig, out: Path) -> list[str]:
    """Where the proxy reads each secret's file at run time, and what to copy where first."""
    lines = []
    for rf in config.runtime_files:
        if rf.holds:
            lines.append(f"the proxy reads {rf.holds} from {rf.path} ({rf.access})")
        if rf.generated and rf.path != str(out / rf.generated):
            lines.append(f"copy {out / rf.generated} to {rf.path}")
    return lines
