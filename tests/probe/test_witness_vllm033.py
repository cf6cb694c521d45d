"""The witness inside vLLM 0.33.0 too (issue 30, item 3): the exported module loaded by 0.33's own
``--middleware`` flag (parsed by its own arg parser, applied by its build_app) in the real
engine-less app. Only tagged requests are recorded and read back sealed, and what only the witness
sees (the client's X-Forwarded-For claim, the written-in output budget) still fails the probe
through Envoy 1.40, as with 0.29 (tests/probe/test_witness_vllm.py, which has the rest)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from scanner import mutate, witness_asgi
from scanner.cli.witness import MIDDLEWARE, export
from scanner.inventory.catalog import PROFILES, load_ref
from scanner.plan.inputs import load_policy
from scanner.policy.salt import new_secret, read_secret
from scanner.probe.witness import fetch
from scanner.runtime.proxy import EnvoyProxy
from scanner.standin.real import RealVllmServer
from scanner.verify import loop, mutation
from tests.probe.test_witness_vllm import OPTIONS, Witnessed, _options

pytestmark = pytest.mark.vllm

VLLM_033 = Path.home() / ".cache/vllm-perimeter/venvs/vllm-0.33.0/bin/python"


@pytest.fixture(scope="module")
def witnessed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Witnessed]:
    """vLLM 0.33's real app with the exported witness as its own --middleware."""
    if not VLLM_033.exists():
        if os.environ.get("CI"):
            pytest.fail("the vLLM 0.33.0 venv is missing; .ci/run should have provisioned it")
        pytest.skip("vLLM 0.33.0 venv not here")
    work = tmp_path_factory.mktemp("witness-vllm033")
    export(work / "site")
    secret_file = work / "witness.secret"
    new_secret(secret_file)
    spec = PROFILES["everything"].extraction(str(VLLM_033))
    spec = replace(spec, serve_args=(*spec.serve_args, "--middleware", MIDDLEWARE),
                   env={**spec.env, "PYTHONPATH": str(work / "site"),
                        witness_asgi.ENV_SECRET_FILE: str(secret_file)})
    with RealVllmServer(spec) as server:
        setup = loop.setup(load_ref("vllm-0.33.0-everything"), load_policy(None), work, server.port, 2)
        yield Witnessed(server, read_secret(str(secret_file), "witness secret file").decode(), setup)


def test_only_tagged_requests_are_recorded_in_033(witnessed: Witnessed) -> None:
    url, key = witnessed.server.url, witnessed.secret.encode()
    params = {witness_asgi.PROBE_PARAM: "t3-1"}
    tagged = {**params, witness_asgi.TAG_PARAM: witness_asgi.tag(key, params)}
    with httpx.Client(base_url=url, timeout=10) as c:
        plain = c.get("/version", params={witness_asgi.PROBE_PARAM: "t3-2"})
        first = c.get("/version", params=tagged, headers={"X-Forwarded-For": "192.0.2.7"})
        unsealed = c.get(witness_asgi.READ_PATH, params={"prefix": "t3-"})
    assert plain.status_code == first.status_code == 200
    assert first.content == plain.content and first.headers.keys() == plain.headers.keys()
    assert unsealed.status_code == 404            # vLLM's own answer: no MAC, no witness
    seen = asyncio.run(fetch(url, "t3-", 10, secret=witnessed.secret))
    assert set(seen) == {"t3-1"} and seen["t3-1"].path == "/version"
    assert seen["t3-1"].header("x-forwarded-for") == "192.0.2.7"


@pytest.mark.parametrize("op_id", ["envoy.xff-hops-raised", "envoy.written-budget-raised"])
def test_mutants_are_caught_through_the_witness_in_vllm033(witnessed: Witnessed, op_id: str,
                                                          tmp_path: Path) -> None:
    op = mutate.OPERATORS[op_id]
    run = mutation.mutant(witnessed.setup, EnvoyProxy(), op, tmp_path,
                          _options(witnessed, mutation.mutant_options(OPTIONS, op_id)), witnessed.server.url)
    assert run.status == "caught", run
    assert run.rules and run.rules != ("VP011",), run
