"""Run a corpus of bodies through one real proxy generated from a plan, in front of the stand-in
and its witness: one proxy start, the requests sent back to back over one keep-alive connection,
then every record the witness kept (what reached the upstream) fetched at once."""

from __future__ import annotations

import base64
import decimal
import hashlib
import http.client
import json
import math
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from scanner.inventory.model import Inventory
from scanner.net import free_port
from scanner.plan.body import Judgement, violations
from scanner.plan.model import REASON_HEADER, Decision
from scanner.plan.vllm_json import loads, reads_json
from scanner.policy.model import Policy
from scanner.policy.salt import salt as salt_of
from scanner.probe.interface import Credential
from scanner.reasons import STATUS, parse
from scanner.runtime.proxy import Proxy
from scanner.standin.serve import StandinThread
from scanner.verify import loop

ORACLE = Path(__file__).with_name("vllm_oracle.py")
PREFIX = "corpus-"


@dataclass(frozen=True)
class Case:
    """One body sent to one route (POST), by a principal of ``role``."""

    id: str
    path: str
    raw: bytes
    content_type: str | None = "application/json"
    role: str = "user"
    note: str = ""


@dataclass(frozen=True)
class Seen:
    """What one proxy did with a case: its status and reason header, and the bytes that reached
    the upstream (None: nothing did; b"" unknown text, see ``sha256``)."""

    status: int
    reason: str
    forwarded: bytes | None

    @property
    def refused(self) -> bool:
        return self.forwarded is None


def unlimited(policy: Policy) -> Policy:
    """``policy`` without rate and concurrency limits (the corpus is about bodies, sent back to
    back); every body rule stays as it is."""
    def free(limits):  # type: ignore[no-untyped-def]
        return limits and replace(limits, rate=None, concurrency=None)
    return replace(policy, audiences={n: replace(a, limits=free(a.limits)) for n, a in policy.audiences.items()},
                   rules=tuple(replace(r, limits=free(r.limits)) for r in policy.rules))


@dataclass
class Stand:
    """The plan, credentials and vantage of one corpus run."""

    setup: loop.Setup
    directory: Path
    port: int

    def credential(self, role: str) -> Credential:
        return next(c for c in self.setup.credentials if c.kind == "role" and c.role == role)

    def source(self, network: str = "public") -> str:
        return next(v.address for v in self.setup.vantages if v.name == network and v.address)

    def salt(self, role: str, path: str) -> str:
        d = self.setup.plan.decision("POST", path)
        if d is None or not d.salt or not self.setup.salt_secret:
            return ""
        principal = next(p.name for p in self.setup.plan.principals if p.role == role)
        return salt_of(self.setup.salt_secret.encode(), d.salt_subject(principal))


def stand(inventory: Inventory, policy: Policy, directory: Path) -> Stand:
    port = free_port()
    return Stand(loop.setup(inventory, unlimited(policy), directory, port), directory, port)


def _send(conn: http.client.HTTPConnection, s: Stand, case: Case) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {s.credential(case.role).secret}", "Content-Length": str(len(case.raw))}
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    conn.request("POST", f"{case.path}?vp_probe={PREFIX}{case.id}", body=case.raw, headers=headers)
    resp = conn.getresponse()
    resp.read()
    return resp.status, resp.getheader(REASON_HEADER, "") or ""


def run(s: Stand, inventory: Inventory, proxy: Proxy, cases: Sequence[Case]) -> dict[str, Seen]:
    """Each case sent through ``proxy`` (one start): what it answered and what reached vLLM."""
    directory = s.directory / proxy.name
    proxy.write(s.setup.plan, directory)
    answers: dict[str, tuple[int, str]] = {}
    with ExitStack() as stack:
        standin = stack.enter_context(StandinThread(inventory, "127.0.0.1", s.port))
        loop.start_checked(proxy, s.setup.plan, directory, stack)
        port = s.setup.plan.listen.port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(s.source(), 0))
        for case in cases:
            for attempt in range(3):
                try:
                    answers[case.id] = _send(conn, s, case)
                    break
                except (http.client.HTTPException, OSError):
                    conn.close()
                    time.sleep(0.05 * (attempt + 1))
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                                      source_address=(s.source(), 0))
        conn.close()
        with urllib.request.urlopen(f"{standin.url}/__standin__/witness?prefix={PREFIX}", timeout=30) as r:
            records = {rec["id"][len(PREFIX):]: rec for rec in json.load(r)["records"]}
    out = {}
    for case in cases:
        status, reason = answers.get(case.id, (0, "not-answered"))
        rec = records.get(case.id)
        forwarded: bytes | None = None
        if rec is not None:
            if rec["body_sha256"] == hashlib.sha256(case.raw).hexdigest():
                forwarded = case.raw
            elif rec.get("body") is not None:
                forwarded = rec["body"].encode("utf-8")
            elif rec.get("outline") is None and rec["body_bytes"] <= 65536:
                forwarded = b""      # no JSON object to Python's json (the witness's reading)
            else:
                raise AssertionError(f"{case.id}: the witness kept no text of a large body")
        out[case.id] = Seen(status, reason, forwarded)
    return out


