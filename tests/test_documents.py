"""The published JSON Schemas are current, and every document the tool writes holds to its model."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

from scanner import documents
from scanner.cli.schema import schema_text
from scanner.errors import ConfigError
from scanner.inventory import catalog
from scanner.plan.inputs import make_plan
from scanner.probe import result as probe_result
from tests.probe import helpers as h

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(documents.DOCUMENTS))
def test_published_schema_is_current(name: str) -> None:
    published = REPO / "schemas" / f"{name}.schema.json"
    assert published.exists(), f"run: vllm-perimeter schema {name} -o schemas/{name}.schema.json"
    assert published.read_text() == schema_text(name), f"schemas/{name}.schema.json is stale"


def test_every_bundled_catalog_is_an_inventory() -> None:
    for name in catalog.names():
        doc = json.loads((catalog.catalog_dir() / f"{name}.json").read_text())
        documents.validate("inventory", doc, name)


def test_plan_and_probe_result_hold_to_their_models() -> None:
    plan = make_plan("vllm-0.29.0-everything", None)
    documents.validate("plan", json.loads(plan.to_json()), "plan")
    res = h.run(h.open_upstream(h.plan()), "user", "operator")
    documents.validate("probe-result", probe_result.to_dict(res), "probe")
    assert probe_result.from_dict(json.loads(probe_result.to_json(res))) == res


def test_bundled_policy_and_the_loader_agree() -> None:
    from scanner.policy.load import load

    path = REPO / "policies" / "vllm-default.yaml"
    documents.validate("policy", yaml.safe_load(path.read_text()), str(path))
    load(path)
    # what the loader refuses, the schema refuses too
    for bad in ({"schema_version": 2}, {"name": ""}, {"body": {"cache_salt": "keep"}},
                {"routes": [{"path": "v1", "audience": "x"}]}, {"colour": "red"}):
        doc = {**yaml.safe_load(path.read_text()), **bad}
        with pytest.raises(ConfigError):
            documents.validate("policy", doc, "p.yaml")


def test_errors_name_the_file_and_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^r.json: invalid probe-result: findings\[0\].severity: Input should be"):
        documents.validate("probe-result", {
            "schema_version": 1, "target": "t", "plan_digest": "d", "policy": "p", "vantages": [],
            "credentials": [], "elapsed_s": 0.0, "unreachable": False, "attempts": [],
            "findings": [{"id": "x", "rule": "VP001", "severity": "urgent", "title": "", "method": "", "path": "",
                          "vantage": "", "detail": "", "remediation": ""}]}, "r.json")


ATTEMPT = {"check": "auth", "method": "GET", "path": "/v1/models", "request_line": "GET /v1/models HTTP/1.1",
           "credential": "user", "fingerprint": "", "vantage": "default", "expected": "allow", "status": 200}


@pytest.mark.parametrize(("change", "field"), [
    ({"unreachable": "yes"}, "unreachable"),                 # a "yes" is no boolean
    ({"elapsed_s": "1.5"}, "elapsed_s"),                     # a string is no number
    ({"schema_version": True}, "schema_version"),            # true is no 1
    ({"attempts": [{**ATTEMPT, "status": "200"}]}, r"attempts\[0\].status"),
    ({"attempts": [{**ATTEMPT, "tries": 1.0}]}, r"attempts\[0\].tries"),
    ({"credentials": [{"label": "user", "fingerprint": 7}]}, r"credentials\[0\].fingerprint"),
])
def test_a_probe_result_read_back_is_strict(change: dict[str, object], field: str) -> None:
    """A probe result is read back as written: a value of another JSON type is refused, with its field."""
    good = {"schema_version": 1, "target": "t", "plan_digest": "d", "policy": "p", "vantages": [],
            "credentials": [], "elapsed_s": 0.5, "unreachable": False, "findings": [], "attempts": [ATTEMPT]}
    assert probe_result.from_dict(good, "r.json").attempts[0].status == 200
    with pytest.raises(ConfigError, match=rf"^r.json: invalid probe-result: {field}: "):
        probe_result.from_dict({**good, **change}, "r.json")


def test_schema_cli_lists_and_prints(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from scanner.cli.main import cli

    res = CliRunner().invoke(cli, ["schema"], standalone_mode=False)
    assert "probe-result" in res.output and "policy" in res.output
    out = tmp_path / "p.json"
    res = CliRunner().invoke(cli, ["schema", "policy", "-o", str(out)], standalone_mode=False)
    assert res.exception is None
    assert json.loads(out.read_text())["title"] == "Policy"


def test_the_design_notes_name_every_check_and_every_package() -> None:
    """docs/design.md is written from the code: every registered check, every package or
    top-level module of scanner/ and every seam (a Protocol) is named there."""
    import scanner.probe.checks  # noqa: F401  (registers the checks)
    from scanner.probe import registry

    repo = Path(__file__).resolve().parent.parent
    text = (repo / "docs" / "design.md").read_text(encoding="utf-8")
    missing = [c for c in registry.ids() if f"`{c}`" not in text]
    assert not missing, missing
    parts = sorted({p.name.removesuffix(".py") for p in (repo / "scanner").iterdir()
                    if (p.is_dir() and (p / "__init__.py").exists())
                    or (p.suffix == ".py" and p.name != "__init__.py")})
    unnamed = [p for p in parts if f"`{p}`" not in text and f"`{p}/`" not in text]
    assert not unnamed, unnamed
    # every seam (a typing.Protocol of scanner/) is in the seams table
    seams = sorted(n.name for f in (repo / "scanner").rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
                   if isinstance(n, ast.ClassDef) and any(ast.unparse(b) == "Protocol" for b in n.bases))
    unlisted = [s for s in seams if not re.search(rf"`scanner\.[a-z_.]+\.{s}`", text)]
    assert seams and not unlisted, (seams, unlisted)
