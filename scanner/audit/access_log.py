"""The perimeter's access log, read back: one JSON object per line, as the generated NGINX
(``log_format perimeter_json``, templates/nginx-http.conf.j2) and Envoy (``json_format``,
templates/envoy.yaml.j2) write them, read into one shape (:class:`Entry`).

Each line names the principal (never a key), the route, method and path, the status, the
latency, the request id, the proxy's decision and reason, and for an inspected body its admitted
envelope: ``model``, ``sequences``, the output budget per sequence and where it came from
(``sent`` by the client, ``written`` by the perimeter, ``default``: vLLM's own), the tokens charged
to a token budget, and the usage once an answer settles it (empty until then).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """One request as the perimeter logged it ("" / None: not known for it)."""

    proxy: str                    # "nginx" or "envoy"
    time: str
    principal: str
    route: str
    method: str
    path: str
    status: int
    latency_ms: float
    request_id: str
    decision: str                 # "allow", "deny", "error" or "" (Envoy: "" when vLLM answered)
    reason: str
    model: str = ""
    sequences: int | None = None
    output: int | None = None     # output budget per sequence
    output_from: str = ""         # sent, written, default
    tokens_charged: int | None = None
    usage: str = ""


def _text(value: object) -> str:
    return "" if value is None or value == "-" else str(value)


def _int(value: object) -> int | None:
    text = _text(value)
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


def entry(doc: Mapping[str, object]) -> Entry:
    """One parsed line: NGINX's (``latency_s``) or Envoy's (``latency_ms``) fields."""
    nginx = "latency_s" in doc
    latency = (float(_text(doc.get("latency_s")) or 0) * 1000 if nginx
               else float(_text(doc.get("latency_ms")) or 0))
    return Entry(
        proxy="nginx" if nginx else "envoy", time=_text(doc.get("time")),
        principal=_text(doc.get("principal")), route=_text(doc.get("route")),
        method=_text(doc.get("method")), path=_text(doc.get("path")),
        status=_int(doc.get("status")) or 0, latency_ms=round(latency, 3),
        request_id=_text(doc.get("request_id")), decision=_text(doc.get("decision")),
        reason=_text(doc.get("reason")), model=_text(doc.get("model")),
        sequences=_int(doc.get("sequences")), output=_int(doc.get("output")),
        output_from=_text(doc.get("output_from")), tokens_charged=_int(doc.get("tokens_charged")),
        usage=_text(doc.get("usage")))


def entries(lines: Iterable[str]) -> tuple[tuple[Entry, ...], int]:
    """The entries of ``lines`` and how many lines were not one JSON object (skipped)."""
    out: list[Entry] = []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(doc, dict):
            out.append(entry(doc))
        else:
            bad += 1
    return tuple(out), bad


def read(path: Path) -> tuple[tuple[Entry, ...], int]:
    """The entries of an access log file (UTF-8, undecodable bytes replaced)."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return entries(f)
