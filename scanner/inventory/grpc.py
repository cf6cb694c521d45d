"""Inventory of a gRPC surface: every ``/package.Service/Method``, read from proto descriptors.

Three sources, one frozen model (:class:`GrpcSurface`):

* the file descriptors of installed ``*_pb2`` modules, or of a serialized ``FileDescriptorSet``,
  read in a Python that has protobuf (vLLM's venv) by ``_grpc_worker.py``;
* server reflection against a live ``host:port`` (v1, then v1alpha), from a Python that has
  grpcio (vLLM's venv; this tool does not depend on grpcio);
* a bundled catalog (``policies/catalog/grpc/<name>.json``) or a file this module wrote.

``policies/catalog/grpc/vllm-0.33.0.json`` was made so (the vLLM venvs lack the gRPC extra)::

    pip download smg-grpc-proto==0.4.28 grpcio-health-checking==1.85.1 \\
        grpcio-reflection==1.85.1 --no-deps -d W
    pip install --no-deps --target T W/*.whl
    vllm-perimeter inventory grpc --python ~/venvs/vllm-0.33.0/bin/python --path T \\
        --format json -o policies/catalog/grpc/vllm-0.33.0.json

By default the modules are the ones vLLM's gRPC launcher registers (``vllm serve --grpc``,
``vllm/entrypoints/launchers/grpc_server.py`` in 0.30-0.33, ``vllm/entrypoints/grpc_server.py``
in 0.28-0.29): the ``VllmEngine`` service of ``smg-grpc-proto``, the standard health service
and server reflection v1alpha (:data:`VLLM_LAUNCHER`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scanner import canonical, resources
from scanner.errors import GrpcInventoryError, PerimeterError, TargetUnreachableError
from scanner.inventory._runner import run_worker

WORKER = Path(__file__).with_name("_grpc_worker.py")
ProvenanceKind = Literal["package", "descriptor_set", "reflection"]
_KINDS: tuple[ProvenanceKind, ...] = ("package", "descriptor_set", "reflection")
_ERRORS: dict[str, type[PerimeterError]] = {
    "GrpcInventory": GrpcInventoryError, "Unreachable": TargetUnreachableError}
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


@dataclass(frozen=True)
class Launcher:
    """What a gRPC launcher registers: proto modules and the services of theirs it serves."""

    modules: tuple[str, ...]
    services: tuple[str, ...]
    notes: tuple[str, ...] = ()


# Read from vLLM's launcher (0.28-0.33): add_VllmEngineServicer_to_server,
# add_HealthServicer_to_server, reflection.enable_server_reflection (grpc_reflection.v1alpha).
VLLM_LAUNCHER = Launcher(
    modules=("smg_grpc_proto.vllm_engine_pb2", "grpc_health.v1.health_pb2",
             "grpc_reflection.v1alpha.reflection_pb2"),
    services=("vllm.grpc.engine.VllmEngine", "grpc.health.v1.Health",
              "grpc.reflection.v1alpha.ServerReflection"),
    notes=(
        "vllm serve --grpc: grpc.aio server on server.add_insecure_port(host:port) (default "
        "0.0.0.0:50051): plaintext, no TLS",
        "no authentication: --api-key and VLLM_API_KEY guard only the HTTP app, no gRPC "
        "interceptor checks metadata",
        "server reflection v1alpha is always on: any client can list every service and message",
        "grpc.health.v1.Health/List is routed but not implemented by vLLM's health servicer "
        "(UNIMPLEMENTED)",
        "SMG_VLLM_SERVICER_IMPL=rust (smg-grpc-servicer) serves the same VllmEngine contract "
        "from a Rust servicer instead",
    ),
)


@dataclass(frozen=True, order=True)
class GrpcMethod:
    """One RPC. ``path`` is what goes on the wire as HTTP/2 ``:path``."""

    service: str
    name: str
    request: str
    response: str
    client_streaming: bool = False
    server_streaming: bool = False

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def kind(self) -> str:
        return {(False, False): "unary", (False, True): "server-streaming",
                (True, False): "client-streaming", (True, True): "bidi-streaming"}[
            (self.client_streaming, self.server_streaming)]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "service": self.service, "name": self.name,
                "request": self.request, "response": self.response,
                "client_streaming": self.client_streaming, "server_streaming": self.server_streaming}


@dataclass(frozen=True)
class Package:
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Provenance:
    """Where the methods were read: installed packages (with versions), a descriptor set file,
    or reflection against ``target`` (``reflection`` names the protocol version that answered)."""

    kind: ProvenanceKind
    target: str
    packages: tuple[Package, ...] = ()
    vllm: str = ""
    reflection: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "vllm": self.vllm,
                "packages": [{"name": p.name, "version": p.version} for p in self.packages],
                "reflection": self.reflection}


@dataclass(frozen=True)
class GrpcSurface:
    provenance: Provenance
    methods: tuple[GrpcMethod, ...]
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(sorted(set(self.methods))))

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(sorted({m.service for m in self.methods}))

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(m.path for m in self.methods)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "grpc-surface", "provenance": self.provenance.to_dict(),
                "services": list(self.services), "methods": [m.to_dict() for m in self.methods],
                "notes": list(self.notes)}

    def to_json(self) -> str:
        return canonical.dumps(self.to_dict())


def from_dict(raw: Any, where: str) -> GrpcSurface:
    """The surface in ``raw`` (what :meth:`GrpcSurface.to_dict` wrote); :class:`GrpcInventoryError`
    naming ``where`` otherwise."""
    try:
        if raw.get("kind") != "grpc-surface":
            raise ValueError("kind is not 'grpc-surface'")
        prov = raw["provenance"]
        if prov["kind"] not in _KINDS:
            raise ValueError(f"unknown provenance kind {prov['kind']!r}")
        provenance = Provenance(
            kind=prov["kind"], target=str(prov["target"]), vllm=str(prov.get("vllm", "")),
            packages=tuple(Package(str(p["name"]), str(p["version"])) for p in prov.get("packages", ())),
            reflection=str(prov.get("reflection", "")))
        methods = tuple(_method(m) for m in raw["methods"])
        for m, m_raw in zip(methods, raw["methods"], strict=True):
            if m_raw.get("path", m.path) != m.path:
                raise ValueError(f"method path {m_raw['path']!r} is not /{m.service}/{m.name}")
        return GrpcSurface(provenance, methods, tuple(str(n) for n in raw.get("notes", ())))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise GrpcInventoryError(f"{where}: not a gRPC surface inventory: {exc}") from None


def _method(raw: Mapping[str, Any]) -> GrpcMethod:
    for key in ("client_streaming", "server_streaming"):
        if not isinstance(raw.get(key, False), bool):
            raise ValueError(f"{key} must be true or false")
    return GrpcMethod(service=str(raw["service"]), name=str(raw["name"]),
                      request=str(raw["request"]), response=str(raw["response"]),
                      client_streaming=raw.get("client_streaming", False),
                      server_streaming=raw.get("server_streaming", False))


# --- sources -------------------------------------------------------------------------------


def from_python(python: str, modules: Sequence[str] = (), services: Sequence[str] = (),
                path: Sequence[str] = (), timeout: float = 120.0) -> GrpcSurface:
    """The services of installed ``*_pb2`` ``modules`` (default: vLLM's launcher) in ``python``;
    ``path`` entries go first on its ``sys.path`` (e.g. a ``pip install --target`` directory)."""
    launcher = None if modules else VLLM_LAUNCHER
    mods = tuple(modules) or VLLM_LAUNCHER.modules
    wanted = tuple(services) or (launcher.services if launcher else ())
    request = {"mode": "modules", "modules": list(mods), "services": list(wanted),
               "path": [os.path.abspath(p) for p in path]}
    try:
        data = _run(python, request, timeout)
    except GrpcInventoryError as exc:
        if launcher is None or "cannot import" not in exc.message:
            raise
        raise GrpcInventoryError(f"{exc.message} (vLLM's gRPC server needs `pip install "
                                 "vllm[grpc]`; or give --path DIR holding smg-grpc-proto, "
                                 "grpcio-health-checking and grpcio-reflection)") from None
    provenance = Provenance(
        kind="package", target=", ".join(mods), vllm=str(data.get("vllm", "")),
        packages=tuple(Package(str(p["name"]), str(p["version"])) for p in data["packages"]))
    return GrpcSurface(provenance, _methods(data), launcher.notes if launcher else ())


def from_descriptor_set(python: str, file: str, services: Sequence[str] = (),
                        timeout: float = 120.0) -> GrpcSurface:
    """The services of a serialized ``FileDescriptorSet`` (``protoc --descriptor_set_out``,
    ``buf build -o``), parsed in ``python`` (it needs protobuf)."""
    data = _run(python, {"mode": "descriptor_set", "file": os.path.abspath(file),
                         "services": list(services)}, timeout)
    return GrpcSurface(Provenance(kind="descriptor_set", target=file), _methods(data))


def from_reflection(python: str, target: str, timeout: float = 5.0) -> GrpcSurface:
    """The services a live server lists through server reflection, each method read from the
    file descriptor the server returns for it. Plaintext HTTP/2 (as vLLM's launcher serves)."""
    if not _HOST_PORT.match(target) or not 0 < int(target.rsplit(":", 1)[1]) < 65536:
        raise GrpcInventoryError(f"--reflect expects HOST:PORT, got {target!r}")
    data = _run(python, {"mode": "reflect", "target": target, "timeout": timeout},
                timeout=6 * timeout + 60)
    provenance = Provenance(kind="reflection", target=target, reflection=str(data["reflection"]))
    return GrpcSurface(provenance, _methods(data), tuple(str(n) for n in data.get("notes", ())))


def _methods(data: Mapping[str, Any]) -> tuple[GrpcMethod, ...]:
    return tuple(_method(m) for m in data["methods"])


def _run(python: str, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``_grpc_worker.py`` in ``python`` and return its ``data``."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return run_worker(python, request, env, timeout=timeout, worker=WORKER, what="reading the gRPC surface")


# --- catalogs ------------------------------------------------------------------------------


def catalog_dir() -> Path:
    return resources.data_dir("policies") / "catalog" / "grpc"


def catalog_names() -> tuple[str, ...]:
    folder = catalog_dir()
    return tuple(sorted(p.stem for p in folder.glob("*.json"))) if folder.is_dir() else ()


def load(ref: str) -> GrpcSurface:
    """A bundled gRPC catalog by name (``vllm-0.33.0``), or a surface JSON file."""
    path = Path(ref)
    if not path.is_file() and ref.removesuffix(".json") in catalog_names():
        path = catalog_dir() / f"{ref.removesuffix('.json')}.json"
    elif not path.is_file():
        raise GrpcInventoryError(f"{ref!r} is neither a gRPC surface file nor a bundled gRPC catalog "
                                 f"(bundled: {', '.join(catalog_names()) or 'none'})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GrpcInventoryError(f"{path}: cannot read gRPC surface: {exc}") from None
    return from_dict(raw, str(path))


# --- rendering -----------------------------------------------------------------------------


def render(surface: GrpcSurface, fmt: str) -> str:
    if fmt == "json":
        return surface.to_json()
    rows = [(m.path, m.kind, m.request, m.response) for m in surface.methods]
    head = ("method", "streaming", "request", "response")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    lines = [f"{len(surface.methods)} methods in {len(surface.services)} services "
             f"({_describe(surface.provenance)})", ""]
    for r in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3])
    lines += [f"note: {n}" for n in surface.notes]
    return "\n".join(lines) + "\n"


def _describe(p: Provenance) -> str:
    if p.kind == "reflection":
        return f"server reflection {p.reflection} at {p.target}"
    if p.kind == "descriptor_set":
        return f"descriptor set {p.target}"
    pkgs = ", ".join(str(pkg) for pkg in p.packages) or p.target
    return pkgs + (f"; vllm=={p.vllm}" if p.vllm else "")
