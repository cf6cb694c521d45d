"""Against the real vLLM 0.29.0: the inventory lists exactly the routes build_app returns.

Each vLLM import costs ~10 s here, so the builds are module-scoped and shared.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scanner.inventory import catalog, model, openapi
from scanner.inventory.model import Inventory, RequestBody
from scanner.report import inventory as render_inventory
from tests.inventory.conftest import HERE, CliResult

pytestmark = pytest.mark.vllm

GROUND_TRUTH = HERE / "scripts" / "build_app_routes.py"
KIND_OF_CLASS = {"APIRoute": "http", "Route": "http", "APIWebSocketRoute": "websocket",
                 "WebSocketRoute": "websocket", "Mount": "mount"}


def ground_truth(python: str, profile: catalog.Profile, tmp: Path) -> dict[str, Any]:
    """app.routes of vLLM's own build_app, and the body models its handlers' signatures name,
    computed without the tool's worker."""
    spec = profile.extraction(python)
    req, out = tmp / f"{profile.name}-req.json", tmp / f"{profile.name}-routes.json"
    req.write_text(json.dumps({
        "serve_args": list(profile.serve_args),
        "optional_flags": list(profile.optional_flags),
        "tasks": list(profile.tasks),
        "standin": profile.model_config == "standin",
    }), encoding="utf-8")
    proc = subprocess.run([python, str(GROUND_TRUTH), str(req), str(out)],
                          env=spec.effective_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    truth: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return truth


@pytest.fixture(scope="module", params=sorted(catalog.PROFILES))
def built(request: pytest.FixtureRequest, vllm_python: str,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Inventory, dict[str, Any]]:
    profile = catalog.profile(request.param)
    inv = catalog.build(vllm_python, profile.name)
    truth = ground_truth(vllm_python, profile, tmp_path_factory.mktemp("truth"))
    return profile.name, inv, truth


def test_inventory_lists_exactly_build_app_routes(
        built: tuple[str, Inventory, dict[str, Any]]) -> None:
    name, inv, found = built
    truth = found["routes"]
    unknown = {cls for _, _, cls in truth} - KIND_OF_CLASS.keys()
    assert not unknown, f"route classes the comparison does not know: {unknown}"
    expected = Counter(
        (path, tuple(methods) if methods else (("GET",) if KIND_OF_CLASS[cls] == "websocket"
                                                else ("*",)), KIND_OF_CLASS[cls])
        for path, methods, cls in truth)
    got = Counter((r.path, r.methods, r.kind) for r in inv.routes)
    assert got == expected, (name, got - expected, expected - got)
    assert len(inv.routes) == len(truth)
    if name == "everything":
        assert "--enable-fault-tolerance" in (inv.vllm.serve_args if inv.vllm else ())
        assert {"/fault_tolerance/status", "/start_profile", "/collective_rpc",
                "/tokenizer_info", "/v1/load_lora_adapter"} <= {r.path for r in inv.routes}
        assert inv.vllm is not None and inv.vllm.model_config == "standin"


def test_bundled_029_catalog_is_reproduced_byte_for_byte(
        built: tuple[str, Inventory, dict[str, Any]]) -> None:
    name, inv, _ = built
    assert inv.vllm is not None
    if inv.vllm.version != "0.29.0":
        pytest.skip(f"vLLM under test is {inv.vllm.version}; the bundled catalog is 0.29.0")
    bundled = (catalog.catalog_dir() / f"vllm-0.29.0-{name}.json").read_text(encoding="utf-8")
    assert inv.to_json() == bundled


def test_request_models_and_fields_match_the_handlers_own_signatures(
        built: tuple[str, Inventory, dict[str, Any]]) -> None:
    """For every route whose handler names pydantic models in its signature: the inventory
    records those models and exactly their fields (read from model_fields, not a schema)."""
    name, inv, found = built
    assert len(found["bodies"]) >= (25 if name == "everything" else 10)
    for path, methods, models, fields in found["bodies"]:
        route = next(r for r in inv.routes if r.path == path and list(r.methods) == methods)
        body = route.request
        assert body is not None and body.source == "fastapi", (path, body)
        assert list(body.models) == models, path
        assert sorted(f.name for f in body.fields) == fields, path


def _body(inv: Inventory, path: str, method: str = "POST") -> RequestBody:
    route = next(r for r in inv.routes if r.path == path and method in r.methods)
    assert route.request is not None, path
    return route.request


def test_chat_and_completions_request_fields(
        built: tuple[str, Inventory, dict[str, Any]]) -> None:
    name, inv, _ = built
    chat = _body(inv, "/v1/chat/completions")
    assert chat.source == "fastapi" and chat.media_type == "application/json"
    assert chat.models[0].endswith(".ChatCompletionRequest") and chat.extra == "allow"
    names = {f.name for f in chat.fields}
    internal = {"kv_transfer_params", "ec_transfer_params", "vllm_xargs", "priority", "request_id",
                "media_io_kwargs", "mm_processor_kwargs", "structured_outputs", "cache_salt"}
    assert internal <= names and len(names) >= 60
    messages = chat.top_field("messages")
    assert messages is not None and messages.required and messages.types == ("array",)
    pos = chat.positions()
    assert pos["messages[].content[]"].types == ("string", "object")
    assert pos["messages[].content[].image_url.url"].types == ("string",)
    assert {'"image_url"', '"text"', '"input_audio"'} <= set(pos["messages[].content[].type"].enum)
    for field in ("max_tokens", "max_completion_tokens"):
        assert pos[field].types == ("integer", "null") and pos[field].default is None
    completions = _body(inv, "/v1/completions")
    assert completions.models[0].endswith(".CompletionRequest")
    assert completions.positions()["max_tokens"].default == 16
    assert {"prompt", "kv_transfer_params", "vllm_xargs"} <= {f.name for f in completions.fields}
    invocations = _body(inv, "/invocations")  # parses the raw body against its own validators
    assert invocations.source == "handler" and "INVOCATION_VALIDATORS" in invocations.note
    assert invocations.models[:2] == (chat.models[0], completions.models[0])
    assert {"messages", "prompt", "max_tokens"} <= {f.name for f in invocations.fields}
    assert _body(inv, "/version", "GET").source == "none"
    assert _body(inv, "/collective_rpc" if name == "everything" else "/health",
                 "POST" if name == "everything" else "GET").source == "unknown"
    assert len(_body(inv, "/tokenize").models) == 2  # a Union of two request models
    if name == "everything":
        speech = _body(inv, "/v1/audio/transcriptions")
        assert "form fields" in speech.note and speech.top_field("file") is not None


SECRET_KEY = "sk-perimeter-cli-7f3a9c1e"
SECRET_ENV = "env-perimeter-5d2b8e4a"


def test_secrets_never_appear_in_any_output(vllm_python: str, tmp_path: Path,
                                            run_cli: Callable[..., CliResult]) -> None:
    out = tmp_path / "inv.json"
    res = run_cli("inventory", "vllm", "--python", vllm_python, "--isolated-env",
                  "--env", f"VLLM_API_KEY={SECRET_ENV}", "--format", "json", "-o", str(out),
                  "--", "--model", "m", f"--api-key={SECRET_KEY}")
    assert res.rc == 0, res.err
    text = out.read_text(encoding="utf-8")
    inv = model.loads(text)
    table = render_inventory.to_table(inv)
    for shown in (text, table, res.out, res.err):
        assert SECRET_KEY not in shown and SECRET_ENV not in shown
    assert inv.vllm is not None and inv.vllm.api_key_configured
    assert "--api-key=<redacted>" in inv.vllm.serve_args
    assert inv.vllm.env["VLLM_API_KEY"] == "<redacted>"
    assert "--api-key=<redacted>" in table and "VLLM_API_KEY=<redacted>" in table

    # vLLM rejects an argument whose value is the secret: the one-line error hides it too
    line = run_cli("inventory", "vllm", "--python", vllm_python, "--isolated-env",
                   "--env", f"VLLM_API_KEY={SECRET_ENV}", "--", "--model", "m",
                   "--api-key", SECRET_KEY, "--max-model-len", SECRET_KEY,
                   "--served-model-name", SECRET_ENV).assert_one_line_error(2)
    assert "vLLM rejected the serve arguments" in line
    assert SECRET_KEY not in line and SECRET_ENV not in line


FASTAPI_DOCS = {"/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"}


def test_openapi_of_live_vllm_is_its_inventory_minus_what_specs_omit(
        real_vllm: Any, everything_inventory: Inventory) -> None:
    """Same surface twice: served live (engine-less) and extracted; the spec omits only
    FastAPI's own docs routes, mounts and WebSocket routes."""
    live = openapi.fetch(openapi.OpenApiFetch(real_vllm.url, timeout=30))
    spec_pairs = {(r.path, m, r.guarded) for r in live.routes for m in r.methods}
    inv_pairs = {(r.path, m, r.guarded) for r in everything_inventory.routes for m in r.methods}
    assert spec_pairs <= inv_pairs
    omitted = {(r.path, m, r.guarded) for r in everything_inventory.routes for m in r.methods
               if r.kind != "http" or r.path in FASTAPI_DOCS}
    assert inv_pairs - spec_pairs == omitted
    assert len(live.routes) > 50


@pytest.mark.parametrize(("env", "args", "says"), [
    ((), ("--grpc",), "with --grpc, `vllm serve` runs the gRPC server"),
    (("VLLM_USE_RUST_FRONTEND=1",), (), "HTTP is served by the Rust frontend (vllm-rs)"),
    ((), ("--headless",), "with --headless, `vllm serve` starts no API server"),
], ids=["grpc", "rust-frontend", "headless"])
def test_a_server_other_than_the_python_app_is_never_inventoried_as_it(
        vllm_python: str, run_cli: Callable[..., CliResult], env: tuple[str, ...], args: tuple[str, ...],
        says: str) -> None:
    """Issue 11: with these, `vllm serve` does not serve the Python app; its table would be wrong."""
    flags = [x for e in env for x in ("--env", e)]
    res = run_cli("inventory", "vllm", "--python", vllm_python, "--isolated-env", *flags,
                  "--", "--model", "m", *args)
    line = res.assert_one_line_error(2)
    assert says in line and "/v1/chat/completions" not in res.out


VLLM_033 = Path.home() / ".cache/vllm-perimeter/venvs/vllm-0.33.0/bin/python"


@pytest.mark.skipif(not VLLM_033.exists() and not os.environ.get("CI"), reason="vLLM 0.33.0 venv not here")
@pytest.mark.parametrize(("env", "args", "says"), [
    ((), ("--grpc",), "with --grpc, `vllm serve` runs the gRPC server"),
    (("VLLM_USE_RUST_FRONTEND=1",), (), "HTTP is served by the Rust frontend (vllm-rs)"),
], ids=["grpc", "rust-frontend"])
def test_033_with_another_server_never_prints_the_python_table(
        run_cli: Callable[..., CliResult], env: tuple[str, ...], args: tuple[str, ...], says: str) -> None:
    """Issue 11, done when: on 0.33.0 (provisioned in CI beside 0.29.0) neither prints the table."""
    flags = [x for e in env for x in ("--env", e)]
    res = run_cli("inventory", "vllm", "--python", str(VLLM_033), "--isolated-env", *flags,
                  "--", "--model", "m", *args)
    line = res.assert_one_line_error(2)
    assert says in line and "/v1/chat/completions" not in res.out