def vllm_reads(python: str, items: Sequence[tuple[str, str, str | None, bytes, Sequence[str]]]) -> dict[str, dict]:
    """vLLM's own reading of each (id, path, content type, body, fields) (tests/differential/
    vllm_oracle.py in its venv, one process for all)."""
    lines = "".join(json.dumps({"id": i, "path": p, "content_type": ct, "fields": list(f),
                                "body": base64.b64encode(b).decode()}) + "\n" for i, p, ct, b, f in items)
    done = subprocess.run([python, str(ORACLE)], input=lines, capture_output=True, text=True, timeout=300,
                          check=False, env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise RuntimeError(f"vllm oracle failed: {done.stderr[-2000:]}")
    rows = (json.loads(ln[7:]) for ln in done.stdout.splitlines() if ln.startswith("ORACLE "))
    return {row["id"]: row for row in rows}


def admitted_more(d: Decision, content_type: str | None, forwarded: bytes | None, vllm: dict | None,
                  salt: str = "") -> list[str]:
    """How what reached the upstream goes beyond the plan, read as vLLM reads it: the plan's
    rules on the document (scanner.plan.body.violations) and vLLM's own model (``vllm``: its
    reading from vllm_oracle.py) holding a capped field over its cap or no output budget."""
    if forwarded is None or not reads_json(content_type):
        return []
    if forwarded == b"":   # the witness could not read a JSON object in it (<= 64 KiB): nor can vLLM
        return []
    try:
        doc = loads(forwarded)
    except (ValueError, RecursionError):
        return []
    out = list(violations(d, doc, salt))
    if vllm and vllm.get("valid"):
        values = vllm["values"]
        for name, cap in d.cap_paths:
            v = values.get(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > cap:
                out.append(f"vLLM reads {name}={v} > {cap}")
        budget = d.enforced_budget
        if budget is not None and all(values.get(f) is None for f in budget.fields if f in values) \
                and any(f in values for f in budget.fields):
            out.append(f"vLLM reads no output budget ({'/'.join(budget.fields)})")
    return out


def compare(ref: Judgement, seen: Seen, raw: bytes) -> str:
    """The class of a disagreement between the reference and a proxy ("" they agree)."""
    if ref.refused and seen.refused:
        if seen.reason != ref.reason:
            return "reason differs"
        return "" if seen.status == STATUS.get(parse(seen.reason)[0]) else "status differs"
    if ref.refused:
        return "forwards what the reference refuses"
    if seen.refused:
        return "refuses what the reference forwards"
    if ref.body is None:
        return "" if seen.forwarded == raw else "body differs"
    try:
        got = loads(seen.forwarded or b"")
    except (ValueError, RecursionError):
        return "body differs"
    if same(got, ref.body):
        return ""
    return NUMBERS_AS_DOUBLES if same(got, as_doubles(ref.body)) else "body differs"


def same(a: object, b: object) -> bool:
    """``a`` and ``b`` (as Python's json, and so vLLM, reads a body) the same JSON: the type too
    (1 is not 1.0, 100 not 1E+2's 100.0, 10**25 not 1e+25's float), a float's sign (-0.0 is not
    0.0), names and list items alike."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


# A rewritten body whose numbers left as JSON.stringify writes a double (as njs wrote every
# rewritten body until it kept the client's number texts): a disagreement like any other, named
# for its diagnosis.
NUMBERS_AS_DOUBLES = "body differs: numbers as doubles"


def as_doubles(value: object) -> object:
    """``value`` (as Python's json reads it) with every number as JavaScript writes its double to
    JSON (the shortest digits that read back as it), read back by Python's json: an integral one
    under 1e21 an int (1.0 -> 1, -0.0 -> 0, 2**63-1 -> 9223372036854776000), a larger or fractional
    one a float (10**25 -> 1e+25), infinities null."""
    if isinstance(value, dict):
        return {k: as_doubles(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_doubles(v) for v in value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    try:
        x = float(value)
    except OverflowError:
        return None
    if not math.isfinite(x):
        return None
    return int(decimal.Decimal(repr(x))) if x.is_integer() and abs(x) < 1e21 else x
