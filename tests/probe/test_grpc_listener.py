"""The gRPC listener (issue 11, item 4): vLLM's gRPC server (no key check of its own) behind
Envoy's HTTP/2 listener, default deny per method of the gRPC inventory, the same keys, roles and
networks as the HTTP routes; proven by the probe's gRPC calls against a real gRPC server (the
stand-in servicer in vLLM's venv, grpcio), and a forwarded denied method caught."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path

import pytest

from scanner import mutate
from scanner.errors import GenerateError, PolicyError
from scanner.generate.interface import GenerateOptions
from scanner.generate.nginx import NginxGenerator
from scanner.inventory.catalog import load_ref
from scanner.net import free_port
from scanner.plan.build import build
from scanner.policy.load import loads
from scanner.probe import grpc_call
from scanner.probe.interface import ProbeOptions, Target
from scanner.probe.runner import probe
from scanner.resources import data_dir
from scanner.runtime.proxy import EnvoyProxy
from scanner.standin.grpc_standin import GrpcStandin
from scanner.standin.serve import StandinThread
from scanner.verify import loop

CATALOG = "vllm-0.29.0-default"
ENGINE = "/vllm.grpc.engine.VllmEngine"
GRPC = f"""
grpc:
  inventory: vllm-0.33.0
  methods:
    - {{method: {ENGINE}/Generate, audience: inference}}
    - {{method: {ENGINE}/GetModelInfo, audience: inference}}
    - {{method: /grpc.health.v1.Health/Check, audience: monitoring}}
    - {{method: {ENGINE}/FlushCache, audience: operator}}
"""
OPTIONS = ProbeOptions(rate=0, concurrency=8, timeout=15, max_time=120, checks=("grpc",))


def _policy(extra: str = GRPC):  # type: ignore[no-untyped-def]
    text = (data_dir("policies") / "vllm-default.yaml").read_text(encoding="utf-8")
    return loads(text + extra, source="policy.yaml")


def test_the_plan_denies_every_method_no_rule_names_and_lists_what_protobuf_hides() -> None:
    plan = build(load_ref(CATALOG), _policy())
    g = plan.grpc
    assert g is not None and len(g.decisions) == 16
    allowed = {d.path: d.audience for d in g.allowed}
    assert allowed == {f"{ENGINE}/Generate": "inference", f"{ENGINE}/GetModelInfo": "inference",
                       "/grpc.health.v1.Health/Check": "monitoring", f"{ENGINE}/FlushCache": "operator"}
    assert f"{ENGINE}/Abort" in g.uncovered and "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo" \
        in g.uncovered
    assert any(line.startswith(f"{ENGINE}/Generate: the audience's json caps") for line in g.unenforced)
    flush = g.decision(f"{ENGINE}/FlushCache")
    assert flush is not None and flush.state_changing
    assert "grpc" in plan.body_dict()


@pytest.mark.parametrize(("extra", "message"), [
    (GRPC.replace("Generate, audience", "Generate, audience: nobody, x"), "unknown"),
    ("\ngrpc:\n  inventory: vllm-0.33.0\n  methods:\n    - {method: /a.B/*, audience: inference}\n"
     "    - {method: /a.B/C, audience: operator}\n", "overlaps"),
    ("\ngrpc:\n  inventory: vllm-0.33.0\n  methods:\n    - {method: a.B/C, audience: inference}\n",
     "is not a gRPC method"),
])
def test_bad_grpc_sections_name_the_line(extra: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        _policy(extra)
    assert "policy.yaml:" in str(err.value) and message in str(err.value)


def test_nginx_refuses_a_grpc_listener(tmp_path: Path) -> None:
    plan = build(load_ref(CATALOG), _policy())
    with pytest.raises(GenerateError, match="generated for Envoy only"):
        NginxGenerator().render(plan, GenerateOptions(output_dir=str(tmp_path)))


@pytest.fixture
def grpc_python(vllm_python: str) -> str:
    return vllm_python


def _run(tmp_path: Path, python: str, mutant: str = ""):  # type: ignore[no-untyped-def]
    inventory = load_ref(CATALOG)
    http_port, grpc_port = free_port(), free_port()
    s = loop.setup(inventory, _policy(), tmp_path, http_port, grpc_upstream_port=grpc_port)
    assert s.plan.grpc is not None
    proxy = EnvoyProxy()
    directory = tmp_path / "envoy"
    written = proxy.write(s.plan, directory)
    if mutant:
        mutate.OPERATORS[f"envoy.{mutant}"].apply(written, s.plan)
    methods = tuple(d.path for d in s.plan.grpc.decisions)
    with ExitStack() as stack, StandinThread(inventory, "127.0.0.1", http_port) as standin, \
            GrpcStandin(python, methods, grpc_port) as upstream:
        loop.start_checked(proxy, s.plan, directory, stack)
        res = probe(s.plan, Target(f"http://127.0.0.1:{s.plan.listen.port}"), s.credentials, s.vantages,
                    loop.probe_options(s, OPTIONS, standin.url))
        return s, res, upstream.calls()


def test_the_grpc_listener_is_proved_against_a_real_grpc_server(tmp_path: Path, grpc_python: str) -> None:
    _s, res, calls = _run(tmp_path, grpc_python)
    assert not res.findings, [(f.rule, f.title, f.detail[:200]) for f in res.findings]
    cov = [c for c in res.coverage if c.check == "grpc"]
    assert len(cov) == 17 and all(c.status == "proved" for c in cov), [(c.subject, c.status, c.why) for c in cov]
    reached = {c.method for c in calls}
    # only the allowed methods reached vLLM's gRPC server, never with the client's key
    assert reached == {f"{ENGINE}/Generate", f"{ENGINE}/GetModelInfo", "/grpc.health.v1.Health/Check",
                       f"{ENGINE}/FlushCache"}
    assert not any(c.authorization for c in calls)
    assert {c.principal for c in calls if c.method == f"{ENGINE}/FlushCache"} == {"verify-operator-1"}
    denied = [a for a in res.attempts if a.expected == "deny"]
    assert denied and all(a.decision == "deny" for a in denied)


def test_a_denied_method_forwarded_is_caught(tmp_path: Path, grpc_python: str) -> None:
    _s, res, calls = _run(tmp_path, grpc_python, mutant="grpc-denied-method-forwarded")
    assert any(f.rule == "VP001" and f.check == "grpc" and f.path == "/grpc.health.v1.Health/List" for f in res.findings), \
        [(f.rule, f.title) for f in res.findings]
    assert any(c.method not in {f"{ENGINE}/Generate", f"{ENGINE}/GetModelInfo", "/grpc.health.v1.Health/Check",
                                f"{ENGINE}/FlushCache"} for c in calls)


def test_a_grpc_call_answers_status_and_trailers(grpc_python: str) -> None:
    port = free_port()
    with GrpcStandin(grpc_python, (f"{ENGINE}/Generate",), port):
        status, headers = asyncio.run(grpc_call.call("127.0.0.1", port, f"{ENGINE}/Generate"))
        assert (status, headers.get("grpc-status"), headers.get("x-vp-standin")) == (200, "0", "1")
        status, headers = asyncio.run(grpc_call.call("127.0.0.1", port, f"{ENGINE}/Abort"))
        assert (status, headers.get("grpc-status")) == (200, "12")
