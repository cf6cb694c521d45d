"""Mutation operators of a fleet (policy shared:, ``verify --replicas N``): each weakens the
second replica's generated files, the way one replica deployed wrong would, and the probe spreading
its limit cases over the replicas (scanner.probe.fleet) must catch it: the fleet then admits more
than the policy in sum.

* ``replica-unshared``: the replica generated without the shared store: its own local limits at
  the policy's full value (as if deployed from a policy without ``shared:``);
* ``replica-zone-key``: the replica counts in zones of its own (every zone name with the
  replica's name appended, known to the limiter): per-replica keys on the shared store;
* ``replica-orphaned-slot``: the replica never releases a slot after the answer (NGINX: njs
  ``after`` sends no release, the refund still settled; Envoy: the release descriptors gone): each
  request's slot stays held while that replica lives, up to the zone's slot_ttl_s (caught by
  ``verify.fleet.slots_back``: sequential requests refused 429 concurrency);
* ``replica-failover-burst``: the replica decides alone as soon as the store fails, with the
  policy's full values (not its share) and no wait (local_after_s): a fresh full burst per replica
  at the failover (caught by ``verify.fleet.outage``: admitted with Redis stopped beyond the policy).
* ``limiter-bucket-two-minutes``: the zones file written beside the replica gives the limiter one
  token zone's bucket at twice the plan's capacity (the refill as planned: up to 2 C + N a minute
  for the whole fleet, since the limiter reads the zones the replicas' files name; caught by the
  token-budget check spread over the replicas).

Each ``needs`` a fleet: single-proxy ``verify --mutate`` skips them (scanner.verify)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import scanner.mutate.envoy as envoy
import scanner.mutate.nginx as nginx
from scanner.generate.envoy_model import EnvoyModel
from scanner.generate.nginx_model import Block, NginxModel
from scanner.generate.shared import ZONES_FILE
from scanner.mutate.core import NotApplicable, Operator, register
from scanner.plan.model import Plan

NEEDS = "fleet"
CATCHES = ("rate", "concurrency", "token-budget")
FLEET = ("fleet",)      # scanner.verify.fleet's own checks (slots_back, outage)
SUFFIX = ".replica2"
RENDER = {"envoy": envoy.render, "nginx": nginx.render}


def _shared(plan: Plan) -> None:
    if plan.shared is None:
        raise NotApplicable("the plan has no shared: section (a fleet's operator)")


def _unshared(kind: str) -> Operator:
    def apply(directory: Path, plan: Plan) -> str:
        _shared(plan)
        RENDER[kind](directory, replace(plan, shared=None))
        return "the second replica without the shared store: its own limits at the policy's full value"
    return Operator(f"{kind}.replica-unshared", kind, "remove", "the second replica of a fleet",
                    "one replica without the shared store (local limits at full value)", CATCHES, apply,
                    NEEDS)


def _suffixed(names: set[str]) -> Callable[[str], str]:
    return lambda zone: zone + SUFFIX if zone in names else zone


def _nginx_zones(names: set[str]) -> nginx.ModelEdit:
    """Every block's limiter zones ($perimeter_shared: "p|a ZONE ...") named with the suffix."""
    rename = _suffixed(names)

    def edit(model: NginxModel, plan: Plan) -> tuple[NginxModel, str]:
        def block(b: Block) -> Block:
            key, *zones = b.shared.split(" ") if b.shared else [""]
            return replace(b, shared=" ".join([key, *map(rename, zones)])) if zones else b
        locations = tuple(replace(loc, blocks=tuple(map(block, loc.blocks))) for loc in model.locations)
        if locations == model.locations:
            raise NotApplicable("perimeter-http.conf names no zone of the limiter")
        return replace(model, locations=locations), ""
    return edit


