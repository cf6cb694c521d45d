"""The probe writers by format name: each turns a :class:`ProbeResult` into text."""

from __future__ import annotations

from collections.abc import Callable

from scanner.probe.interface import ProbeResult
from scanner.report import html, probe_json, probe_junit, probe_markdown, probe_sarif, probe_table

WRITERS: dict[str, Callable[[ProbeResult], str]] = {
    "table": probe_table.render,
    "json": probe_json.render,
    "sarif": probe_sarif.render,
    "junit": probe_junit.render,
    "markdown": probe_markdown.render,
    "html": html.render,
}
FORMATS: tuple[str, ...] = tuple(WRITERS)


def render(result: ProbeResult, fmt: str) -> str:
    return WRITERS[fmt](result)
