"""inventory asgi: any Starlette/FastAPI app by module:attr, loaded in a subprocess."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from scanner.errors import AppLoadError, UsageError
from scanner.inventory import asgi
from scanner.inventory.asgi import AsgiExtraction
from tests.inventory.conftest import HERE, CliResult

REPO = HERE.parent.parent
EXPECTED = {
    ("/admin/items/{item_id}", ("DELETE", "GET", "HEAD"), "http", False, "mount:/admin"),
    ("/health", ("GET", "HEAD"), "http", False, "app.routes"),
    ("/metrics", ("*",), "mount", False, "app.routes"),
    ("/v1/chat/completions", ("POST",), "http", True, "app.routes"),
    ("/v1/realtime", ("GET",), "websocket", True, "app.routes"),
}


def routes(target: str, **kw: object) -> set[tuple[object, ...]]:
    inv = asgi.extract(AsgiExtraction(target=target, app_dir=str(HERE), **kw))  # type: ignore[arg-type]
    return {(r.path, r.methods, r.kind, r.guarded, r.origin) for r in inv.routes}


def test_app_routes_exactly() -> None:
    inv = asgi.extract(AsgiExtraction(target="sample_app:app", app_dir=str(HERE)))
    assert {(r.path, r.methods, r.kind, r.guarded, r.origin) for r in inv.routes} == EXPECTED
    assert inv.source.kind == "asgi" and inv.source.target == "sample_app:app"
    assert inv.middleware == ("starlette.middleware.gzip.GZipMiddleware",)
    health = next(r for r in inv.routes if r.path == "/health")
    assert health.endpoint == "sample_app.health"


def test_factory_detected_or_forced() -> None:
    assert routes("sample_app:create_app") == EXPECTED
    assert routes("sample_app:create_app", factory=True) == EXPECTED


def test_middleware_wrapped_app_and_bare_router() -> None:
    assert routes("sample_app:wrapped") == EXPECTED
    assert routes("sample_app:router") == {("/only", ("GET", "HEAD"), "http", False, "app.routes")}


def test_dotted_module_from_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    inv = asgi.extract(AsgiExtraction(target="tests.inventory.sample_app:app"))
    assert len(inv.routes) == len(EXPECTED)


@pytest.mark.parametrize(("target", "kw", "message"), [
    ("sample_app:not_an_app", {}, "sample_app:not_an_app is a int, not a Starlette/FastAPI app"),
    ("sample_app:Starlette", {}, "is a class, not a Starlette/FastAPI app"),
    ("sample_app:missing", {}, "module 'sample_app' has no attribute 'missing'"),
    ("no_such_module_xyz:app", {}, "cannot import module 'no_such_module_xyz'"),
    ("broken_app:app", {}, "importing module 'broken_app' failed: RuntimeError: this module is"),
    ("sample_app:needs_argument", {}, "not a zero-argument app factory"),
    ("sample_app:not_an_app", {"factory": True}, "is a int, not callable"),
])
def test_load_errors(target: str, kw: dict[str, object], message: str) -> None:
    with pytest.raises(AppLoadError) as exc:
        asgi.extract(AsgiExtraction(target=target, app_dir=str(HERE), **kw))  # type: ignore[arg-type]
    assert message in str(exc.value)
    assert exc.value.exit_code == 2


@pytest.mark.parametrize("target", ["sample_app", "sample_app:", ":app", " :app"])
def test_malformed_target_is_usage_error_without_subprocess(target: str) -> None:
    spec = AsgiExtraction(target=target, app_dir=str(HERE), python="/nonexistent/python")
    with pytest.raises(UsageError, match="is not of the form module:attribute"):
        asgi.extract(spec)  # raised before any interpreter is started


def test_worker_folder_is_not_importable() -> None:
    # scanner/inventory holds model.py: an app's "import model" must not find it
    with pytest.raises(AppLoadError, match="cannot import module 'model'"):
        asgi.extract(AsgiExtraction(target="model:Inventory", app_dir=str(HERE)))


def test_cli_json_and_table(run_cli: Callable[..., CliResult]) -> None:
    res = run_cli("inventory", "asgi", "sample_app:app", "--app-dir", str(HERE), "--format", "json")
    assert res.rc == 0, res.err
    assert {r["path"] for r in res.json()["routes"]} == {e[0] for e in EXPECTED}
    table = run_cli("inventory", "asgi", "sample_app:create_app", "--factory", "--app-dir", str(HERE))
    assert table.rc == 0
    assert "5 routes from asgi sample_app:create_app" in table.out
    assert "3 of 5 routes are outside vLLM's --api-key guard" in table.out


@pytest.mark.parametrize(("target", "fragment"), [
    ("sample_app:not_an_app", "not a Starlette/FastAPI app"),
    ("no_such_module_xyz:app", "cannot import module"),
    ("broken_app:app", "importing module 'broken_app' failed"),
])
def test_cli_bad_inputs_are_one_line_exit_2(run_cli: Callable[..., CliResult], target: str,
                                            fragment: str) -> None:
    line = run_cli("inventory", "asgi", target, "--app-dir", str(HERE)).assert_one_line_error(2)
    assert fragment in line


def test_cli_missing_python_and_app_dir(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    line = run_cli("inventory", "asgi", "sample_app:app", "--app-dir", str(HERE),
                   "--python", str(tmp_path / "nopython")).assert_one_line_error(2)
    assert "python interpreter not found" in line
    line = run_cli("inventory", "asgi", "sample_app:app", "--app-dir", str(tmp_path / "nodir")) \
        .assert_one_line_error(2)
    assert "is not a directory" in line


def test_fastapi_app_in_another_python(vllm_python: str, tmp_path: Path) -> None:
    """FastAPI's APIRoute / APIWebSocketRoute / routers, in a Python that has FastAPI."""
    (tmp_path / "fa_app.py").write_text(
        "from fastapi import APIRouter, FastAPI, WebSocket\n"
        "app = FastAPI()\n"
        "r = APIRouter(prefix='/v1')\n"
        "@r.post('/embeddings')\n"
        "async def emb() -> dict: return {}\n"
        "@r.websocket('/realtime')\n"
        "async def rt(ws: WebSocket) -> None: await ws.close()\n"
        "app.include_router(r)\n"
        "@app.get('/health')\n"
        "async def health() -> dict: return {}\n", encoding="utf-8")
    inv = asgi.extract(AsgiExtraction(target="fa_app:app", python=vllm_python,
                                      app_dir=str(tmp_path)))
    got = {(r.path, r.methods, r.kind, r.guarded) for r in inv.routes}
    assert ("/v1/embeddings", ("POST",), "http", True) in got
    assert ("/v1/realtime", ("GET",), "websocket", True) in got
    assert ("/health", ("GET",), "http", False) in got
    assert ("/openapi.json", ("GET", "HEAD"), "http", False) in got
