"""The key lookup loosened, as mutation operators (scanner.mutate.core: key-digest-accepted,
key-prefix-compared, family loosen): each is listed for both proxies with the near-miss check as
the one that must catch it, changes only the key check of each runtime (njs keyHash, the Lua
runtime's M.key_hash, Envoy's PRINCIPALS lookup), and is caught by near-miss on every proxy."""

from __future__ import annotations

import difflib
from dataclasses import replace
from pathlib import Path

import pytest

from scanner import mutate
from scanner.inventory.catalog import load_ref
from scanner.plan.inputs import load_policy
from scanner.probe import registry
from scanner.probe.interface import ProbeOptions
from scanner.verify import loop, mutation
from tests.verify.installed import installed

CATALOG = "vllm-0.29.0-default"
NAMES = ("key-digest-accepted", "key-prefix-compared")
KEY_LEN = 46   # "vp_" + 43 characters: every key verify makes
# the near-miss check alone: the baseline and each mutant take seconds (the full probe caught each
# as well, its first finding near-miss's: docs/benchmarks.md)
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("near-miss",))


def test_the_operators_are_listed_in_loosen_for_both_proxies_caught_by_near_miss() -> None:
    assert "near-miss" in registry.ids()
    for kind in ("nginx", "envoy"):
        ops = {op.name: op for op in mutate.families(kind)["loosen"]}
        for name in NAMES:
            op = ops[name]
            assert op.id == f"{kind}.{name}" and op.catches == ("near-miss",) and not op.needs
            assert mutate.OPERATORS[op.id] is op
    assert [op.name for op in mutation.selected(mutate.operators("envoy"), list(reversed(NAMES)))] == \
        list(reversed(NAMES))


# what each operator adds to each runtime's key check (the lines of the rendered file, stripped)
ADDED = {
    ("nginx", "key-digest-accepted"): {"perimeter.js": ["if (/^[0-9a-fA-F]{64}$/.test(key)) {",
                                                        "return key.toLowerCase();", "}"]},
    ("nginx", "key-prefix-compared"): {"perimeter.js": [
        f"return key ? crypto.createHash('sha256').update(key.slice(0, {KEY_LEN})).digest('hex') : '';"]},
    ("nginx-lua", "key-digest-accepted"): {
        "perimeter.js": ["if (/^[0-9a-fA-F]{64}$/.test(key)) {", "return key.toLowerCase();", "}"],
        "perimeter.lua": ['if bearer ~= nil and #bearer == 64 and match(bearer, "^%x+$") then',
                          "return lower(bearer)", "end"]},
    ("nginx-lua", "key-prefix-compared"): {
        "perimeter.js": [f"return key ? crypto.createHash('sha256').update(key.slice(0, {KEY_LEN}))"
                         ".digest('hex') : '';"],
        "perimeter.lua": [f'return (bearer == nil or bearer == "") and "" or key_hash(sub(bearer, 1, {KEY_LEN}))']},
    ("envoy", "key-digest-accepted"): {"envoy.yaml": [
        'found = PRINCIPALS[sha256_hex(key)] or (#key == 64 and match(key, "^%x+$") and PRINCIPALS[lower(key)])'
        " or false"]},
    ("envoy", "key-prefix-compared"): {"envoy.yaml": [f"key = key:sub(1, {KEY_LEN})"]},
}

# the lines each replaces (the others only add)
JS_HASH = "return key ? crypto.createHash('sha256').update(key).digest('hex') : '';"
REMOVED = {
    ("nginx", "key-prefix-compared"): {"perimeter.js": [JS_HASH]},
    ("nginx-lua", "key-prefix-compared"): {
        "perimeter.js": [JS_HASH],
        "perimeter.lua": ['return (bearer == nil or bearer == "") and "" or key_hash(bearer)']},
    ("envoy", "key-digest-accepted"): {"envoy.yaml": ["found = PRINCIPALS[sha256_hex(key)] or false"]},
}


def _texts(directory: Path) -> dict[str, str]:
    return {f.name: f.read_text(encoding="utf-8") for f in sorted(directory.iterdir()) if f.is_file()}


@pytest.mark.parametrize("name", ["nginx", "nginx-lua", "envoy"])
@pytest.mark.parametrize("op_name", NAMES)
def test_each_operator_changes_only_the_key_check(name: str, op_name: str, tmp_path: Path) -> None:
    proxy = installed(name)
    s = loop.setup(load_ref(CATALOG), load_policy(None), tmp_path, 9)
    files = proxy.write(s.plan, tmp_path / "generated")
    before = _texts(files)
    what = mutate.OPERATORS[f"{proxy.kind}.{op_name}"].apply(files, s.plan)
    assert what.startswith("(every auth: key route) ")
    after = _texts(files)
    assert set(after) == set(before)
    added, removed = {}, {}
    for f in before:
        diff = list(difflib.unified_diff(before[f].splitlines(), after[f].splitlines(), n=0, lineterm=""))
        plus = [line[1:].strip() for line in diff[2:] if line.startswith("+")]
        minus = [line[1:].strip() for line in diff[2:] if line.startswith("-")]
        if plus:
            added[f] = plus
        if minus:
            removed[f] = minus
    assert added == ADDED[(name, op_name)], added
    assert removed == REMOVED.get((name, op_name), {}), removed


@pytest.mark.parametrize("name", ["nginx", "nginx-debian", "nginx-lua", "envoy"])
def test_each_operator_is_caught_by_near_miss(name: str) -> None:
    proxy = installed(name)
    runs, mutants = mutation.mutants(load_ref(CATALOG), load_policy(None), [proxy], OPTIONS, only=NAMES)
    base = runs[0].result
    assert not base.deviations and not base.unreachable and base.exit_code() == 0, \
        [f.title for f in base.findings] or base.reason
    assert {c.status for c in base.coverage if c.check == "near-miss"} == {"proved"}
    assert [m.operator for m in mutants] == [f"{proxy.kind}.{n}" for n in NAMES]
    for m in mutants:
        assert m.status == "caught" and m.expected, (m.operator, m.status, m.what, m.rules)
        assert m.checks == ("near-miss",) and "VP001" in m.rules, (m.operator, m.checks, m.rules)


def test_a_mutant_run_leads_with_near_miss() -> None:
    for kind in ("nginx", "envoy"):
        for name in NAMES:
            fast = mutation.mutant_options(replace(OPTIONS, checks=()), f"{kind}.{name}")
            assert fast.lead_check == "near-miss" and fast.stop_on_failure