def _envoy_zones(names: set[str]) -> envoy.ModelEdit:
    """Every route's limiter descriptors (zone, NAME) named with the suffix."""
    rename = _suffixed(names)

    def edit(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
        routes = tuple(replace(r, shared=tuple(replace(a, zone=rename(a.zone)) for a in r.shared))
                       for r in model.routes)
        if routes == model.routes:
            raise NotApplicable("envoy.yaml names no zone of the limiter")
        return replace(model, routes=routes), ""
    return edit


def _zone_key(kind: str) -> Operator:
    def apply(directory: Path, plan: Plan) -> str:
        _shared(plan)
        assert plan.shared is not None
        names = set(plan.shared.zones)
        if kind == "nginx":
            nginx.render(directory, plan, _nginx_zones(names))
        else:
            envoy.render(directory, plan, _envoy_zones(names))
        zones = directory / ZONES_FILE       # the limiter's zones (data): the renamed ones known too
        doc = json.loads(zones.read_text(encoding="utf-8"))
        doc["zones"].update({n + SUFFIX: z for n, z in doc["zones"].items()})
        zones.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
        return f"the second replica's zones named with the replica's name ({SUFFIX}): keys of its own"
    return Operator(f"{kind}.replica-zone-key", kind, "source", "the second replica of a fleet",
                    "a per-replica key (the zones named with the replica's name)", CATCHES, apply, NEEDS)


def _failure_allowed(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    return replace(model, weak=replace(model.weak, shared_failure_allowed=True)), ""


def _unreleased(model: EnvoyModel, plan: Plan) -> tuple[EnvoyModel, str]:
    """No route's limiter descriptors release a slot when the stream ends (its settle kept)."""
    routes = tuple(replace(r, shared=tuple(a for a in r.shared if a.op != "release")) for r in model.routes)
    if routes == model.routes:
        raise NotApplicable("envoy.yaml releases no slot")
    return replace(model, routes=routes), ""


def _orphaned_slot(kind: str) -> Operator:
    def apply(directory: Path, plan: Plan) -> str:
        _shared(plan)
        assert plan.shared is not None
        if not any(z.startswith("conc:") for z in plan.shared.zones):
            raise NotApplicable("the plan has no shared concurrency zone")
        if kind == "nginx":
            nginx.render(directory, plan, nginx.switched(slots_kept=True))
        else:
            envoy.render(directory, plan, _unreleased)
        return "the second replica never releases a slot after the answer (its refunds still settled)"
    return Operator(f"{kind}.replica-orphaned-slot", kind, "remove", "the second replica of a fleet",
                    "one replica's slots never released (orphaned until its lease's owner dies)", FLEET,
                    apply, NEEDS)


def _failover_burst(kind: str) -> Operator:
    def apply(directory: Path, plan: Plan) -> str:
        _shared(plan)
        assert plan.shared is not None
        shared = plan.shared
        alone = replace(plan, shared=replace(shared, on_unavailable="local", local=dict(shared.zones),
                                             local_after_s={}))
        if kind == "nginx":   # on the limiter's first "store unavailable", not once it says "local"
            nginx.render(directory, alone, nginx.switched(failover_at_once=True))
        else:                 # the limiter's unavailable answer lets the request on to the shares
            envoy.render(directory, alone, _failure_allowed)
        return ("the second replica decides alone as soon as the store fails, at the policy's full "
                "values (a fresh full burst at the failover)")
    return Operator(f"{kind}.replica-failover-burst", kind, "loosen", "the second replica of a fleet",
                    "one replica's failover hands out a fresh full burst (full local values, no wait)",
                    FLEET, apply, NEEDS)


def _bucket_doubled(kind: str) -> Operator:
    def apply(directory: Path, plan: Plan) -> str:
        _shared(plan)
        zones = directory / ZONES_FILE
        doc = json.loads(zones.read_text(encoding="utf-8"))
        name = next((n for n, z in sorted(doc["zones"].items()) if z.get("kind") == "tokens"), None)
        if name is None:
            raise NotApplicable("the plan has no shared token zone")
        zone = doc["zones"][name]
        before = zone["burst"]
        zone["burst"] = 2 * before
        zones.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
        return f"the limiter's {name}: bucket {before} -> {2 * before} (the refill as planned)"
    return Operator(f"{kind}.limiter-bucket-two-minutes", kind, "raise", "a shared token zone",
                    "the shared token bucket holds twice its capacity (up to 2 C + N a minute)",
                    ("token-budget",), apply, NEEDS)


for _kind in ("envoy", "nginx"):
    register(_unshared(_kind))
    register(_zone_key(_kind))
    register(_orphaned_slot(_kind))
    register(_failover_burst(_kind))
    register(_bucket_doubled(_kind))
