"""Probe result as JSON (the document ``probe merge`` reads back)."""

from __future__ import annotations

from scanner.probe.interface import ProbeResult
from scanner.probe.result import to_json


def render(result: ProbeResult) -> str:
    return to_json(result)
