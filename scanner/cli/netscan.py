"""``netscan``: which TCP ports of a host answer from this vantage, judged by the policy."""

from __future__ import annotations

import dataclasses
from typing import cast

import click

from scanner.cli.options import output_options
from scanner.netscan import policy as port_rules
from scanner.netscan import ports as port_sets
from scanner.netscan import render
from scanner.netscan.model import FAIL_ON_CHOICES
from scanner.netscan.scan import MethodChoice, ScanRequest, run
from scanner.output import write_text
from scanner.plan import inputs


@click.command("netscan")
@click.argument("host")
@click.option("--ports", "port_spec", default=None, metavar="LIST",
              help="Ports to probe, e.g. 8000,29500-29510 (default: vLLM's, Ray's and "
                   "torch.distributed's default ports, see scanner/netscan/ports.py, plus the "
                   "ports the policy allows).")
@click.option("--max-ports", default=port_sets.DEFAULT_MAX_PORTS, show_default=True,
              help="Refuse a --ports list longer than this.")
@click.option("--method", type=click.Choice(["auto", "syn", "connect"]), default="auto",
              show_default=True,
              help="auto: raw SYN when root with scapy and raw sockets, else connect().")
@click.option("--source", default=None, metavar="ADDRESS", help="Local address to send from.")
@click.option("--interface", default=None, metavar="IFACE", help="Interface to send from.")
@click.option("--timeout", default=1.0, show_default=True,
              help="Seconds to wait per port (connect) or after the last SYN (syn).")
@click.option("--concurrency", default=64, show_default=True, help="connect() probes in flight.")
@click.option("--identify", is_flag=True,
              help="Connect to each open port once more and send the HTTP/2 connection preface: "
                   "h2c (HTTP/2 in clear text, e.g. gRPC) or http/1.1 in the service column.")
@click.option("--policy", default=None, metavar="FILE",
              help="Policy YAML whose ports: section says which ports may answer from where "
                   "(default: the bundled vllm-default policy).")
@click.option("--network", "networks", multiple=True, metavar="NAME=CIDR[,CIDR]",
              help="Override a policy network (repeatable).")
@click.option("--vantage", "vantage", multiple=True, metavar="NETWORK",
              help="Policy network(s) this vantage is in (default: those containing the source "
                   "address).")
@click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), default="high", show_default=True,
              help="Exit 1 when a finding has this severity or worse.")
@output_options
def command(host: str, port_spec: str | None, max_ports: int, method: str, source: str | None,
            interface: str | None, timeout: float, concurrency: int, identify: bool, policy: str | None,
            networks: tuple[str, ...], vantage: tuple[str, ...], fail_on: str, fmt: str,
            output: str | None) -> int:
    """Probe which TCP ports of HOST answer from here; open ports the policy does not allow
    from this vantage's networks are findings.

    Raw SYNs (scapy) when privileged, else connect(), and the output says which.
    Exit 1 findings >= --fail-on, 2 bad input, 3 host unreachable.

    \b
    Example:
      vllm-perimeter netscan 10.0.0.5 --ports 8000,29500-29510 --policy policy.yaml
    """
    pol = inputs.load_policy(policy)
    if networks:
        pol = dataclasses.replace(pol, networks={**pol.networks, **inputs.parse_networks(networks)})
    port_list = (port_sets.parse_ports(port_spec, max_ports) if port_spec is not None
                 else tuple(sorted({*port_sets.default_ports(),
                                    *(r.port for r in port_rules.port_policy(pol).allow)})))
    req = ScanRequest(host=host, ports=port_list, method=cast(MethodChoice, method),
                      source=source, interface=interface, timeout=timeout,
                      concurrency=concurrency, vantage_networks=vantage, identify=identify)
    result = run(req, pol)
    write_text(output, render.render(result, fmt))
    return result.exit_code(fail_on)
