"""Against the real vLLM 0.29.0: the inventory lists exactly the routes build_app returns.

Each vLLM import costs ~10 s here, so the builds are module-scoped and shared.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scanner.inventory import catalog, model, openapi
from scanner.inventory.model import Inventory
from scanner.report import inventory as render_inventory
from tests.inventory.conftest import HERE, CliResult

pytestmark = pytest.mark.vllm

GROUND_TRUTH = HERE / "scripts" / "build_app_routes.py"
KIND_OF_CLASS = {"APIRoute": "http", "Route": "http", "APIWebSocketRoute": "websocket",
                 "WebSocketRoute": "websocket", "Mount": "mount"}


def ground_truth(python: str, profile: catalog.Profile, tmp: Path) -> list[list[Any]]:
    """app.routes of vLLM's own build_app, computed without the tool's worker."""
    spec = profile.extraction(python)
    req, out = tmp / f"{profile.name}-req.json", tmp / f"{profile.name}-routes.json"
    req.write_text(json.dumps({
        "serve_args": [*profile.serve_args, *profile.optional_flags],  # 0.29 has them all
        "tasks": list(profile.tasks),
        "standin": profile.model_config == "standin",
    }), encoding="utf-8")
    proc = subprocess.run([python, str(GROUND_TRUTH), str(req), str(out)],
                          env=spec.effective_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    rows: list[list[Any]] = json.loads(out.read_text(encoding="utf-8"))
    return rows


@pytest.fixture(scope="module", params=sorted(catalog.PROFILES))
def built(request: pytest.FixtureRequest, vllm_python: str,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Inventory, list[list[Any]]]:
    profile = catalog.profile(request.param)
    inv = catalog.build(vllm_python, profile.name)
    truth = ground_truth(vllm_python, profile, tmp_path_factory.mktemp("truth"))
    return profile.name, inv, truth


def test_inventory_lists_exactly_build_app_routes(
        built: tuple[str, Inventory, list[list[Any]]]) -> None:
    name, inv, truth = built
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
        built: tuple[str, Inventory, list[list[Any]]]) -> None:
    name, inv, _ = built
    assert inv.vllm is not None
    if inv.vllm.version != "0.29.0":
        pytest.skip(f"vLLM under test is {inv.vllm.version}; the bundled catalog is 0.29.0")
    bundled = (catalog.catalog_dir() / f"vllm-0.29.0-{name}.json").read_text(encoding="utf-8")
    assert inv.to_json() == bundled


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
