"""``inventory grpc``: vLLM's gRPC surface from proto descriptors and from server reflection.

The descriptor and reflection tests run in the real vLLM 0.29.0 venv's Python (grpcio +
protobuf; VLLM_PERIMETER_VLLM_PYTHON). Its venv has no gRPC extra (smg-grpc-proto,
grpcio-reflection), so a small proto package is built at test time with that venv's protobuf:
``vp_demo_proto`` (two files, one importing the other; every streaming kind), installed as a
distribution ``vp-demo-proto 1.2.3`` in a temporary directory, plus the same files as a
``FileDescriptorSet``. A real grpcio server in that Python serves it on a random loopback port
with reflection: a stand-in reflection service written here from the public
grpc/reflection/v1alpha/reflection.proto (wire format by hand, independent of the tool's
client), or grpcio-reflection itself when that Python can import it (set
VLLM_PERIMETER_GRPC_PATH to a directory holding it; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scanner.cli.inventory import group
from scanner.cli.inventory_grpc import grpc_cmd
from scanner.errors import GrpcInventoryError, TargetUnreachableError
from scanner.inventory import catalog
from scanner.inventory import grpc as g
from tests.inventory.conftest import CliResult

if "grpc" not in group.commands:  # until scanner/cli/inventory.py registers it
    group.add_command(grpc_cmd)

VLLM_0330 = {
    "/grpc.health.v1.Health/Check": "unary",
    "/grpc.health.v1.Health/List": "unary",
    "/grpc.health.v1.Health/Watch": "server-streaming",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "bidi-streaming",
    "/vllm.grpc.engine.VllmEngine/Abort": "unary",
    "/vllm.grpc.engine.VllmEngine/Embed": "unary",
    "/vllm.grpc.engine.VllmEngine/FlushCache": "unary",
    "/vllm.grpc.engine.VllmEngine/Generate": "server-streaming",
    "/vllm.grpc.engine.VllmEngine/GetLoads": "unary",
    "/vllm.grpc.engine.VllmEngine/GetModelInfo": "unary",
    "/vllm.grpc.engine.VllmEngine/GetServerInfo": "unary",
    "/vllm.grpc.engine.VllmEngine/GetTokenizer": "server-streaming",
    "/vllm.grpc.engine.VllmEngine/HealthCheck": "unary",
    "/vllm.grpc.engine.VllmEngine/StartProfile": "unary",
    "/vllm.grpc.engine.VllmEngine/StopProfile": "unary",
    "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents": "server-streaming",
}

DEMO = (
    g.GrpcMethod("vp.demo.Admin", "Flush", "vp.demo.types.Ping", "vp.demo.types.Pong"),
    g.GrpcMethod("vp.demo.Engine", "Chat", "vp.demo.types.Chunk", "vp.demo.types.Chunk", True, True),
    g.GrpcMethod("vp.demo.Engine", "Generate", "vp.demo.types.Ping", "vp.demo.types.Chunk", False, True),
    g.GrpcMethod("vp.demo.Engine", "Ping", "vp.demo.types.Ping", "vp.demo.types.Pong"),
    g.GrpcMethod("vp.demo.Engine", "Upload", "vp.demo.types.Chunk", "vp.demo.types.Pong", True, False),
)
REFLECTION_METHOD = g.GrpcMethod(
    "grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo",
    "grpc.reflection.v1alpha.ServerReflectionRequest",
    "grpc.reflection.v1alpha.ServerReflectionResponse", True, True)

# Runs in vLLM's Python: writes the vp_demo_proto package (generated-module style: each *_pb2
# adds its serialized file to the default pool), its dist-info, and demo.binpb.
BUILD = textwrap.dedent('''
    import os, sys
    from google.protobuf import descriptor_pb2 as d
    out = sys.argv[1]
    F = d.FieldDescriptorProto
    types = d.FileDescriptorProto(name="vp/demo/types.proto", package="vp.demo.types", syntax="proto3")
    for name in ("Ping", "Pong", "Chunk"):
        types.message_type.add(name=name).field.add(name="data", number=1, type=F.TYPE_BYTES,
                                                    label=F.LABEL_OPTIONAL)
    demo = d.FileDescriptorProto(name="vp/demo/demo.proto", package="vp.demo", syntax="proto3",
                                 dependency=["vp/demo/types.proto"])
    engine = demo.service.add(name="Engine")
    for name, req, resp, cs, ss in (("Ping", "Ping", "Pong", 0, 0), ("Generate", "Ping", "Chunk", 0, 1),
                                    ("Upload", "Chunk", "Pong", 1, 0), ("Chat", "Chunk", "Chunk", 1, 1)):
        engine.method.add(name=name, input_type=".vp.demo.types." + req,
                          output_type=".vp.demo.types." + resp, client_streaming=bool(cs),
                          server_streaming=bool(ss))
    demo.service.add(name="Admin").method.add(name="Flush", input_type=".vp.demo.types.Ping",
                                              output_type=".vp.demo.types.Pong")
    pkg = os.path.join(out, "vp_demo_proto")
    os.makedirs(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    head = "from google.protobuf import descriptor_pool\\n"
    with open(os.path.join(pkg, "types_pb2.py"), "w") as fh:
        fh.write(head + f"DESCRIPTOR = descriptor_pool.Default().AddSerializedFile({types.SerializeToString()!r})\\n")
    with open(os.path.join(pkg, "demo_pb2.py"), "w") as fh:
        fh.write(head + "from vp_demo_proto import types_pb2  # noqa\\n"
                 f"DESCRIPTOR = descriptor_pool.Default().AddSerializedFile({demo.SerializeToString()!r})\\n")
    info = os.path.join(out, "vp_demo_proto-1.2.3.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write("Metadata-Version: 2.1\\nName: vp-demo-proto\\nVersion: 1.2.3\\n")
    with open(os.path.join(info, "top_level.txt"), "w") as fh:
        fh.write("vp_demo_proto\\n")
    with open(os.path.join(out, "demo.binpb"), "wb") as fh:
        fh.write(d.FileDescriptorSet(file=[types, demo]).SerializeToString())
''')

# Runs in vLLM's Python: a grpcio server with the demo services (handlers answer empty
# messages) and MODE reflection (standin | grpcio | none). Prints "PORT KIND" once serving.
SERVER = textwrap.dedent('''
    import sys, time
    from concurrent import futures
    import grpc
    from google.protobuf import descriptor_pb2 as d, descriptor_pool
    from vp_demo_proto import demo_pb2
    mode = sys.argv[1]
    server = grpc.server(futures.ThreadPoolExecutor(4))
    one = lambda req, ctx: b""
    many = lambda req, ctx: iter([b""])
    for svc, methods in (("vp.demo.Engine", {
            "Ping": grpc.unary_unary_rpc_method_handler(one),
            "Generate": grpc.unary_stream_rpc_method_handler(many),
            "Upload": grpc.stream_unary_rpc_method_handler(one),
            "Chat": grpc.stream_stream_rpc_method_handler(many)}),
            ("vp.demo.Admin", {"Flush": grpc.unary_unary_rpc_method_handler(one)})):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(svc, methods),))
    SERVICE = "grpc.reflection.v1alpha.ServerReflection"
    names = ["vp.demo.Engine", "vp.demo.Admin", SERVICE]

    def varint(n):
        out = b""
        while True:
            low, n = n & 0x7F, n >> 7
            out += bytes([low | (0x80 if n else 0)])
            if not n:
                return out

    def ld(field, payload):
        return varint(field << 3 | 2) + varint(len(payload)) + payload

    def fields(buf):
        i, out = 0, {}
        while i < len(buf):
            key, shift = 0, 0
            while True:
                b = buf[i]; i += 1; key |= (b & 0x7F) << shift; shift += 7
                if b < 0x80:
                    break
            if key & 7 == 2:
                size, shift = 0, 0
                while True:
                    b = buf[i]; i += 1; size |= (b & 0x7F) << shift; shift += 7
                    if b < 0x80:
                        break
                out[key >> 3] = buf[i:i + size]; i += size
            else:
                raise ValueError("unexpected wire type")
        return out

    own = d.FileDescriptorProto(name="reflection.proto", package="grpc.reflection.v1alpha", syntax="proto3")
    own.message_type.add(name="ServerReflectionRequest")
    own.message_type.add(name="ServerReflectionResponse")
    own.service.add(name="ServerReflection").method.add(
        name="ServerReflectionInfo", input_type=".grpc.reflection.v1alpha.ServerReflectionRequest",
        output_type=".grpc.reflection.v1alpha.ServerReflectionResponse",
        client_streaming=True, server_streaming=True)

    def files_for(symbol):
        if symbol == SERVICE:
            return [own.SerializeToString()]
        fd = descriptor_pool.Default().FindFileContainingSymbol(symbol)
        seen, todo = [], [fd]
        while todo:
            f = todo.pop()
            if f.name not in [s.name for s in seen]:
                seen.append(f); todo.extend(f.dependencies)
        return [f.serialized_pb for f in seen]

    def info(requests, ctx):
        for raw in requests:
            req = fields(raw)
            echo = ld(2, raw)
            if 7 in req:
                yield echo + ld(6, b"".join(ld(1, ld(1, n.encode())) for n in names))
            elif 4 in req:
                try:
                    yield echo + ld(4, b"".join(ld(1, f) for f in files_for(req[4].decode())))
                except KeyError:
                    yield echo + ld(7, b"\\x08\\x05" + ld(2, b"symbol not found"))
            else:
                yield echo + ld(7, b"\\x08\\x0c" + ld(2, b"unimplemented"))

    kind = mode
    if mode == "grpcio":
        from grpc_reflection.v1alpha import reflection
        reflection.enable_server_reflection(names, server)
    elif mode == "standin":
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            SERVICE, {"ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(info)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, kind, flush=True)
    server.wait_for_termination()
''')


@pytest.fixture(scope="module")
def demo(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grpc-demo")
    script = out / "build.py"
    script.write_text(BUILD, encoding="utf-8")
    subprocess.run([vllm_python, str(script), str(out / "pkgs")], check=True, timeout=60)
    return out / "pkgs"


def _extra_path() -> list[str]:
    extra = os.environ.get("VLLM_PERIMETER_GRPC_PATH", "")
    return [p for p in extra.split(os.pathsep) if p]


@pytest.fixture
def serve(vllm_python: str, demo: Path, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Start the demo server in ``mode``; returns ``127.0.0.1:PORT``. Stopped by process group."""
    procs: list[subprocess.Popen[str]] = []
    script = tmp_path / "server.py"
    script.write_text(SERVER, encoding="utf-8")

    def start(mode: str) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(demo), *_extra_path()])}
        proc = subprocess.Popen([vllm_python, str(script), mode], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            if mode == "grpcio" and "grpc_reflection" in err:
                why = (err.strip().splitlines() or [""])[-1][:160]
                pytest.skip("grpcio-reflection is not importable in the vLLM venv (set "
                            f"VLLM_PERIMETER_GRPC_PATH to a directory holding it): {why}")
            pytest.fail(f"demo gRPC server did not start: {err[-500:]}")
        return f"127.0.0.1:{line[0]}"

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# --- the bundled catalog (no vLLM needed) --------------------------------------------------


def test_catalog_vllm_0330_is_what_the_launcher_registers() -> None:
    surface = g.load("vllm-0.33.0")
    assert {m.path: m.kind for m in surface.methods} == VLLM_0330
    assert surface.services == ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                                "vllm.grpc.engine.VllmEngine")
    generate = next(m for m in surface.methods if m.name == "Generate")
    assert (generate.request, generate.response) == ("vllm.grpc.engine.GenerateRequest",
                                                     "vllm.grpc.engine.GenerateResponse")
    prov = surface.provenance
    assert prov.kind == "package" and prov.vllm == "0.33.0"
    assert {p.name for p in prov.packages} == {"smg-grpc-proto", "grpcio-health-checking",
                                               "grpcio-reflection"}
    assert any("no authentication" in n for n in surface.notes)
    text = (g.catalog_dir() / "vllm-0.33.0.json").read_text(encoding="utf-8")
    assert surface.to_json() == text  # canonical: rebuilding it gives the same bytes


