"""inventory live: a black-box inventory measured from a running server's own answers.

* the classifier on a tiny Starlette app (served / absent / 405 / guard / state-changing
  routes never called / mount / WebSocket / a route that answers 404 itself);
* the vllm-rs route-list reader (unit, and on the real 0.29.0 binary);
* the real vLLM 0.29.0 app engine-less with --api-key: the live inventory equals the
  `inventory vllm` route table of the same configuration, guard included;
* ``vllm-rs render`` engine-free (0.29.0, and 0.33.0 when its venv is here): the live
  inventory is exactly what the render router serves; the bundled 0.33.0 catalog is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

from scanner.errors import TargetUnreachableError, UsageError
from scanner.inventory import catalog, live, rust
from scanner.inventory.live import LiveInventory, LiveResult
from scanner.inventory.model import ANY_METHOD, Inventory, Source
from scanner.inventory.model import Route as InvRoute
from scanner.net import free_port
from tests.conftest import DEFAULT_VLLM_PYTHON
from tests.inventory.conftest import CliResult
from tests.inventory.rust_render import RENDER_SERVED, build_catalog, render_server

KEY = "sk-live-inventory-4c1d9e7a"
# uvicorn here speaks WebSocket only with the websockets/wsproto package installed; without it
# the WebSocket candidates are left out of the tiny app's run (the real vLLM app test has them)
WS = AutoWebSocketsProtocol is not None
CALLS: dict[str, int] = {"pause": 0}


# --- a tiny app shaped like vLLM's -----------------------------------------------------------


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": []})


async def chat(request: Request) -> Response:
    if request.headers.get("content-type") != "application/json":
        return JSONResponse({"error": "Unsupported Media Type"}, status_code=400)
    return JSONResponse({"ok": True})


async def pause(request: Request) -> Response:
    CALLS["pause"] += 1
    return JSONResponse({"paused": True})


async def item(request: Request) -> Response:
    return JSONResponse({"error": {"message": "no such item"}}, status_code=404)


async def whoami(request: Request) -> Response:
    """Answers with and without the key, differently: not a guard."""
    return JSONResponse({"user": "key" if "authorization" in request.headers else "anonymous"})


async def stream(ws: WebSocket) -> None:
    await ws.accept()
    await ws.close()


async def metrics(scope: Scope, receive: Receive, send: Send) -> None:
    await PlainTextResponse("# HELP x\n")(scope, receive, send)


class KeyGuard:
    """vLLM's AuthenticationMiddleware in small: /v1 prefix, OPTIONS skipped, 401 JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS" \
                and scope["path"].startswith("/v1"):
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if auth != f"Bearer {KEY}".encode():
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def make_app() -> ASGIApp:
    mount = Mount("/metrics", app=metrics)
    mount.path_regex = __import__("re").compile("^/metrics(?P<path>.*)$")  # as vLLM does
    app = Starlette(routes=[
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/chat", chat, methods=["POST"]),
        Route("/pause", pause, methods=["POST"]),
        Route("/items/{item_id}", item),
        Route("/whoami", whoami),
        WebSocketRoute("/v1/ws", stream),
        mount,
    ])
    return KeyGuard(app)


class Server:
    def __init__(self, app: ASGIApp) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def tiny() -> Iterator[Server]:
    with Server(make_app()) as s:
        yield s


CANDIDATES = Inventory(source=Source("asgi", "candidates"), routes=(
    InvRoute("/health", ("GET", "POST")),          # POST: the path exists, the method does not
    InvRoute("/v1/models", ("GET",)),
    InvRoute("/v1/chat", ("POST",)),
    InvRoute("/pause", ("POST",)),                 # state-changing: never sent by default
    InvRoute("/sleep", ("POST",)),                 # state-changing and absent
    InvRoute("/items/{item_id}", ("GET",)),        # answers 404 itself, with its own body
    InvRoute("/metrics", (ANY_METHOD,), kind="mount"),
    InvRoute("/whoami", ("GET",)),
    InvRoute("/gone", ("GET",)),
    InvRoute("/v1/gone", ("POST",)),               # absent, but the guard answers 401 without a key
    *((InvRoute("/v1/ws", ("GET",), kind="websocket"),
       InvRoute("/v2/ws", ("GET",), kind="websocket")) if WS else ()),
))


