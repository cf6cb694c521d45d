"""Prometheus text-format metrics of an audit, with bounded labels only.

Label names are limited to :data:`LABELS`: the vLLM release, the first 8 hex digits of the
baseline plan's digest, a severity, and a drift kind. Never a path, a request id or a key.
"""

from __future__ import annotations

from collections.abc import Mapping

from scanner.audit.model import AuditReport
from scanner.severity import SEVERITIES

LABELS = frozenset({"release", "config_hash", "severity", "kind"})


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(base: Mapping[str, str], extra: Mapping[str, str] | None = None) -> str:
    items = {**base, **(extra or {})}
    assert set(items) <= LABELS, f"unbounded label names: {set(items) - LABELS}"
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items.items()) + "}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _family(name: str, help_text: str, kind: str, samples: list[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {_num(value)}" for labels, value in samples]
    return lines


def render(report: AuditReport) -> str:
    base = {"release": report.release, "config_hash": report.config_hash_short}
    counts = report.severity_counts()
    s = report.summary()
    lines: list[str] = []
    lines += _family("vllm_perimeter_findings", "Findings of the last audit (probe and netscan) by severity.",
                     "gauge", [(_labels(base, {"severity": sev}), counts.get(sev, 0)) for sev in SEVERITIES])
    lines += _family("vllm_perimeter_drift_routes_total", "Routes added or removed against the baseline "
                     "inventory.", "gauge",
                     [(_labels(base, {"kind": k}), s[f"routes_{k}"]) for k in ("added", "removed")])
    lines += _family("vllm_perimeter_config_drift", "Directive changes of the deployed NGINX config against "
                     "the baseline's (-1: not compared).", "gauge",
                     [(_labels(base), s["config_changes"] if s["config_changes"] is not None else -1)])
    lines += _family("vllm_perimeter_findings_changed", "Findings new or resolved against the baseline "
                     "probe result.", "gauge",
                     [(_labels(base, {"kind": "new"}), s["findings_new"]),
                      (_labels(base, {"kind": "resolved"}), s["findings_resolved"])])
    lines += _family("vllm_perimeter_outcome_changes", "Probe attempts whose outcome changed.", "gauge",
                     [(_labels(base), s["outcome_changes"])])
    lines += _family("vllm_perimeter_ports_new", "Open ports not open in the baseline netscan "
                     "(-1: not scanned).", "gauge",
                     [(_labels(base), s["ports_new"] if s["ports_new"] is not None else -1)])
    lines += _family("vllm_perimeter_drift", "1 when any drift was found.", "gauge",
                     [(_labels(base), 1 if report.drift else 0)])
    lines += _family("vllm_perimeter_target_up", "1 when the target answered the probe (and the "
                     "upstream the route sweep).", "gauge",
                     [(_labels(base), 0 if report.unreachable else 1)])
    lines += _family("vllm_perimeter_audit_timestamp_seconds", "When the audit ran (unix time).", "gauge",
                     [(_labels(base), round(report.started_at, 3))])
    return "\n".join(lines) + "\n"