def test_grpc_catalog_stays_out_of_the_http_catalog_list() -> None:
    assert g.catalog_names() == ("vllm-0.33.0",)
    assert not any("grpc" in n for n in catalog.names())


def test_surface_round_trips_and_bad_files_are_one_error(tmp_path: Path) -> None:
    surface = g.load("vllm-0.33.0")
    assert g.from_dict(json.loads(surface.to_json()), "x") == surface
    raw = surface.to_dict()
    raw["methods"][0]["path"] = "/evil.Service/Other"
    with pytest.raises(GrpcInventoryError, match=r"is not /grpc\.health\.v1\.Health/Check"):
        g.from_dict(raw, "x")
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "inventory"}', encoding="utf-8")
    with pytest.raises(GrpcInventoryError, match="not a gRPC surface inventory"):
        g.load(str(bad))
    with pytest.raises(GrpcInventoryError, match="neither a gRPC surface file nor a bundled"):
        g.load("vllm-9.9.9")


def test_cli_catalog_table_and_usage_errors(run_cli: Callable[..., CliResult]) -> None:
    res = run_cli("inventory", "grpc", "--catalog", "vllm-0.33.0")
    assert res.rc == 0 and res.out.startswith("16 methods in 3 services")
    assert re.search(r"^/vllm\.grpc\.engine\.VllmEngine/Generate +server-streaming ", res.out, re.M)
    line = run_cli("inventory", "grpc", "--catalog", "vllm-0.33.0", "--reflect", "h:1"
                   ).assert_one_line_error(2)
    assert "alternatives" in line
    line = run_cli("inventory", "grpc", "--reflect", "no-port").assert_one_line_error(2)
    assert "HOST:PORT" in line


