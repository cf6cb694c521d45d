"""The prober's side of the upstream witness (the stand-in's, or the one inside vLLM; the protocol
of both: ``scanner/witness_asgi.py``): fetch what reached the upstream for this run, and what that
changes in each attempt's verdict.

With a witness, every request carries ``vp_probe=<run>-<n>`` in its query. A request the
plan denies that the witness saw was let through, whatever the answer looked like; an
allowed request answered by an upstream that has no record of it was sent somewhere else
or lost its probe id on the way: neither is proven.
"""

from __future__ import annotations

import hmac
from dataclasses import replace

import httpx

from scanner import witness_asgi
from scanner.plan.model import (
    DECISION_HEADER,
    PRINCIPAL_HEADER,
    REASON_HEADER,
    SPOOFABLE_HEADERS,
    VLLM_REQUEST_HEADERS,
)
from scanner.probe.cases import Case
from scanner.probe.interface import Attempt, WitnessRecord

# Hop-by-hop headers (RFC 9110 7.6.1) and upgrade requests: never forwarded as the client sent them.
HOP_BY_HOP: tuple[str, ...] = ("Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization",
                               "TE", "Trailer", "Upgrade", "HTTP2-Settings")
# A header the prober names in Connection: a proxy must drop it.
CONNECTION_NAMED = "X-Vp-Hop"
# Headers whose upstream copy the prober keeps (the rest of what the witness saw is dropped).
# Headers the client may spell with underscores for dashes: servers that map both spellings to
# one name (CGI, WSGI and the frameworks on them) read the client's value as the proxy's own.
UNDERSCORED: tuple[str, ...] = tuple(h.replace("-", "_") for h in (*SPOOFABLE_HEADERS, *VLLM_REQUEST_HEADERS)
                                     if "-" in h)
WATCHED: frozenset[str] = frozenset(
    h.lower() for h in (*SPOOFABLE_HEADERS, *HOP_BY_HOP, *VLLM_REQUEST_HEADERS, *UNDERSCORED,
                        CONNECTION_NAMED, "Authorization", "Host", DECISION_HEADER, REASON_HEADER,
                        PRINCIPAL_HEADER))


class WitnessError(Exception):
    """The witness could not be read."""


async def fetch(base_url: str, prefix: str, timeout: float, exact: bool = False,
                secret: str = "") -> dict[str, WitnessRecord]:
    """probe id -> what the upstream saw, for the requests whose id starts with ``prefix`` (a
    run: ``"<run>-"``), or (``exact``) for the one request of that id. With ``secret``: from the
    witness inside vLLM (scanner/witness_asgi.py), a read MAC'd with it whose answer must carry
    the seal of this read (else nothing it says is taken)."""
    if secret:
        key = secret.encode()
        params = witness_asgi.read_params(key, prefix, exact)
        url = base_url.rstrip("/") + witness_asgi.READ_PATH
    else:
        params = {"id" if exact else "prefix": prefix}
        url = base_url.rstrip("/") + witness_asgi.STANDIN_READ_PATH
    async with httpx.AsyncClient(timeout=max(timeout, 10.0), trust_env=False) as client:
        try:
            resp = await client.get(url, params=params)
            if secret and resp.status_code == 404:
                raise WitnessError(f"witness {base_url}: no witness answered at {witness_asgi.READ_PATH} "
                                   "(is vLLM started with --middleware vllm_perimeter_witness.Witness and "
                                   "this secret?)")
            resp.raise_for_status()
            if secret and not hmac.compare_digest(
                    resp.headers.get(witness_asgi.SEAL_HEADER, ""),
                    witness_asgi.seal(key, params["nonce"], resp.content)):
                raise WitnessError(f"witness {base_url}: its records are not sealed with the witness "
                                   "secret: not taken")
            records = resp.json()["records"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise WitnessError(f"witness {base_url}: cannot read its records: {exc}") from None
    out: dict[str, WitnessRecord] = {}
    for r in records:
        if prefix and not str(r["id"]).startswith(prefix):
            continue
        out[str(r["id"])] = WitnessRecord(
            method=str(r["method"]), path=str(r["path"]), query=str(r.get("query", "")),
            headers=tuple((str(k), str(v)) for k, v in r.get("headers", ()) if str(k) in WATCHED),
            body_bytes=int(r.get("body_bytes", 0)), body_sha256=str(r.get("body_sha256", "")),
            body=r.get("body"), outline=r.get("outline") if isinstance(r.get("outline"), dict) else None,
            held_ms=float(r.get("held_ms", 0.0)), arrivals=int(r.get("arrivals", 1)))
    return out


def seen_verdict(case: Case, a: Attempt, seen: WitnessRecord | None) -> Attempt:
    """``a`` with what the witness saw, and the verdict that follows from it (also for a
    request that got no answer: what reached the upstream is known all the same). A gRPC call
    goes to the gRPC listener, which the (HTTP) witness does not see: as answered."""
    if a.outcome == "skipped" or case.grpc_port:
        return a
    if seen is not None:
        a = replace(a, upstream=seen)
    if case.expected == "deny" and seen is not None:
        outcome = "reached" if a.layer == "proxy" else a.outcome   # the proxy's answer hid it
        return replace(a, verdict="failed", outcome=outcome,
                       why=f"the upstream received it (witness); the answer was {a.status}")
    if case.expected == "allow" and seen is None and a.layer == "upstream":
        return replace(a, verdict="failed",
                       why="answered without the proxy's marker, but the upstream witness has no record "
                           "of it: the probe id was dropped or another server answered")
    return a
