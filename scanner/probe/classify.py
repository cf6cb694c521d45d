"""What an answer means: which layer answered, and did the request get through."""

from __future__ import annotations

from collections.abc import Mapping

from scanner.plan.model import DECISION_HEADER
from scanner.probe.interface import Layer, Outcome

_PROXY_LIMIT = (413, 429)


def layer_of(headers: Mapping[str, str]) -> Layer:
    """The proxy answered if its marker header is present; otherwise the upstream did."""
    return "proxy" if _marker(headers) is not None else "upstream"


def _marker(headers: Mapping[str, str]) -> str | None:
    for k, v in headers.items():
        if k.lower() == DECISION_HEADER.lower():
            return v
    return None


def classify(status: int, headers: Mapping[str, str]) -> tuple[Layer, Outcome, str]:
    """(layer, outcome, marker value) for one answer.

    Reachable means the upstream answered (no marker) with anything but a deny: vLLM's
    own 401 on its key-guarded prefixes is ``guarded`` (not reached, but not the
    perimeter's doing either), 403 is a deny by the upstream, 404 and a non-JSON 400
    (the server refused the request line) mean there is nothing there.
    """
    marker = _marker(headers)
    if marker is not None:
        if marker.lower().startswith("allow") and status < 400:
            return "proxy", "reached", marker
        if status in _PROXY_LIMIT:
            return "proxy", "limited", marker
        return "proxy", "denied", marker
    if status == 401 or status == 403:
        return "upstream", "guarded", ""
    if status == 404:
        return "upstream", "absent", ""
    if status == 400 and not _is_json(headers):
        return "upstream", "absent", ""
    return "upstream", "reached", ""


def _is_json(headers: Mapping[str, str]) -> bool:
    for k, v in headers.items():
        if k.lower() == "content-type":
            return "json" in v.lower()
    return False


def error_reason(exc: BaseException) -> str:
    """A short, key-free reason for a failed request: timeout, connect-refused, tls: ..."""
    import ssl

    import httpx

    text = str(exc)
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "timeout"
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        return "tls: certificate verify failed"
    if isinstance(exc, ssl.SSLError) or "SSL" in text or "TLS" in text:
        return f"tls: {text[:120]}"
    if isinstance(exc, ConnectionRefusedError) or "refused" in text.lower():
        return "connect-refused"
    if isinstance(exc, httpx.ConnectError | OSError):
        return f"connect-error: {text[:120]}"
    if isinstance(exc, httpx.RemoteProtocolError | ConnectionResetError):
        return "protocol: connection closed"
    return f"{type(exc).__name__}: {text[:120]}"
