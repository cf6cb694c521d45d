"""``vllm-perimeter inventory grpc``: the gRPC services and methods a vLLM gRPC server exposes."""

from __future__ import annotations

import sys

import click

from scanner.cli.options import output_options
from scanner.errors import UsageError
from scanner.inventory import grpc
from scanner.output import write_text


@click.command("grpc")
@click.option("--python", "python", default=None, metavar="PATH",
              help="Python that has protobuf (and grpcio for --reflect): vLLM's venv "
                   "(default: this one).")
@click.option("--reflect", "reflect", default=None, metavar="HOST:PORT",
              help="Ask a live server through gRPC server reflection (plaintext).")
@click.option("--catalog", "catalog", default=None, metavar="NAME|FILE",
              help="A bundled gRPC catalog (e.g. vllm-0.33.0) or a file this command wrote.")
@click.option("--module", "modules", multiple=True, metavar="MODULE",
              help="A generated *_pb2 module to read (repeatable; default: the modules vLLM's "
                   "gRPC launcher registers).")
@click.option("--service", "services", multiple=True, metavar="PKG.SERVICE",
              help="Keep only these services of --module/--descriptor-set (repeatable).")
@click.option("--path", "paths", multiple=True, metavar="DIR",
              help="Put DIR first on the Python's sys.path (repeatable), e.g. a "
                   "`pip install --target` directory holding smg-grpc-proto.")
@click.option("--descriptor-set", "descriptor_set", default=None, metavar="FILE",
              help="Read a serialized FileDescriptorSet (protoc --descriptor_set_out) instead.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              metavar="SECONDS", help="Per reflection step (connect, list, describe).")
@output_options
def grpc_cmd(python: str | None, reflect: str | None, catalog: str | None,
             modules: tuple[str, ...], services: tuple[str, ...], paths: tuple[str, ...],
             descriptor_set: str | None, timeout: float, fmt: str, output: str | None) -> None:
    """Every /package.Service/Method of a gRPC surface, with its message types and streaming.

    By default reads the proto descriptors of the services vLLM's gRPC launcher
    (`vllm serve --grpc`) registers, from the packages installed in --python:
    vllm.grpc.engine.VllmEngine (smg-grpc-proto), grpc.health.v1.Health and
    grpc.reflection.v1alpha.ServerReflection. --reflect asks a running server;
    --catalog shows a bundled surface. Provenance names the packages and versions,
    or the server.

    \b
    Examples:
      vllm-perimeter inventory grpc --python ~/venvs/vllm/bin/python
      vllm-perimeter inventory grpc --python ~/venvs/vllm/bin/python --reflect 127.0.0.1:50051
      vllm-perimeter inventory grpc --catalog vllm-0.33.0 --format json
    """
    if sum(x is not None for x in (reflect, catalog, descriptor_set)) > 1:
        raise UsageError("--reflect, --catalog and --descriptor-set are alternatives: give one")
    if (modules or paths) and (reflect or catalog or descriptor_set):
        raise UsageError("--module and --path read installed modules: not with --reflect, "
                         "--catalog or --descriptor-set")
    py = python or sys.executable
    if catalog is not None:
        if python or services:
            raise UsageError("--catalog reads a stored surface: no --python or --service")
        surface = grpc.load(catalog)
    elif reflect is not None:
        if services:
            raise UsageError("--service does not apply to --reflect (every listed service is read)")
        surface = grpc.from_reflection(py, reflect, timeout=timeout)
    elif descriptor_set is not None:
        surface = grpc.from_descriptor_set(py, descriptor_set, services)
    else:
        surface = grpc.from_python(py, modules, services, paths)
    write_text(output, grpc.render(surface, fmt))
