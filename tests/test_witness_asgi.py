"""The witness inside vLLM (scanner/witness_asgi.py), in process: only requests tagged with the
shared secret are recorded, each tag once; the records come back only to a MAC'd read, sealed;
everything else, and everything when the witness itself fails, reaches the app untouched."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from scanner import witness_asgi as w
from scanner.standin import _witness as standin_witness

SECRET = b"s" * 40


async def _echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The app: answers what it received (query, body, headers), 404 on the read path."""
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    payload = json.dumps({"query": scope["query_string"].decode(), "body": body.decode(),
                          "headers": sorted(k.decode() for k, _v in scope["headers"])}).encode()
    status = 404 if scope["path"] == w.READ_PATH else 200
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"x-app", b"1")]})
    await send({"type": "http.response.body", "body": payload})


def _tagged(pid: str, secret: bytes = SECRET, **extra: str) -> str:
    params = {w.PROBE_PARAM: pid, **extra}
    return "&".join(f"{k}={v}" for k, v in {**params, w.TAG_PARAM: w.tag(secret, params)}.items())


async def _read(client: httpx.AsyncClient, prefix: str, secret: bytes = SECRET) -> list[dict[str, Any]]:
    params = w.read_params(secret, prefix)
    resp = await client.get(w.READ_PATH, params=params)
    assert resp.status_code == 200, resp.text
    assert resp.headers[w.SEAL_HEADER] == w.seal(SECRET, params["nonce"], resp.content)
    return list(resp.json()["records"])


def _run(witness: w.Witness, steps: Any) -> Any:
    async def run() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=witness), base_url="http://vllm") as c:
            return await steps(c)
    return asyncio.run(run())


def test_a_tagged_request_is_recorded_and_read_back_sealed() -> None:
    body = json.dumps({"model": "m", "max_tokens": 5, "max_tokens_x": 1}).encode()

    async def steps(c: httpx.AsyncClient) -> tuple[httpx.Response, list[dict[str, Any]]]:
        resp = await c.post(f"/v1/completions?a=1&{_tagged('run1-1')}", content=body,
                            headers={"Authorization": "Bearer sk-secret-key", "X-Forwarded-For": "10.0.0.7",
                                     "X-Perimeter-Principal": "alice"})
        return resp, await _read(c, "run1-")

    resp, records = _run(w.Witness(_echo, SECRET), steps)
    assert resp.status_code == 200 and w.SEAL_HEADER not in resp.headers
    assert json.loads(resp.json()["body"]) == json.loads(body)   # vLLM got the body as sent
    (r,) = records
    headers = dict(r["headers"])
    assert (r["id"], r["method"], r["path"], r["query"]) == ("run1-1", "POST", "/v1/completions", "a=1")
    assert headers["authorization"] == w.fingerprint("Bearer sk-secret-key") != "Bearer sk-secret-key"
    assert headers["x-forwarded-for"] == "10.0.0.7" and headers["host"] == "vllm"
    assert r["budget"] == {"max_tokens": 5} and json.loads(r["body"]) == json.loads(body)
    assert (r["in_flight"], r["arrivals"], r["body_bytes"]) == (1, 1, len(body))
    assert "nonce" not in r and "sk-secret-key" not in json.dumps(records)


@pytest.mark.parametrize("query", [
    "vp_probe=run1-1",                                                          # untagged
    _tagged("run1-1", secret=b"x" * 40),                                         # another secret
    _tagged("run1-1").replace("vp_probe=run1-1", "vp_probe=run1-2"),             # tag of another id
    _tagged("run1-1", vp_hold="100").replace("vp_hold=100", "vp_hold=30000"),   # a longer hold
    _tagged("run1-1", vp_answer="400").replace("vp_answer=400", ""),             # not answered
    "vp_probe=run1-1&vp_tag=" + w.tag(SECRET, {w.PROBE_PARAM: "run1-1"}, now=time.time() - 300),  # stale
    "vp_probe=run1-1&vp_tag=garbage.x.y",
])
def test_untagged_and_forged_requests_pass_untouched_and_unrecorded(query: str) -> None:
    async def steps(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response, list[dict[str, Any]]]:
        bare = await c.post(f"/v1/completions?{query}", content=b'{"a": 1}')
        witnessed = w.Witness(_echo, SECRET)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=witnessed),
                                     base_url="http://vllm") as wc:
            seen = await wc.post(f"/v1/completions?{query}", content=b'{"a": 1}')
            return bare, seen, await _read(wc, "run1-")

    bare, seen, records = _run(w.Witness(_echo, None), steps)
    assert (seen.status_code, seen.headers.items(), seen.content) == \
        (bare.status_code, bare.headers.items(), bare.content)
    assert records == []


