"""What an answer means: which layer answered, and did the request get through."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote

from scanner.plan.model import DECISION_HEADER, REASON_HEADER
from scanner.probe.interface import Layer, Outcome
from scanner.reasons import UPSTREAM_ERROR

_MARKER = DECISION_HEADER.lower()
_REASON = REASON_HEADER.lower()


def classify(status: int, headers: Mapping[str, str]) -> tuple[Layer, Outcome, str, str]:
    """(layer, outcome, marker value, reason) for one answer; ``headers`` keys in lower case.

    The proxy answered when its marker header is present: ``reached`` when it says allow
    (never on a refusal), ``limited`` for a 429, ``error`` for its own 5xx, else ``denied``;
    but its error replacing an upstream 5xx (reason ``upstream-error``) is the upstream's answer,
    ``reached``. Otherwise the upstream did: vLLM's own 401 on its key-guarded prefixes is ``guarded``
    (not reached, but not the perimeter's doing either), 403 is a deny by the upstream, 404
    and a non-JSON 400 (the server refused the request line) mean there is nothing there.
    """
    marker = headers.get(_MARKER)
    if marker is not None:
        reason = headers.get(_REASON, "")
        if reason == UPSTREAM_ERROR and status >= 500:   # vLLM answered; the perimeter replaced its body
            return "upstream", "reached", marker, reason
        if marker.lower().startswith("allow") and status < 400:
            return "proxy", "reached", marker, reason
        if status == 429:
            return "proxy", "limited", marker, reason
        if status >= 500:
            return "proxy", "error", marker, reason
        return "proxy", "denied", marker, reason
    if status == 401 or status == 403:
        return "upstream", "guarded", "", ""
    if status == 404:
        return "upstream", "absent", "", ""
    if status == 400 and not _is_json(headers):
        return "upstream", "absent", "", ""
    return "upstream", "reached", "", ""


_GRPC_CODE = re.compile(r'"code":\s*"?(\d{3})\b')


def grpc_status(status: int, headers: Mapping[str, str]) -> int:
    """The HTTP status of a proxy's own reply that reached a gRPC client in gRPC's framing.

    Envoy answers a request with ``content-type: application/grpc`` locally as HTTP 200 with
    ``grpc-status`` and the reply body in ``grpc-message``; the perimeter's body says its code
    (``{"error":{"code":415,...}}``). Only a marked reply of the proxy is read so; anything
    else keeps its status."""
    if status != 200 or _MARKER not in headers or "grpc-status" not in headers:
        return status
    m = _GRPC_CODE.search(unquote(headers.get("grpc-message", "")))
    return int(m.group(1)) if m else status


def _is_json(headers: Mapping[str, str]) -> bool:
    return "json" in headers.get("content-type", "").lower()


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 8:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def error_reason(exc: BaseException) -> str:
    """A short, key-free reason for a failed request: timeout, connect-refused, tls: ..."""
    import ssl

    import h11
    import httpx

    chain = _chain(exc)
    text = " | ".join(str(e) for e in chain)
    if any(isinstance(e, httpx.TimeoutException | TimeoutError) for e in chain):
        return "timeout"
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) or "CERTIFICATE_VERIFY_FAILED" in text:
        return "tls: certificate verify failed"
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return f"tls: {text[:120]}"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "refused" in text.lower():
        return "connect-refused"
    if any(isinstance(e, httpx.RemoteProtocolError | ConnectionResetError | httpx.ReadError) for e in chain):
        return "protocol: connection closed without an answer"
    if any(isinstance(e, h11.ProtocolError) for e in chain):
        return f"protocol: not a valid HTTP/1.1 answer ({text[:100]})"
    if any(isinstance(e, httpx.ConnectError | OSError) for e in chain):
        return f"connect-error: {text[:120]}"
    return f"{type(exc).__name__}: {text[:120]}"
