"""Inventory of a live server from its ``/openapi.json``.

Only what the spec declares is listed: paths and their operations. FastAPI keeps
some routes out of its spec (``/docs``, ``/redoc``, ``/openapi.json`` itself,
mounts such as ``/metrics``, WebSocket routes such as ``/v1/realtime``), so an
OpenAPI inventory is a lower bound; ``inventory vllm`` is the complete one.
``guarded`` uses vLLM's default guarded prefixes.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from scanner.errors import InventoryError, TargetUnreachableError, UsageError
from scanner.inventory.model import VLLM_GUARDED_PREFIXES, Inventory, Route, Source, is_guarded
from scanner.secrets import redact_url, scrub, url_secrets

OPENAPI_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
ORIGIN = "openapi.paths"
MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class OpenApiFetch:
    """Where and how to fetch: a base URL (``/openapi.json`` is added) or the spec's URL."""

    url: str
    timeout: float = 10.0
    verify: bool = True
    ca_file: str | None = None
    max_bytes: int = MAX_BYTES

    @property
    def spec_url(self) -> str:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"{redact_url(self.url)} is not an http(s) URL")
        path = parts.path if parts.path not in ("", "/") else "/openapi.json"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))

    @property
    def shown_url(self) -> str:
        return redact_url(self.spec_url)

    def tls(self) -> ssl.SSLContext | bool:
        if self.ca_file:
            try:
                return ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(f"--ca-file {self.ca_file}: cannot load CA bundle: {exc}") from None
        return self.verify

    def inventory(self) -> Inventory:
        return fetch(self)


def fetch(spec: OpenApiFetch, transport: httpx.BaseTransport | None = None) -> Inventory:
    """GET the spec and turn it into an inventory (source kind ``openapi``)."""
    body = _get(spec, transport)
    return from_document(parse_json(body, spec.shown_url), spec.shown_url)


def _get(spec: OpenApiFetch, transport: httpx.BaseTransport | None) -> bytes:
    url, shown = spec.spec_url, spec.shown_url
    try:
        with httpx.Client(transport=transport, verify=spec.tls(), timeout=spec.timeout,
                          follow_redirects=True, max_redirects=5) as client, \
                client.stream("GET", url, headers={"Accept": "application/json"}) as resp:
            _check_status(resp, shown)
            return _read_capped(resp, shown, spec.max_bytes)
    except httpx.TimeoutException:
        raise TargetUnreachableError(f"{shown}: no answer within {spec.timeout:g}s") from None
    except httpx.TooManyRedirects:
        raise InventoryError(f"{shown}: too many redirects") from None
    except (httpx.TransportError, ssl.SSLError) as exc:
        raise TargetUnreachableError(f"{shown}: unreachable: {_reason(exc, url)}") from None
    except httpx.InvalidURL as exc:
        raise UsageError(f"{shown}: invalid URL: {_reason(exc, url)}") from None
    except httpx.HTTPError as exc:
        raise InventoryError(f"{shown}: bad answer: {_reason(exc, url)}") from None


def _check_status(resp: httpx.Response, shown: str) -> None:
    if resp.status_code == 200:
        return
    if resp.status_code >= 500:
        raise TargetUnreachableError(f"{shown}: server error HTTP {resp.status_code}")
    hint = " (vLLM serves none with --disable-fastapi-docs)" if resp.status_code == 404 else ""
    raise InventoryError(f"{shown}: answered HTTP {resp.status_code}, not an OpenAPI document{hint}")


def _read_capped(resp: httpx.Response, shown: str, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in resp.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise InventoryError(f"{shown}: answer larger than {limit} bytes; not an OpenAPI document")
        chunks.append(chunk)
    return b"".join(chunks)


def _reason(exc: BaseException, url: str) -> str:
    """One line saying why, without any secret the URL carried."""
    text = str(exc) or type(exc).__name__
    if "CERTIFICATE_VERIFY_FAILED" in text or isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate verification failed (use --ca-file, or --insecure to skip)"
    return scrub(text.splitlines()[0], url_secrets(url))


def parse_json(body: bytes, shown: str) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        start = body[:40].decode("utf-8", "replace").strip().replace("\n", " ")
        raise InventoryError(f"{shown}: answer is not JSON (starts with {start!r}); "
                             "not an OpenAPI document") from None


def from_document(doc: Any, target: str,
                  prefixes: tuple[str, ...] = VLLM_GUARDED_PREFIXES) -> Inventory:
    """The routes an OpenAPI 3.x (or Swagger 2.0) document declares."""
    paths = _paths(doc, target)
    routes = [r for path, item in sorted(paths.items()) if (r := _route(path, item, prefixes))]
    return Inventory(source=Source(kind="openapi", target=target), routes=tuple(routes))


def _paths(doc: Any, target: str) -> Mapping[str, Any]:
    if not isinstance(doc, dict) or not ("openapi" in doc or "swagger" in doc):
        raise InventoryError(f"{target}: JSON without an 'openapi' version field; "
                             "not an OpenAPI document")
    paths = doc.get("paths", {})
    if not isinstance(paths, dict) or not all(isinstance(k, str) for k in paths):
        raise InventoryError(f"{target}: OpenAPI 'paths' is not an object")
    return paths


def _route(path: str, item: Any, prefixes: tuple[str, ...]) -> Route | None:
    if not path.startswith("/") or not isinstance(item, dict):
        return None
    ops = {m: op for m, op in item.items() if m.lower() in OPENAPI_METHODS}
    if not ops:
        return None
    operation_ids = sorted({str(op["operationId"]) for op in ops.values()
                            if isinstance(op, dict) and op.get("operationId")})
    return Route(
        path=path,
        methods=tuple(sorted(m.upper() for m in ops)),
        kind="http",
        endpoint=",".join(operation_ids),
        guarded=is_guarded(path, prefixes),
        origin=ORIGIN,
    )