@pytest.fixture(scope="module")
def candidates(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cands") / "candidates.json"
    path.write_text(CANDIDATES.to_json(), encoding="utf-8")
    return str(path)


def verdicts(result: LiveResult) -> dict[tuple[str, str], str]:
    return {(f.path, f.method): f.verdict for f in result.findings}


def guards(result: LiveResult) -> dict[tuple[str, str], bool | None]:
    return {(f.path, f.method): f.guarded for f in result.findings if f.verdict == "served"}


SERVED_TINY = {("/health", "GET"), ("/health", "HEAD"), ("/v1/models", "GET"), ("/v1/models", "HEAD"),
               ("/v1/chat", "POST"), ("/pause", "POST"), ("/items/{item_id}", "GET"),
               ("/items/{item_id}", "HEAD"), ("/metrics", ANY_METHOD), ("/whoami", "GET"),
               ("/whoami", "HEAD"), *((("/v1/ws", "GET"),) if WS else ())}
ABSENT_TINY = {("/health", "POST"), ("/sleep", "POST"), ("/gone", "GET"), ("/v1/gone", "POST"),
               *((("/v2/ws", "GET"),) if WS else ())}


def test_served_absent_and_405_with_a_key(tiny: Server, candidates: str) -> None:
    CALLS["pause"] = 0
    res = live.run(LiveInventory(tiny.url, key=KEY, catalogs=(candidates,), openapi=False))
    v = verdicts(res)
    assert {k for k, x in v.items() if x == "served"} == SERVED_TINY
    assert {k for k, x in v.items() if x == "absent"} == ABSENT_TINY
    assert not res.of("unknown")
    assert CALLS["pause"] == 0  # the state-changing handler never ran
    seen = {(f.path, f.method): f.seen for f in res.findings}
    assert "POST 405 allow GET,HEAD" in seen[("/health", "POST")]
    assert "POST not sent (state-changing path)" in seen[("/pause", "POST")]
    assert "OPTIONS 405 allow POST" in seen[("/pause", "POST")]
    assert res.calibration["GET"].status == 404 and res.calibration["OPTIONS"].status == 404
    # guard measured per route: the key turns 401 into an answer under /v1 only
    g = guards(res)
    assert g[("/v1/models", "GET")] is True and g[("/v1/chat", "POST")] is True
    assert g.get(("/v1/ws", "GET"), WS) is WS
    assert g[("/health", "GET")] is False and g[("/pause", "POST")] is False
    assert g[("/metrics", ANY_METHOD)] is False
    assert g[("/whoami", "GET")] is False  # the key changes the answer, but no 401 without it
    inv = res.inventory
    assert inv.source.kind == "live" and inv.source.target == tiny.url
    kinds = {(r.path, r.kind) for r in inv.routes}
    assert ("/metrics", "mount") in kinds and (("/v1/ws", "websocket") in kinds) is WS
    assert all(r.origin.startswith("live: ") for r in inv.routes)
    pause_route = next(r for r in inv.routes if r.path == "/pause")
    assert "no key: PATCH 405 allow POST" in pause_route.origin


def test_without_a_key_guarded_routes_show_through_options(tiny: Server, candidates: str) -> None:
    res = live.run(LiveInventory(tiny.url, catalogs=(candidates,), openapi=False))
    v = verdicts(res)
    # vLLM's guard skips OPTIONS: the 405 Allow proves the route, the 401 proves the guard
    assert v[("/v1/models", "GET")] == "served" and v[("/v1/chat", "POST")] == "served"
    assert v[("/v1/gone", "POST")] == "absent"      # 401 to POST, but OPTIONS 404
    assert v.get(("/v1/ws", "GET"), "unknown") == "unknown"  # a 401 handshake proves nothing
    g = guards(res)
    assert g[("/v1/models", "GET")] is True and g[("/health", "GET")] is False
    assert "no --key" in res.summary()


def test_paths_without_methods_take_them_from_allow(tiny: Server, candidates: str) -> None:
    res = live.run(LiveInventory(tiny.url, key=KEY, catalogs=(candidates,), openapi=False,
                                 extra_paths=("/not-there", "/whoami", "/items/{item_id}")))
    v = verdicts(res)
    assert v[("/not-there", "OPTIONS")] == "absent"
    assert {m for (p, m), x in v.items() if p == "/whoami" and x == "served"} == {"GET", "HEAD"}
    assert "given" in next(f for f in res.findings if f.path == "/whoami").listed_by


def test_allow_state_changes_sends_the_declared_method(tiny: Server, candidates: str) -> None:
    CALLS["pause"] = 0
    res = live.run(LiveInventory(tiny.url, key=KEY, catalogs=(candidates,), openapi=False,
                                 allow_state_changes=True))
    assert CALLS["pause"] >= 1
    assert verdicts(res)[("/pause", "POST")] == "served"
    assert "POST 200" in next(f for f in res.findings if f.path == "/pause").seen


def test_bounded_and_unreachable(tiny: Server, candidates: str) -> None:
    with pytest.raises(TargetUnreachableError, match="inventory incomplete: stopped at --max-requests 25"):
        live.run(LiveInventory(tiny.url, catalogs=(candidates,), openapi=False, max_requests=25))
    with pytest.raises(TargetUnreachableError, match="unreachable"):
        live.run(LiveInventory(f"http://127.0.0.1:{free_port()}", catalogs=(candidates,), timeout=2))
    with pytest.raises(UsageError, match="not an http"):
        live.run(LiveInventory("ftp://x", catalogs=(candidates,)))


def test_cli_json_probes_and_the_key_is_never_printed(
        tiny: Server, candidates: str, tmp_path: Path, run_cli: Callable[..., CliResult]) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    probes = tmp_path / "probes.json"
    res = run_cli("inventory", "live", tiny.url, "--key", str(key_file), "--catalog", candidates,
                  "--no-openapi", "--format", "json", "--probes", str(probes))
    assert res.rc == 0, res.err
    inv = res.json()
    assert inv["source"] == {"kind": "live", "target": tiny.url}
    pairs = {(r["path"], m) for r in inv["routes"] for m in r["methods"]}
    assert pairs == SERVED_TINY
    record = json.loads(probes.read_text(encoding="utf-8"))
    assert record["keyed"] is True and len(record["findings"]) == len(SERVED_TINY) + len(ABSENT_TINY)
    for text in (res.out, res.err, probes.read_text(encoding="utf-8")):
        assert KEY not in text
    assert res.err.startswith(f"live: {7 + WS} routes served")
    table = run_cli("inventory", "live", tiny.url, "--catalog", candidates, "--no-openapi")
    assert table.rc == 0 and "routes from live" in table.out
    run_cli("inventory", "live", f"http://127.0.0.1:{free_port()}", "--catalog", candidates,
            "--timeout", "2").assert_one_line_error(3)
    key_file.write_text("", encoding="utf-8")
    line = run_cli("inventory", "live", tiny.url, "--key", str(key_file)).assert_one_line_error(2)
    assert "--key" in line


def test_templates_and_answers() -> None:
    assert live.concrete("/v1/responses/{response_id}/cancel") == \
        "/v1/responses/vllm-perimeter-probe/cancel"
    assert live.concrete("/files/{p:path}") == "/files/vllm-perimeter-probe"
    assert live.concrete("/a/:id/b") == "/a/vllm-perimeter-probe/b"
    rx = live._template_regex("/v1/responses/{response_id}")
    assert rx.fullmatch("/v1/responses/render") and not rx.fullmatch("/v1/responses/a/b")
    a = live.ServerAnswer(404, "application/json", "abc")
    assert a.same(live.ServerAnswer(404, "application/json", "abc"), True)
    assert not a.same(live.ServerAnswer(404, "application/json", "def"), True)
    assert a.same(live.ServerAnswer(404, "application/json", "def"), False)
    assert not live.ServerAnswer(None, error="x").same(live.ServerAnswer(None, error="x"), False)


# --- the vllm-rs route list --------------------------------------------------------------------


def test_rust_symbol_demangling_and_string_split() -> None:
    assert rust.demangle("_ZN11vllm_server6routes6render12build_router17h5f49b9a1c4bf1074E") == \
        "vllm_server::routes::render::build_router"
    assert rust.demangle("main") == "main"
    known = ("/health", "/v1/models", "/v1/chat/completions", "/inference/v1/generate", "/tokenize")
    assert rust.split_run("/health/load/v1/models/v1/chat/completions/inference/v1/generate"
                          "/v1/decisions/tokenize", known) == (
        "/health", "/load", "/v1/models", "/v1/chat/completions", "/inference/v1/generate",
        "/v1/decisions", "/tokenize")


def _binary(python: str) -> Path:
    return rust.locate(python)


def test_rust_route_list_of_the_real_029_binary(vllm_python: str) -> None:
    routes = rust.read(_binary(vllm_python))
    assert routes.reader == "code"
    render = routes.routers["vllm_server::routes::render::build_router"]
    assert set(render) == {p for p, _ in RENDER_SERVED}
    frontend = set(routes.routers["vllm_server::routes::build_router"])
    assert {"/health", "/v1/models", "/v1/chat/completions", "/inference/v1/generate", "/pause",
            "/wake_up", "/get_world_size", "/start_profile", "/stop_profile"} <= frontend
    assert all(p.startswith("/") and "profiler" not in p for p in frontend)
    # the strings reader, guided by the catalogs, finds most of them too
    data = _binary(vllm_python).read_bytes()
    known = {r.path for n in catalog.names() for r in catalog.load_catalog(n).routes}
    strings = {p for ps in rust.from_strings(data, known).values() for p in ps}
    assert len(frontend & strings) >= len(frontend) - 8


# --- the real vLLM app, engine-less --------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_vllm(vllm_python: str) -> Iterator[Any]:
    from scanner.standin.real import RealVllmServer

    spec = catalog.PROFILES["everything"].extraction(vllm_python)
    spec = replace(spec, serve_args=(*spec.serve_args, "--api-key", KEY))
    with RealVllmServer(spec) as server:
        yield server


@pytest.mark.vllm
def test_live_inventory_of_the_real_app_equals_its_route_table(
        keyed_vllm: Any, everything_inventory: Inventory) -> None:
    """Same app twice: extracted (`inventory vllm`, guard by prefix) and measured live with
    the key (guard by asking without it): every (path, method, kind, guarded) agrees."""
    res = live.run(LiveInventory(keyed_vllm.url, key=KEY, timeout=30))
    expected = {(r.path, m, r.kind, r.guarded) for r in everything_inventory.routes for m in r.methods}
    got = {(r.path, m, r.kind, r.guarded) for r in res.inventory.routes for m in r.methods}
    assert got == expected, (sorted(got - expected), sorted(expected - got))
    assert not res.of("unknown"), res.of("unknown")
    assert res.openapi_read and res.requests < 400
    # state-changing routes were seen through the router's 405, never sent their method
    collective = next(f for f in res.findings if f.path == "/collective_rpc")
    assert collective.verdict == "served" and "POST not sent (state-changing path)" in collective.seen

    # without the key: the same routes (OPTIONS is not guarded), guard from the 401s; only
    # the WebSocket route cannot show itself through a 401 handshake
    bare = live.run(LiveInventory(keyed_vllm.url, timeout=30))
    got_bare = {(r.path, m, r.kind, r.guarded) for r in bare.inventory.routes for m in r.methods}
    assert expected - got_bare == {("/v1/realtime", "GET", "websocket", True)}
    assert got_bare <= expected


# --- vllm-rs render, engine-free -----------------------------------------------------------------


def _render_pythons() -> list[Any]:
    out: list[Any] = ["ci"]
    local = DEFAULT_VLLM_PYTHON.parent.parent.parent / "vllm-0.33.0" / "bin" / "python"
    out.append(pytest.param(str(local), marks=pytest.mark.skipif(
        not local.exists(), reason="vLLM 0.33.0 venv not here (.ci/run provisions it)")))
    return out


@pytest.mark.vllm
@pytest.mark.parametrize("which", _render_pythons())
def test_live_inventory_of_vllm_rs_render(which: str, vllm_python: str, tmp_path: Path) -> None:
    python = vllm_python if which == "ci" else which
    server, binary = render_server(python, tmp_path)
    routes = rust.read(binary)
    with server:
        res = live.run(LiveInventory(f"http://{server.host}:{server.port}", binaries=(str(binary),),
                                     timeout=10))
    served = {(f.path, f.method) for f in res.of("served")}
    assert served == RENDER_SERVED
    assert {(r.path, m) for r in res.inventory.routes for m in r.methods} == RENDER_SERVED
    assert all(r.kind == "http" and not r.guarded for r in res.inventory.routes)
    v = verdicts(res)
    # every route the binary lists is classified, by axum's own answers
    for path in routes.paths:
        assert {x for (p, _), x in v.items() if p == path} <= {"served", "absent"}, path
        assert any(p == path for p, _ in v), path
    assert v[("/tokenize", "POST")] == "absent" and v[("/pause", "POST")] == "absent"
    assert v[("/metrics", ANY_METHOD)] == "absent" and v[("/v1/chat/completions", "POST")] == "absent"
    assert not res.of("unknown")
    # axum: 404 with an empty body, 405 with allow, also for OPTIONS
    absent = res.calibration["GET"]
    assert absent.status == 404 and absent.content_type == "" and \
        absent.body_digest == hashlib.sha256(b"").hexdigest()[:16]
    health = next(f for f in res.findings if f.path == "/health" and f.method == "GET")
    assert "OPTIONS 405 allow GET,HEAD" in health.seen


@pytest.mark.vllm
def test_bundled_033_rust_render_catalog_is_reproduced() -> None:
    python = DEFAULT_VLLM_PYTHON.parent.parent.parent / "vllm-0.33.0" / "bin" / "python"
    bundled = catalog.catalog_dir() / "vllm-0.33.0-rust-render.json"
    inv = catalog.load_catalog("vllm-0.33.0-rust-render")
    assert inv.source.kind == "live" and "vllm==0.33.0" in inv.source.target
    assert {(r.path, m) for r in inv.routes for m in r.methods} == RENDER_SERVED
    if not python.exists():
        pytest.skip("vLLM 0.33.0 venv not here (.ci/run provisions it): the file is checked, not rebuilt")
    assert build_catalog(str(python)).to_json() == bundled.read_text(encoding="utf-8")
