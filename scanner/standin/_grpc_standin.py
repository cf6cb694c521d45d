"""A gRPC stand-in for vLLM's gRPC server, run in a Python that has grpcio (vLLM's venv):
``python _grpc_standin.py PORT METHODS_JSON RECORD_FILE``. It serves exactly the methods listed
(``["/package.Service/Method", ...]``; any other is UNIMPLEMENTED, as on a real server), answers
each call with one empty message and the initial metadata ``x-vp-standin: 1``, and appends one
JSON line per call to RECORD_FILE: the method and the metadata names it received (with the value
of ``x-perimeter-principal``; never a key). Standard library and grpcio only."""

from __future__ import annotations

import functools
import importlib
import json
import sys
import threading
from concurrent import futures
from typing import Any

_LOCK = threading.Lock()


def _answer(record: str, method: str, request: bytes, context: Any) -> bytes:
    meta = dict(context.invocation_metadata())
    line = {"method": method, "metadata": sorted(meta), "principal": meta.get("x-perimeter-principal", ""),
            "authorization": "authorization" in meta}
    with _LOCK, open(record, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    context.send_initial_metadata((("x-vp-standin", "1"),))
    return b""


def serve(port: int, methods: list[str], record: str) -> None:
    grpc: Any = importlib.import_module("grpc")
    services: dict[str, dict[str, Any]] = {}
    for path in methods:
        service, _, name = path.lstrip("/").rpartition("/")
        handler = functools.partial(_answer, record, path)
        services.setdefault(service, {})[name] = grpc.unary_unary_rpc_method_handler(handler)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers(tuple(grpc.method_handlers_generic_handler(s, h)
                                          for s, h in sorted(services.items())))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    with open(sys.argv[2], encoding="utf-8") as fh:
        wanted = json.load(fh)
    serve(int(sys.argv[1]), wanted, sys.argv[3])
