"""Mutation operators for generated configs: the prober proves its own sensitivity.

Each operator is a realistic weakening someone could make by hand, or a generator bug could
cause, of one place of a freshly generated NGINX or Envoy config. Operators come in families
(:data:`FAMILIES`: remove, raise, widen, add, move, switch, source, loosen, expose, forward)
and are generated per family and per target from the generator's model:

* most are a copy of the plan with one decision weakened (a limit removed or raised x10 / x100 /
  x1000, a network widened, a role or a method added, a field moved from deny to allow),
  rendered by the proxy's own generator: the proxy then enforces a plan the probe does not
  expect (:mod:`scanner.mutate.core`);
* the rest change one marked place of the generator's model (a location's regex, a zone's key,
  a rate filter's buckets, a cluster's thresholds) or set a switch of its weakening (dry run, a
  header's source) where the plan has no word for the weakening.

An operator both proxies have is defined once (:data:`scanner.mutate.core.DEFINITIONS`) and
registered for each; :mod:`scanner.mutate.nginx` and :mod:`scanner.mutate.envoy` say how they apply
its switch to their model, and add the operators only they have.

Each operator carries the checks that must catch it (``catches``: the first leads its run) and,
when it needs a policy setting a plan may lack, ``needs`` (it raises :class:`NotApplicable`
saying why on a plan without it). ``verify --mutate`` runs the real proxy on each mutant and the
probe against it: a mutant is caught when the probe exits non-zero with its default flags.

    for op in operators("nginx"):
        what = op.apply(directory, plan)    # edits the files; raises NotApplicable
"""

from __future__ import annotations

from collections.abc import Iterator

from scanner.mutate import envoy, fleet, nginx
from scanner.mutate.core import FAMILIES, OPERATORS, NotApplicable, Operator, operators

__all__ = ["FAMILIES", "OPERATORS", "NotApplicable", "Operator", "envoy", "families", "fleet", "kinds",
           "nginx", "operators"]


def kinds() -> Iterator[str]:
    yield from sorted({op.kind for op in OPERATORS.values()})


def families(kind: str) -> dict[str, tuple[Operator, ...]]:
    """The operators of ``kind`` per family, in FAMILIES order."""
    ops = operators(kind)
    return {f: tuple(op for op in ops if op.family == f) for f in FAMILIES}
