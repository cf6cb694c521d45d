"""Every document a user writes or a CI system reads, by name: the one model that states each
(``DOCUMENTS``). The JSON Schemas under ``schemas/`` are generated from these
(``vllm-perimeter schema NAME``; ``tests/test_documents.py`` keeps them current), every document
the tool writes is validated against its model in the tests, and documents the tool reads back
(inventories, probe results) are read through them (:mod:`scanner.jsondoc`), with the file and
field in the error.

The models are the concepts' own classes: the policy and principals files are the policy's
models (:mod:`scanner.policy.model`, read by :mod:`scanner.policy.load`, which keeps each
error's line number; their schemas, for editors and CI linters, as users write them); the
inventory is :mod:`scanner.inventory.model`'s; the rule program :mod:`scanner.rules`'. A document
that shows a model in its own shape (the plan with the cap paths it derived, a probe run with
its summary, ...) has its view class next to the model, which its writer builds and dumps.
"""

from __future__ import annotations

from typing import Any

from scanner import jsondoc
from scanner.audit.model import AuditReportDocument
from scanner.errors import ConfigError
from scanner.evidence.pack import Manifest
from scanner.inventory.model import Inventory
from scanner.netscan.model import ScanResultDocument
from scanner.plan.document import PlanView
from scanner.policy.model import Policy, PrincipalsFile
from scanner.probe.result import ProbeResultDocument
from scanner.rules import RuleProgram

# the model of each document
DOCUMENTS: dict[str, type[Any]] = {
    "policy": Policy,
    "principals": PrincipalsFile,
    "inventory": Inventory,
    "plan": PlanView,
    "probe-result": ProbeResultDocument,
    "netscan-result": ScanResultDocument,
    "audit-result": AuditReportDocument,
    "evidence-manifest": Manifest,
    "rule-program": RuleProgram,
}


def json_schema(name: str) -> dict[str, Any]:
    schema = jsondoc.adapter(DOCUMENTS[name]).json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://vllm-perimeter.invalid/schemas/{name}.schema.json"
    return schema


def validate(name: str, data: Any, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """``data`` validated as document ``name``; ``error`` naming ``source`` and the field."""
    return jsondoc.read(DOCUMENTS[name], data, source, name, error)