def test_a_replayed_tag_is_refused() -> None:
    query = _tagged("run1-1", vp_answer="400", vp_hold="50")

    async def steps(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response, list[dict[str, Any]]]:
        first = await c.post(f"/v1/completions?{query}", content=b"{}")
        again = await c.post(f"/v1/completions?{query}", content=b"{}")
        return first, again, await _read(c, "run1-")

    first, again, records = _run(w.Witness(_echo, SECRET), steps)
    assert first.status_code == 400 and w.LEAK_MARKER in first.text   # the witness answered, as asked
    assert again.status_code == 200 and again.headers["x-app"] == "1"  # the replay went to the app
    (r,) = records
    assert r["arrivals"] == 2 and r["held_ms"] > 0    # one record: the replay only counted


def test_a_read_without_the_secret_reaches_the_app() -> None:
    async def steps(c: httpx.AsyncClient) -> list[int]:
        await c.post(f"/v1/x?{_tagged('run1-1')}", content=b"{}")
        forged = w.read_params(b"y" * 40, "run1-")
        spent = w.read_params(SECRET, "run1-")
        out = [(await c.get(w.READ_PATH, params=p)).status_code
               for p in ({"prefix": "run1-"}, forged, {**spent, "prefix": ""}, spent, spent)]
        return out

    # a forged MAC, one for another prefix, then the same read twice: the second is a replay
    assert _run(w.Witness(_echo, SECRET), steps) == [404, 404, 404, 200, 404]


def test_in_flight_counts_the_principal_s_tagged_requests() -> None:
    async def steps(c: httpx.AsyncClient) -> list[dict[str, Any]]:
        sends = [c.post(f"/v1/x?{_tagged(f'run1-{i}', vp_hold='300')}", content=b"{}",
                        headers={"X-Perimeter-Principal": who})
                 for i, who in enumerate(("alice", "alice", "bob"))]
        await asyncio.gather(*sends)
        await c.post(f"/v1/x?{_tagged('run1-9')}", content=b"{}", headers={"X-Perimeter-Principal": "alice"})
        return await _read(c, "run1-")

    got = {r["id"]: r["in_flight"] for r in _run(w.Witness(_echo, SECRET), steps)}
    assert sorted((got["run1-0"], got["run1-1"])) == [1, 2] and got["run1-2"] == 1 and got["run1-9"] == 1


@pytest.mark.parametrize("broken", ["_record", "_admit", "_store", "_held_for"])
def test_the_app_answers_unchanged_when_the_witness_raises(monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("witness bug")

    monkeypatch.setattr(w.Witness, broken, boom)
    query = _tagged("run1-1", vp_hold="10")

    async def steps(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post(f"/v1/completions?{query}", content=b'{"a": 1}')

    resp = _run(w.Witness(_echo, SECRET), steps)
    assert resp.status_code == 200 and resp.headers["x-app"] == "1"
    assert json.loads(resp.json()["body"]) == {"a": 1} and "vp_tag=" in resp.json()["query"]


def test_without_a_secret_the_witness_does_nothing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    short = tmp_path / "short"
    short.write_text("too-short\n")
    for value in (None, str(tmp_path / "missing"), str(short)):
        if value is None:
            monkeypatch.delenv(w.ENV_SECRET_FILE, raising=False)
        else:
            monkeypatch.setenv(w.ENV_SECRET_FILE, value)
        assert w.Witness(_echo).secret is None
    good = tmp_path / "good"
    good.write_text("k" * 43 + "\n")
    monkeypatch.setenv(w.ENV_SECRET_FILE, str(good))
    assert w.Witness(_echo).secret == b"k" * 43


def test_the_stand_in_s_witness_holds_no_copy_of_the_protocol() -> None:
    """One protocol: the stand-in's witness defines none of this module's names (its own recorder
    is ``LoopbackWitness``: every request, reads without a MAC) and uses this module's own objects."""
    tree = ast.parse(Path(standin_witness.__file__).read_text(encoding="utf-8"))
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert "LoopbackWitness" in defined and not defined & set(vars(w)), defined & set(vars(w))
    used = [a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "scanner.witness_asgi"
            for a in n.names]
    assert {"record_of", "held_for", "answered", "read_body", "probe_params", "STANDIN_READ_PATH"} <= set(used)
    assert all(getattr(standin_witness, name) is getattr(w, name) for name in used)


def test_in_vllms_python_the_stand_in_s_witness_loads_this_very_file() -> None:
    """scanner/inventory/_worker.py wraps the real vLLM app in the stand-in's witness inside vLLM's
    Python, where this package is not installed: the protocol it speaks is this file, loaded by path."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import _worker; W = _worker.standin_witness(); "
            "p = sys.modules['scanner.witness_asgi']; g = W.__call__.__globals__; "
            "assert 'scanner' not in sys.modules; "
            "assert all(g[n] is getattr(p, n) for n in ('record_of', 'held_for', 'answered', 'read_body')); "
            "print(p.__file__)")
    # -I -S: no site-packages, no PYTHONPATH, no current directory: only the files and the stdlib
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(Path(w.__file__).parent / "inventory")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve() == Path(w.__file__).resolve()
