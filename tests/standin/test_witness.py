"""The upstream witness (scanner/standin/_witness.py): what it records of each request, here how
many times one probe id reached it (a proxy resending a request: a retry on 5xx)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.probe.witness import fetch
from scanner.standin._witness import LoopbackWitness
from scanner.standin.serve import StandinThread
from scanner.witness_asgi import STANDIN_READ_PATH


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _records(ids: list[str]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=LoopbackWitness(_ok)),
                                     base_url="http://w") as client:
            for pid in ids:
                assert (await client.post(f"/v1/x?vp_probe={pid}", content=b"{}")).status_code == 200
            got = await client.get(STANDIN_READ_PATH, params={"prefix": "run-"})
            return list(got.json()["records"])
    return asyncio.run(run())


def test_each_arrival_of_one_probe_id_is_counted() -> None:
    records = _records(["run-1", "run-2", "run-1", "run-1"])
    assert [(r["id"], r["arrivals"]) for r in records] == [("run-1", 1), ("run-2", 1), ("run-1", 2), ("run-1", 3)]


def test_the_prober_reads_the_newest_count() -> None:
    port = free_port()
    with StandinThread(load_ref("vllm-0.29.0-default"), "127.0.0.1", port) as standin:
        for _ in range(2):
            assert httpx.get(f"{standin.url}/v1/models?vp_probe=run-7").status_code == 200
        seen = asyncio.run(fetch(standin.url, "run-", 5))
    assert seen["run-7"].arrivals == 2
