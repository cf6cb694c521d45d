"""``plan``, ``generate`` and ``keys``: from inventory + policy to proxy configs."""

from __future__ import annotations

import click

from scanner.cli.options import output_options, plan_inputs
from scanner.generate import interface as gen
from scanner.generate.write import write_config
from scanner.output import write_text
from scanner.plan import inputs
from scanner.policy import keys as policy_keys
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
                                  extra=dict(_pair(e) for e in extra))
    config = gen.get(proxy).render(plan, options)
    for path in write_config(config, output_dir):
        click.echo(f"wrote {path}", err=True)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected K=V, got {text!r}", param_hint="--set")
    return key, value


@click.group("keys")
def keys_group() -> None:
    """Make API keys for principals (only their hashes are stored), and evidence signing keys."""


@keys_group.command("new")
@click.argument("name")
@click.option("--role", required=True, help="Role of the principal (e.g. user, service, operator).")
@click.option("--file", "path", required=True, metavar="FILE",
              help="Principals YAML to append to (created 0600 if missing); reference it from "
                   "the policy with `principals_file:`.")
def keys_new(name: str, role: str, path: str) -> None:
    """Create a key for NAME, print it ONCE on stdout, and record only its hash.

    \b
    Example:
      vllm-perimeter keys new alice --role user --file principals.yaml > alice.key
    """
    key = policy_keys.new_key()
    policy_keys.append_principal(path, name, role, key)
    click.echo(f"recorded {name} ({role}) {policy_keys.fingerprint(key)} in {path}; "
               "the key is printed once on stdout", err=True)
    click.echo(key)


@keys_group.command("signing-key")
@click.option("--out", "path", required=True, metavar="FILE",
              help="Private key file to create (mode 0600); the public key goes to FILE.pub.")
def keys_signing_key(path: str) -> None:
    """Make an Ed25519 key for signing evidence packs; print its public fingerprint.

    The private key is never printed. Keep FILE secret; hand FILE.pub to verifiers.

    \b
    Example:
      vllm-perimeter keys signing-key --out evidence.key
    """
    from scanner.evidence import keys as evidence_keys

    pub, fingerprint = evidence_keys.new_signing_key(path)
    click.echo(f"wrote {path} (0600, private) and {pub} (public)", err=True)
    click.echo(fingerprint)
