"""Mutation operators of a fleet (policy shared:, ``verify --replicas N``): each weakens the
second replica's generated files, the way one replica deployed wrong would, and the probe spreading
its limit cases over the replicas (scanner.probe.fleet) must catch it: the fleet then admits more
than the policy in sum.

* ``replica-unshared``: the replica generated without the shared store: its own local limits at
  the policy's full value (as if deployed from a policy without ``shared:``);
* ``replica-zone-key``: the replica counts in zones of its own (every zone name with the
  replica's name appended, known to the limiter): per-replica keys on the shared store.

Both ``needs`` a fleet: single-proxy ``verify --mutate`` skips them (scanner.verify)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import scanner.mutate.envoy as envoy
import scanner.mutate.nginx as nginx
from scanner.generate.shared import ZONES_FILE
from scanner.mutate.core import NotApplicable, Operator, register
from scanner.plan.model import Plan

NEEDS = "fleet"
CATCHES = ("rate", "concurrency", "token-budget")
SUFFIX = ".replica2"
RENDER = {"envoy": envoy.render, "nginx": nginx.render}
# the files naming the limiter's zones, per proxy
ZONED = {"envoy": ("envoy.yaml",), "nginx": ("perimeter-http.conf",)}


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


def _zone_key(kind: str) -> Operator:
    def apply(directory: Path, plan: Plan) -> str:
        _shared(plan)
        assert plan.shared is not None
        names = sorted(plan.shared.zones.zones, key=len, reverse=True)
        pattern = re.compile("(" + "|".join(re.escape(n) for n in names) + r')(?=["\s])')
        for name in ZONED[kind]:
            path = directory / name
            text = path.read_text(encoding="utf-8")
            renamed = pattern.sub(lambda m: m.group(1) + SUFFIX, text)
            if renamed == text:
                raise NotApplicable(f"{name} names no zone of the limiter")
            path.write_text(renamed, encoding="utf-8")
        zones = directory / ZONES_FILE
        doc = json.loads(zones.read_text(encoding="utf-8"))
        doc["zones"].update({n + SUFFIX: z for n, z in doc["zones"].items()})
        zones.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
        return f"the second replica's zones named with the replica's name ({SUFFIX}): keys of its own"
    return Operator(f"{kind}.replica-zone-key", kind, "source", "the second replica of a fleet",
                    "a per-replica key (the zones named with the replica's name)", CATCHES, apply, NEEDS)


for _kind in ("envoy", "nginx"):
    register(_unshared(_kind))
    register(_zone_key(_kind))
