"""gRPC surface worker. Runs in the *target's* Python (vLLM's venv, which has grpcio and protobuf).

Standard library at import time; protobuf and grpcio are imported only by the mode that needs
them. Same protocol as ``_worker.py``::

    python _grpc_worker.py REQUEST.json RESULT.json

Modes: ``modules`` (the file descriptors of installed ``*_pb2`` modules), ``descriptor_set`` (a
serialized ``FileDescriptorSet``), ``reflect`` (server reflection against a live ``host:port``).
The result is ``{"ok": true, "data": {...}}`` or ``{"ok": false, "error": {"kind", "message"}}``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import sys
import traceback
from typing import Any

REFLECTION_PACKAGES = ("grpc.reflection.v1", "grpc.reflection.v1alpha")  # tried in this order


class GrpcWorkerError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _method(service: str, m: Any) -> dict[str, Any]:
    """One method of a descriptor_pb2 MethodDescriptorProto (type names lose the leading dot)."""
    return {"service": service, "name": m.name,
            "request": m.input_type.lstrip("."), "response": m.output_type.lstrip("."),
            "client_streaming": bool(m.client_streaming), "server_streaming": bool(m.server_streaming)}


def _file_methods(fdp: Any) -> dict[str, list[dict[str, Any]]]:
    """Service full name -> methods, for one FileDescriptorProto."""
    prefix = f"{fdp.package}." if fdp.package else ""
    return {prefix + s.name: [_method(prefix + s.name, m) for m in s.method] for s in fdp.service}


def _select(found: dict[str, list[dict[str, Any]]], wanted: list[str] | None, where: str
            ) -> list[dict[str, Any]]:
    if wanted:
        missing = [s for s in wanted if s not in found]
        if missing:
            raise GrpcWorkerError("GrpcInventory", f"{where} defines no service {', '.join(missing)} "
                              f"(it defines: {', '.join(sorted(found)) or 'none'})")
        found = {s: found[s] for s in wanted}
    return [m for methods in found.values() for m in methods]


def _distribution(module: str) -> dict[str, str] | None:
    top = module.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return {"name": dist, "version": importlib.metadata.version(dist)}
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _import(name: str) -> Any:
    """``import name``, or ``from parent import child`` (smg-grpc-proto exposes its generated
    modules as lazy attributes of the package: ``from smg_grpc_proto import vllm_engine_pb2``)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        parent, _, child = name.rpartition(".")
        try:
            if parent:
                return getattr(importlib.import_module(parent), child)
        except (ImportError, AttributeError):
            pass
        raise GrpcWorkerError("GrpcInventory", f"cannot import {name} in {sys.executable}: {exc}") from None


def from_modules(req: dict[str, Any]) -> dict[str, Any]:
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")

    found: dict[str, list[dict[str, Any]]] = {}
    packages: dict[str, dict[str, str]] = {}
    for name in req["modules"]:
        module = _import(name)
        file_desc = getattr(module, "DESCRIPTOR", None)
        if file_desc is None or not hasattr(file_desc, "services_by_name"):
            raise GrpcWorkerError("GrpcInventory",
                                  f"{name} is not a generated *_pb2 module (no file DESCRIPTOR)")
        fdp = descriptor_pb2.FileDescriptorProto()
        file_desc.CopyToProto(fdp)
        found.update(_file_methods(fdp))
        dist = _distribution(name)
        if dist is not None:
            packages[dist["name"]] = dist
    where = "modules " + ", ".join(req["modules"])
    return {"methods": _select(found, req.get("services"), where),
            "packages": sorted(packages.values(), key=lambda p: p["name"]), "vllm": _vllm_version()}


def from_descriptor_set(req: dict[str, Any]) -> dict[str, Any]:
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")
    DecodeError = importlib.import_module("google.protobuf.message").DecodeError

    path = str(req["file"])
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        fds = descriptor_pb2.FileDescriptorSet.FromString(raw)
    except OSError as exc:
        raise GrpcWorkerError("GrpcInventory",
                              f"{path}: cannot read descriptor set: {exc.strerror}") from None
    except DecodeError as exc:
        raise GrpcWorkerError("GrpcInventory", f"{path}: not a serialized FileDescriptorSet: {exc}") from None
    found: dict[str, list[dict[str, Any]]] = {}
    for fdp in fds.file:
        found.update(_file_methods(fdp))
    if not found:
        raise GrpcWorkerError("GrpcInventory", f"{path}: the descriptor set defines no service")
    return {"methods": _select(found, req.get("services"), path), "packages": [], "vllm": ""}


