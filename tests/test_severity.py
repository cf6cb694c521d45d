"""The exit-code contract: 0 the plan holds, 1 a deviation (or, with --require-proof, a subject
not proven), 3 unreachable or partial; `probe merge` applies the same rule as `probe`."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.cli.main import main
from scanner.probe import result
from scanner.probe.findings import RULES
from scanner.probe.interface import Finding, ProbeResult
from scanner.severity import fails


def _finding(rule: str) -> Finding:
    r = RULES[rule]
    return Finding(f"{rule}-x", rule, r.severity, r.title, "GET", "/x", "default", "detail", r.remediation)


def _result(*rules: str, unreachable: bool = False) -> ProbeResult:
    return ProbeResult("http://127.0.0.1:1", "sha256:0", "p", ("default",), (), (),
                       tuple(_finding(r) for r in rules), 0.1, unreachable)


@pytest.mark.parametrize("rule", sorted(set(RULES) - {"VP011"}))
def test_every_deviation_fails_with_default_flags(rule: str) -> None:
    assert _result(rule).exit_code() == 1


def test_not_proven_fails_only_when_proof_is_required() -> None:
    r = _result("VP011")
    assert r.exit_code() == 0
    assert r.exit_code(require_proof=True) == 1
    assert _result().exit_code(require_proof=True) == 0


def test_a_higher_fail_on_loosens_and_unreachable_wins() -> None:
    assert _result("VP009").exit_code("high") == 0          # low: only by choice
    assert _result("VP005").exit_code("high") == 1          # a limit above the plan is high
    assert _result("VP015").exit_code("high") == 1          # a body other than the plan's upstream
    assert _result(unreachable=True).exit_code() == 3
    assert fails([("VP011", "medium"), ("VP009", "low")], "medium") is False


@pytest.mark.parametrize(("rules", "flags", "code"), [
    (("VP008",), [], 1),
    (("VP011",), [], 0),
    (("VP011",), ["--require-proof"], 1),
    (("VP008",), ["--fail-on", "high"], 0),
    ((), ["--require-proof"], 0),
])
def test_probe_merge_exits_by_the_same_rule(tmp_path: Path, rules: tuple[str, ...], flags: list[str],
                                            code: int) -> None:
    f = tmp_path / "r.json"
    f.write_text(result.to_json(_result(*rules)), encoding="utf-8")
    with pytest.raises(SystemExit) as ended:
        main(["probe", "merge", str(f), "--format", "json", "-o", str(tmp_path / "out.json"), *flags])
    assert ended.value.code == code
