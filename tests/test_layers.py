"""The package's shape: no import cycle, and no module importing one of a later stage.

Stages, in the order data flows (a module may import its own stage and earlier ones):
the shared vocabularies, inventory, policy, plan (which owns the zone model, scanner.plan.zones), limiter (the
shared store's service: it reads the plan's zones from its zones file), generate, runtime, standin, probe, netscan,
evidence, audit, documents (the registry naming each document's model), mutate, verify (one proxy, mutation, fleet,
demo), report, cli.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "scanner"
BASE = ("errors", "canonical", "patterns", "reasons", "severity", "secrets", "net", "stop", "output", "resources",
        "state_changing", "witness_asgi", "store_url", "rules", "jsondoc")
STAGES = (*BASE, "inventory", "policy", "plan", "limiter", "generate", "runtime", "standin", "probe", "netscan",
          "evidence", "audit", "documents", "mutate", "verify", "report", "cli")


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        name = ".".join(f.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        out[name] = f
    return out


def _typing_only(tree: ast.Module) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:`` (never imported at run time)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}


def _graph(deferred: bool = False) -> dict[str, set[str]]:
    """Imports between scanner modules: module-level ones, and with ``deferred`` also those inside
    functions (every import that runs, ``if TYPE_CHECKING:`` aside)."""
    mods = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, f in mods.items():
        tree = ast.parse(f.read_text())
        skip = _typing_only(tree)
        for node in (n for n in ast.walk(tree) if id(n) not in skip) if deferred else tree.body:
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scanner"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def _stage(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    assert part in STAGES, f"{module}: add its stage to STAGES"
    return STAGES.index(part)


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    graph = _graph(deferred=True)
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1 and not cycle:
                cycle.extend([*path[path.index(m):], m])
            elif m not in state:
                visit(m, [*path, m])
        state[n] = 2

    for n in sorted(_modules()):
        if n not in state and n != "scanner":
            visit(n, [n])
    assert not cycle, " -> ".join(cycle)


def test_no_stage_imports_a_later_one() -> None:
    upward = [(a, b) for a, bs in _graph().items() if a != "scanner" for b in bs
              if b != "scanner" and _stage(b) > _stage(a) and _stage(b) >= len(BASE)]
    assert not upward, upward


MAX_NAMES_DEFINED_TWICE = 5


def _class_definitions() -> dict[str, list[str]]:
    """Every class name of scanner/ -> the modules defining a class of that name."""
    out: dict[str, list[str]] = defaultdict(list)
    for name, f in sorted(_modules().items()):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                out[node.name].append(name)
    return out


def test_one_name_per_concept() -> None:
    """A class name defined in two places names two things: at most a few, none today (issue 29)."""
    twice = {n: mods for n, mods in _class_definitions().items() if len(mods) > 1}
    assert len(twice) <= MAX_NAMES_DEFINED_TWICE, twice


def test_the_class_count_sees_every_definition() -> None:
    """The walk finds classes wherever they are defined (a module's top level, inside a function)."""
    found = _class_definitions()
    assert found["Decision"] == ["scanner.plan.model"]
    assert found["BaseCheck"] == ["scanner.probe.registry"]
    assert len(found) > 300
