"""Bundled catalogs: present, valid, named after what they hold; resource lookup; CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from scanner import resources
from scanner.errors import InternalError, UsageError
from scanner.inventory import catalog
from tests.inventory.conftest import CliResult

VERSIONS = ("0.28.0", "0.29.0", "0.33.0")
EXPECTED = tuple(f"vllm-{v}-{p}" for v in VERSIONS for p in ("default", "everything"))
# made by `inventory live` against a running server (tests/inventory/test_live.py)
LIVE = ("vllm-0.33.0-rust-render",)


def test_every_expected_catalog_is_bundled_in_version_order() -> None:
    assert catalog.names() == EXPECTED + LIVE


@pytest.mark.parametrize("name", EXPECTED)
def test_catalog_is_valid_and_matches_its_name_and_profile(name: str) -> None:
    inv = catalog.load_catalog(name)  # validates, including the content hash
    _, version, profile_name = name.split("-")
    prof = catalog.profile(profile_name)
    assert inv.vllm is not None and inv.vllm.version == version
    assert inv.source.kind == "vllm" and inv.source.target == f"vllm=={version}"
    assert inv.vllm.tasks == prof.tasks
    assert inv.vllm.serve_args[: len(prof.serve_args)] == prof.serve_args
    extra = inv.vllm.serve_args[len(prof.serve_args):]
    assert set(extra) <= set(prof.optional_flags)
    assert {k: v for k, v in inv.vllm.env.items() if k != "VLLM_TARGET_DEVICE"} == dict(prof.env)
    assert inv.vllm.model_config == ("standin" if profile_name == "everything" else "none")
    assert inv.vllm.guarded_prefixes == ("/v1", "/v2", "/inference", "/cohere")
    paths = {r.path for r in inv.routes}
    assert {"/v1/chat/completions", "/tokenize", "/invocations", "/metrics"} <= paths
    dev = {"/collective_rpc", "/sleep", "/start_profile", "/tokenizer_info", "/v1/load_lora_adapter"}
    if profile_name == "everything":
        assert dev <= paths
        assert any(r.kind == "websocket" and r.path == "/v1/realtime" for r in inv.routes)
        assert {"/v1/embeddings", "/classify", "/v1/audio/transcriptions"} <= paths
    else:
        assert not dev & paths
    assert any(r.kind == "mount" and r.path == "/metrics" for r in inv.routes)
    for r in inv.routes:
        assert r.guarded == r.path.startswith(("/v1", "/v2", "/inference", "/cohere"))


def test_catalog_files_are_canonical_json() -> None:
    for name in EXPECTED:
        text = (catalog.catalog_dir() / f"{name}.json").read_text(encoding="utf-8")
        assert catalog.load_catalog(name).to_json() == text


def test_fault_tolerance_routes_follow_the_flag() -> None:
    for v in VERSIONS:
        inv = catalog.load_catalog(f"vllm-{v}-everything")
        assert inv.vllm is not None
        has_flag = "--enable-fault-tolerance" in inv.vllm.serve_args
        has_routes = any(r.path.startswith("/fault_tolerance") for r in inv.routes)
        assert has_flag == has_routes, v


def test_load_ref_accepts_names_with_or_without_json_and_files(tmp_path: Path) -> None:
    a = catalog.load_ref("vllm-0.29.0-default")
    assert catalog.load_ref("vllm-0.29.0-default.json") == a
    p = tmp_path / "x.json"
    p.write_text(a.to_json(), encoding="utf-8")
    assert catalog.load_ref(str(p)) == a


def test_unknown_catalog_and_profile() -> None:
    with pytest.raises(UsageError, match=r"no bundled catalog 'vllm-1\.0\.0-default'"):
        catalog.load_catalog("vllm-1.0.0-default")
    with pytest.raises(UsageError, match="unknown profile 'all'"):
        catalog.profile("all")


def test_profiles_are_data() -> None:
    ev = catalog.PROFILES["everything"]
    assert ev.env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    cfg = json.loads(ev.serve_args[ev.serve_args.index("--profiler-config") + 1])
    assert cfg["profiler"] == "torch" and cfg["torch_profiler_dir"].startswith("/")
    spec = ev.extraction("/py")
    assert spec.isolated_env and spec.optional_flags == ("--enable-fault-tolerance", "--enable-scale-out")
    assert spec.model_config == "standin"


def test_resources_prefer_the_wheel_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg, repo = tmp_path / "site" / "scanner", tmp_path / "checkout"
    (pkg / "policies" / "catalog").mkdir(parents=True)
    (repo / "policies").mkdir(parents=True)
    monkeypatch.setattr(resources, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(resources, "REPO_ROOT", repo)
    assert resources.data_dir("policies") == pkg / "policies"
    (pkg / "policies" / "catalog").rmdir()
    (pkg / "policies").rmdir()
    assert resources.data_dir("policies") == repo / "policies"
    with pytest.raises(InternalError, match="data directory 'nothing' not found"):
        resources.data_dir("nothing")


def test_cli_list_show(run_cli: Callable[..., CliResult]) -> None:
    listing = run_cli("inventory", "catalog", "list", "--format", "json")
    assert listing.rc == 0
    assert [e["name"] for e in listing.json()] == list(EXPECTED + LIVE)
    assert [e["version"] for e in listing.json()][-1] == "0.33.0"
    show = run_cli("inventory", "catalog", "show", "vllm-0.29.0-default")
    assert show.rc == 0
    assert "routes from vllm vllm==0.29.0" in show.out
    assert "/invocations" in show.out and "OPEN" in show.out
    as_json = run_cli("inventory", "catalog", "show", "vllm-0.29.0-default", "--format", "json")
    assert as_json.out == (catalog.catalog_dir() / "vllm-0.29.0-default.json").read_text("utf-8")
    run_cli("inventory", "catalog", "show", "nope").assert_one_line_error(2)


def test_cli_build_needs_a_profile_it_knows(run_cli: Callable[..., CliResult]) -> None:
    res = run_cli("inventory", "catalog", "build", "--python", "/x", "--profile", "all")
    assert res.rc == 2 and "Invalid value for '--profile'" in res.err