def reflection_classes(package: str) -> tuple[Any, Any]:
    """(ServerReflectionRequest, ServerReflectionResponse) of ``package``, built from the subset
    of grpc/reflection/v1/reflection.proto a client needs (grpcio-reflection is not required)."""
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")
    descriptor_pool = importlib.import_module("google.protobuf.descriptor_pool")
    message_factory = importlib.import_module("google.protobuf.message_factory")

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name=f"vllm_perimeter/{package}.proto", package=package,
                                             syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, int, str]], oneof: str = "") -> None:
        msg = fdp.message_type.add(name=name)
        if oneof:
            msg.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name in fields:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = f".{package}.{type_name}"
            if oneof and fname not in ("host", "valid_host", "original_request"):
                field.oneof_index = 0

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("ServerReflectionRequest", [
        ("host", 1, F.TYPE_STRING, opt, ""),
        ("file_by_filename", 3, F.TYPE_STRING, opt, ""),
        ("file_containing_symbol", 4, F.TYPE_STRING, opt, ""),
        ("list_services", 7, F.TYPE_STRING, opt, ""),
    ], oneof="message_request")
    message("ServerReflectionResponse", [
        ("valid_host", 1, F.TYPE_STRING, opt, ""),
        ("original_request", 2, F.TYPE_MESSAGE, opt, "ServerReflectionRequest"),
        ("file_descriptor_response", 4, F.TYPE_MESSAGE, opt, "FileDescriptorResponse"),
        ("list_services_response", 6, F.TYPE_MESSAGE, opt, "ListServiceResponse"),
        ("error_response", 7, F.TYPE_MESSAGE, opt, "ErrorResponse"),
    ], oneof="message_response")
    message("FileDescriptorResponse", [("file_descriptor_proto", 1, F.TYPE_BYTES, rep, "")])
    message("ListServiceResponse", [("service", 1, F.TYPE_MESSAGE, rep, "ServiceResponse")])
    message("ServiceResponse", [("name", 1, F.TYPE_STRING, opt, "")])
    message("ErrorResponse", [("error_code", 1, F.TYPE_INT32, opt, ""),
                              ("error_message", 2, F.TYPE_STRING, opt, "")])
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fdp.SerializeToString())
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{n}"))
                 for n in ("ServerReflectionRequest", "ServerReflectionResponse"))


def _ask(channel: Any, package: str, requests: list[Any], timeout: float) -> list[Any]:
    req_cls, resp_cls = reflection_classes(package)
    call = channel.stream_stream(f"/{package}.ServerReflection/ServerReflectionInfo",
                                 request_serializer=req_cls.SerializeToString,
                                 response_deserializer=resp_cls.FromString)
    return list(call(iter([req_cls(**r) for r in requests]), timeout=timeout))


def reflect(req: dict[str, Any]) -> dict[str, Any]:
    grpc = importlib.import_module("grpc")  # imported by name: never this folder's grpc.py
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")

    target, timeout = str(req["target"]), float(req.get("timeout", 5.0))
    channel = grpc.insecure_channel(target)
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise GrpcWorkerError("Unreachable", f"{target}: no gRPC server answered "
                              f"within {timeout:g}s") from None
        for package in REFLECTION_PACKAGES:
            try:
                listed = _ask(channel, package, [{"list_services": ""}], timeout)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    continue
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise GrpcWorkerError("Unreachable",
                                      f"{target}: {exc.code().name}: {exc.details()}") from None
                raise GrpcWorkerError("GrpcInventory", f"{target}: reflection failed: "
                                  f"{exc.code().name}: {exc.details()}") from None
            services = sorted({s.name for r in listed for s in r.list_services_response.service})
            answers = _ask(channel, package, [{"file_containing_symbol": s} for s in services], timeout)
            break
        else:
            raise GrpcWorkerError("GrpcInventory", f"{target} does not offer server reflection "
                              f"({' or '.join(REFLECTION_PACKAGES)}): UNIMPLEMENTED")
    finally:
        channel.close()
    found: dict[str, list[dict[str, Any]]] = {}
    notes: list[str] = []
    for answer in answers:
        if answer.HasField("error_response"):
            err = answer.error_response
            notes.append(f"{answer.original_request.file_containing_symbol}: reflection error "
                         f"{err.error_code}: {err.error_message}")
        for raw in answer.file_descriptor_response.file_descriptor_proto:
            found.update(_file_methods(descriptor_pb2.FileDescriptorProto.FromString(raw)))
    notes += [f"{s}: listed, but no descriptor was returned for it" for s in services if s not in found]
    methods = [m for s in services for m in found.get(s, [])]
    return {"methods": methods, "reflection": package, "services": services, "notes": notes}


MODES = {"modules": from_modules, "descriptor_set": from_descriptor_set, "reflect": reflect}


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.abspath(__file__))  # never import this project's modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if len(argv) != 3:
        print("usage: _grpc_worker.py REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        req = json.load(fh)
    sys.path[:0] = [str(p) for p in req.get("path", [])]
    try:
        mode = MODES.get(str(req.get("mode")))
        if mode is None:
            raise GrpcWorkerError("GrpcInventory", f"unknown mode {req.get('mode')!r}")
        result: dict[str, Any] = {"ok": True, "data": mode(req)}
    except GrpcWorkerError as exc:
        result = {"ok": False, "error": {"kind": exc.kind, "message": exc.message}}
    except ImportError as exc:  # protobuf or grpcio missing in the target Python
        result = {"ok": False, "error": {"kind": "GrpcInventory", "message":
                  f"{sys.executable} cannot read gRPC descriptors: {exc} (use the Python of "
                  "vLLM's venv, which has grpcio and protobuf)"}}
    except Exception as exc:  # reported as data; the caller turns it into one line
        result = {"ok": False, "error": {
            "kind": "Internal", "message": f"{type(exc).__name__}: {exc}",
            "where": traceback.format_exc(limit=-3).splitlines()[-4:]}}
    tmp = argv[2] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
