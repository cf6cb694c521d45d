"""The stand-in's pre-handler validation table agrees with the real vLLM 0.29.0 app.

For every state-changing route in the table: a valid request reaches the real handler
(engine-less: 500, no state exists to change) and the stand-in counts it; the prober's
declared-method safe probe is rejected by both with a validation error, uncounted.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import httpx
import pytest

from scanner.probe.safe import declared_probe
from scanner.state_changing import PRE_HANDLER_VALIDATION, Param, validation_error

ROUTES = sorted(PRE_HANDLER_VALIDATION)


def _valid(params: tuple[Param, ...]) -> tuple[str, bytes]:
    query, body = {}, {}
    for p in params:
        value = {"enum": p.choices[0] if p.choices else "", "bool": "true", "str": "x", "int": 1}[p.type]
        if p.where == "query":
            query[p.name] = str(value)
        else:
            body[p.name] = value
    return urlencode(query), (json.dumps(body).encode() if any(p.where == "body" for p in params) else b"")


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_table_matches_real_app(real_vllm, method: str, path: str) -> None:  # type: ignore[no-untyped-def]
    params = PRE_HANDLER_VALIDATION[(method, path)]
    query, body = _valid(params)
    headers = {"Content-Type": "application/json"} if body else {}
    real = httpx.request(method, f"{real_vllm.url}{path}?{query}", content=body, headers=headers, timeout=10)
    assert real.status_code == 500, (path, real.status_code, real.text[:200])  # the handler ran
    assert validation_error(method, path, dict(httpx.QueryParams(query)), body) is None

    probe = declared_probe(method, path)
    assert probe is not None, f"the prober has no safe probe for {method} {path}"
    headers = {"Content-Type": probe.content_type} if probe.content_type else {}
    real = httpx.request(method, f"{real_vllm.url}{path}?{probe.query}", content=probe.body or b"",
                         headers=headers, timeout=10)
    assert real.status_code == 400 and "validation error" in real.text, (path, real.text[:200])
    assert validation_error(method, path, dict(httpx.QueryParams(probe.query)), probe.body or b"") is not None
