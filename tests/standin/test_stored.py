"""Stored responses in the stand-in (scanner/standin/stored.py): kept, read back, cancelled and
continued as vLLM 0.29's OpenAIServingResponses does, with no owner."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx

from scanner.inventory.catalog import load_ref
from scanner.standin.app import build_app

INVENTORY = load_ref("vllm-0.29.0-everything")
BODY = {"model": "m", "input": "hi", "max_output_tokens": 3}


def _calls(*steps: tuple[str, str, Any]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        app, _ = build_app(INVENTORY, stream_delay=0)
        out: list[httpx.Response] = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as c:
            for method, path, body in steps:
                if "{0}" in path or (isinstance(body, dict) and "{0}" in json.dumps(body)):
                    rid = out[0].json()["id"]
                    path = path.replace("{0}", rid)
                    body = json.loads(json.dumps(body).replace("{0}", rid))
                out.append(await c.request(method, path, json=body))
        return out
    return asyncio.run(go())


def test_a_stored_response_is_read_continued_and_not_cancelled_when_done() -> None:
    made, got, cont, cancel, missing = _calls(
        ("POST", "/v1/responses", BODY), ("GET", "/v1/responses/{0}", None),
        ("POST", "/v1/responses", {**BODY, "previous_response_id": "{0}"}),
        ("POST", "/v1/responses/{0}/cancel", None), ("GET", "/v1/responses/resp_00000000000000ff", None))
    rid = made.json()["id"]
    assert re.fullmatch(r"resp_[0-9a-f]{16}", rid)
    assert got.status_code == 200 and got.json()["id"] == rid and got.json()["status"] == "incomplete"
    assert cont.status_code == 200 and cont.json()["previous_response_id"] == rid and cont.json()["id"] != rid
    assert cancel.status_code == 400 and cancel.json()["error"]["message"] == "Cannot cancel a synchronous response."
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Response with id 'resp_00000000000000ff' not found."


def test_background_is_queued_and_cancelled_unknown_previous_is_404_store_false_keeps_nothing() -> None:
    made, cancel, again, prev, unstored = _calls(
        ("POST", "/v1/responses", {**BODY, "background": True}), ("POST", "/v1/responses/{0}/cancel", None),
        ("GET", "/v1/responses/{0}", None),
        ("POST", "/v1/responses", {**BODY, "previous_response_id": "resp_00000000000000aa"}),
        ("POST", "/v1/responses", {**BODY, "store": False}))
    assert made.json()["status"] == "queued"
    assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
    assert again.json()["status"] == "cancelled"
    assert prev.status_code == 404 and prev.json()["error"]["param"] == "previous_response_id"
    (gone,) = _calls(("GET", f"/v1/responses/{unstored.json()['id']}", None))
    assert gone.status_code == 404


def test_a_streamed_response_is_stored_with_its_final_state() -> None:
    async def go() -> tuple[str, httpx.Response]:
        app, _ = build_app(INVENTORY, stream_delay=0)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as c:
            text = (await c.post("/v1/responses", json={**BODY, "stream": True})).text
            done = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")][-1]
            return done["response"]["id"], await c.get(f"/v1/responses/{done['response']['id']}")
    rid, got = asyncio.run(go())
    assert got.status_code == 200 and got.json()["id"] == rid and got.json()["output"]