def test_python_without_protobuf_is_a_one_line_error(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    # a bare venv has neither protobuf nor grpcio (this tool's own has both now: the limiter's
    # Envoy messages come from xds-protos)
    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")
    line = run_cli("inventory", "grpc", "--python", str(tmp_path / "bare" / "bin" / "python")).assert_one_line_error(2)
    assert "cannot read gRPC descriptors" in line


# --- descriptors in the real vLLM venv's Python --------------------------------------------


def test_descriptors_of_an_installed_proto_package(vllm_python: str, demo: Path) -> None:
    surface = g.from_python(vllm_python, ["vp_demo_proto.demo_pb2"], path=[str(demo)])
    assert surface.methods == DEMO
    assert {m.kind for m in surface.methods} == {"unary", "server-streaming", "client-streaming",
                                                 "bidi-streaming"}
    assert surface.provenance.packages == (g.Package("vp-demo-proto", "1.2.3"),)
    assert surface.provenance.vllm == "0.29.0"
    only = g.from_python(vllm_python, ["vp_demo_proto.demo_pb2"], ["vp.demo.Admin"], [str(demo)])
    assert only.paths == ("/vp.demo.Admin/Flush",)
    with pytest.raises(GrpcInventoryError, match=r"defines no service vp\.demo\.Nope"):
        g.from_python(vllm_python, ["vp_demo_proto.demo_pb2"], ["vp.demo.Nope"], [str(demo)])


def test_descriptor_set_gives_the_same_methods(vllm_python: str, demo: Path) -> None:
    surface = g.from_descriptor_set(vllm_python, str(demo / "demo.binpb"))
    assert surface.methods == DEMO
    assert surface.provenance.kind == "descriptor_set"
    with pytest.raises(GrpcInventoryError, match="not a serialized FileDescriptorSet"):
        g.from_descriptor_set(vllm_python, str(demo / "vp_demo_proto" / "demo_pb2.py"))


def test_default_modules_need_the_grpc_extra(vllm_python: str) -> None:
    has_extra = subprocess.run([vllm_python, "-c", "import smg_grpc_proto"], check=False,
                               capture_output=True, timeout=60).returncode == 0
    if has_extra:
        assert g.from_python(vllm_python).paths == tuple(VLLM_0330)
        return
    with pytest.raises(GrpcInventoryError, match=r"smg_grpc_proto.*pip install vllm\[grpc\]"):
        g.from_python(vllm_python)


def test_cli_json_from_an_installed_package(run_cli: Callable[..., CliResult], vllm_python: str,
                                            demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "surface.json"
    res = run_cli("inventory", "grpc", "--python", vllm_python, "--path", str(demo),
                  "--module", "vp_demo_proto.demo_pb2", "--format", "json", "-o", str(out))
    assert res.rc == 0, res.err
    assert g.load(str(out)).methods == DEMO
    line = run_cli("inventory", "grpc", "--python", vllm_python, "--module", "vp_missing_pb2"
                   ).assert_one_line_error(2)
    assert "cannot import vp_missing_pb2" in line


# --- reflection against a real grpcio server -----------------------------------------------


@pytest.mark.parametrize("mode", ["standin", "grpcio"])
def test_reflection_lists_exactly_the_served_methods(vllm_python: str,
                                                     serve: Callable[[str], str], mode: str) -> None:
    target = serve(mode)
    surface = g.from_reflection(vllm_python, target)
    assert surface.methods == tuple(sorted((*DEMO, REFLECTION_METHOD)))
    assert surface.provenance.kind == "reflection" and surface.provenance.target == target
    assert surface.provenance.reflection == "grpc.reflection.v1alpha"  # v1 answered UNIMPLEMENTED
    assert surface.notes == ()


def test_server_without_reflection_and_unreachable_target(
        run_cli: Callable[..., CliResult], vllm_python: str, serve: Callable[[str], str]) -> None:
    target = serve("none")
    line = run_cli("inventory", "grpc", "--python", vllm_python, "--reflect", target,
                   "--timeout", "2").assert_one_line_error(2)
    assert "does not offer server reflection" in line
    with pytest.raises(TargetUnreachableError):  # nothing listens on port 1
        g.from_reflection(vllm_python, "127.0.0.1:1", timeout=1.0)
    line = run_cli("inventory", "grpc", "--python", vllm_python, "--reflect", "127.0.0.1:1",
                   "--timeout", "1").assert_one_line_error(3)
    assert "no gRPC server answered" in line
