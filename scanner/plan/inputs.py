"""Load the two inputs of a plan: an inventory (file or bundled catalog) and a policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from scanner import resources
from scanner.errors import UsageError
from scanner.inventory import catalog
from scanner.inventory.model import Inventory
from scanner.plan.build import build
from scanner.plan.model import Plan
from scanner.policy import load as policy_load
from scanner.policy.model import Policy, valid_cidr

DEFAULT_POLICY = "vllm-default"


def load_inventory(ref: str) -> Inventory:
    """A path to an inventory JSON, or the name of a bundled catalog (``vllm-0.29.0-default``)."""
    return catalog.load_ref(ref)


def load_policy(ref: str | None) -> Policy:
    """A path to a policy YAML, or the name of a bundled policy (default: vllm-default)."""
    if ref is None or not Path(ref).exists():
        name = ref or DEFAULT_POLICY
        bundled = resources.data_file("policies", f"{name}.yaml")
        if bundled.exists():
            return policy_load.load(bundled)
        raise UsageError(f"policy {name!r}: no such file, and no bundled policy of that name")
    return policy_load.load(ref)


def parse_networks(pairs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``NAME=CIDR[,CIDR...]`` pairs (repeatable) into a network override map."""
    out: dict[str, tuple[str, ...]] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        cidrs = tuple(c.strip() for c in value.split(",") if c.strip())
        if not sep or not name or not cidrs:
            raise UsageError(f"--network expects NAME=CIDR[,CIDR...], got {pair!r}")
        for cidr in cidrs:
            if not valid_cidr(cidr):
                raise UsageError(f"--network {name}: {cidr!r} is not an IP network")
        out[name] = out.get(name, ()) + cidrs
    return out


def make_plan(inventory_ref: str, policy_ref: str | None,
              networks: Mapping[str, tuple[str, ...]] | None = None) -> Plan:
    return build(load_inventory(inventory_ref), load_policy(policy_ref), networks)
