import httpx
import pytest

from scanner.inventory.model import Inventory, Route, Source, VllmFacts
from scanner.standin.app import STATS_PATH, build_app
from scanner.state_changing import is_state_changing


def _inventory() -> Inventory:
    return Inventory(
        source=Source(kind="vllm", target="vllm==0.29.0"),
        vllm=VllmFacts(version="0.29.0"),
        routes=(
            Route("/v1/chat/completions", ("POST",), guarded=True),
            Route("/v1/models", ("GET",), guarded=True),
            Route("/pause", ("POST",)),
            Route("/adapters/{adapter_name}", ("DELETE",)),
            Route("/health", ("GET",)),
            Route("/metrics", ("*",), kind="mount"),
        ),
    )


async def _client(keys: tuple[str, ...] = ()) -> httpx.AsyncClient:
    app, _ = build_app(_inventory(), keys)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://standin")


@pytest.mark.anyio
async def test_api_key_semantics_match_vllm() -> None:
    async with await _client(("right-key",)) as c:
        r = await c.post("/v1/chat/completions", json={})
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        assert (await c.post("/v1/chat/completions", headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await c.post("/v1/chat/completions", headers={"Authorization": "Basic right-key"})).status_code == 401
        ok = await c.post("/v1/chat/completions", headers={"Authorization": "bearer right-key"})
        assert ok.status_code == 200 and ok.json()["route"] == "/v1/chat/completions"
        # vLLM skips the key check for OPTIONS, and never guards paths outside its prefixes
        assert (await c.options("/v1/models")).status_code == 405
        assert (await c.post("/pause")).status_code == 200
        assert (await c.get("/health")).status_code == 200


@pytest.mark.anyio
async def test_404_405_and_mounts_like_fastapi() -> None:
    async with await _client() as c:
        r = await c.get("/nope")
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
        r = await c.get("/pause")
        assert r.status_code == 405 and r.json() == {"detail": "Method Not Allowed"}
        assert (await c.get("/metrics/anything")).status_code == 200


@pytest.mark.anyio
async def test_state_change_counter() -> None:
    async with await _client() as c:
        await c.get("/pause")                        # 405: never reached the handler
        await c.post("/v1/chat/completions")          # not state-changing
        await c.post("/pause")                        # reached: counted
        await c.delete("/adapters/lora1")             # reached: counted
        stats = (await c.get(STATS_PATH)).json()
    assert stats["state_changes"] == 2
    assert stats["state_changing_requests"] == {"POST /pause": 1, "DELETE /adapters/{adapter_name}": 1}


def test_state_changing_knowledge() -> None:
    for path in ("/pause", "/reset_prefix_cache", "/adapters/{adapter_name}", "/collective_rpc",
                 "/v1/load_lora_adapter"):
        assert is_state_changing(path), path
    for path in ("/v1/chat/completions", "/health", "/is_paused", "/tokenize"):
        assert not is_state_changing(path), path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
