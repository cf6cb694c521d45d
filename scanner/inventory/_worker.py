"""Route extraction worker. Runs in the *target's* Python (vLLM's own venv).

Standard library only, plus what the target itself provides. Usage::

    python _worker.py REQUEST.json RESULT.json

The request names a mode (``vllm`` or ``asgi``); the result is written to a file
because vLLM logs to stdout, which is never parsed. Exit status is 0 whenever a
result file was written, including a structured error.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import sys
import textwrap
import time
import traceback
from types import SimpleNamespace
from typing import Any


def _load(relative: str, name: str, register: bool = False) -> Any:
    """Load a standard-library-only module of this project by path, without putting this
    folder on sys.path (the worker runs in vLLM's Python, not ours); ``register``: importable
    by ``name`` afterwards (in sys.modules)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), relative)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def standin_witness() -> Any:
    """The stand-in's witness (scanner/standin/_witness.py, its ``LoopbackWitness`` class). It imports the
    witness protocol, ``scanner.witness_asgi``; vLLM's Python has no ``scanner`` package, so that one
    file is loaded by path under its own module name first."""
    if "scanner.witness_asgi" not in sys.modules:
        _load(os.path.join("..", "witness_asgi.py"), "scanner.witness_asgi", register=True)
    return _load(os.path.join("..", "standin", "_witness.py"), "_vllm_perimeter_witness").LoopbackWitness


_walker = _load("_walker.py", "_vllm_perimeter_walker")
find_routes, middleware_names, walk_routes = (
    _walker.find_routes, _walker.middleware_names, _walker.walk_routes)
_bodies = _load("_bodies.py", "_vllm_perimeter_bodies")


def describe_body(route: Any, kind: str) -> dict[str, Any] | None:
    """The route's request body (``_bodies.request_body``); a failure is one route's note."""
    try:
        body: dict[str, Any] | None = _bodies.request_body(route, kind)
    except Exception as exc:  # one odd route must not cost the whole inventory
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return {"source": "unknown", "note": f"inspecting the route failed: {type(exc).__name__}: {first}"}
    return body

# (make_arg_parser module, build_app module), newest first. Verified: 0.28.0, 0.29.0, 0.33.0.
LAYOUTS = (
    ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.app"),
    ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.launchers.app"),
    ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.openai.api_server"),
)
AUTH_MODULES = (
    "vllm.entrypoints.serve.middleware.authenticate",  # 0.29
    "vllm.entrypoints.serve.utils.server_utils",  # 0.28
    "vllm.entrypoints.common.middleware.authenticate",
    "vllm.entrypoints.openai.server_utils",
    "vllm.entrypoints.openai.api_server",
)
SUPPORTED = ((0, 28), (0, 33))


class WorkerError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _version_tuple(v: str) -> tuple[int, int]:
    parts: list[int] = []
    for piece in v.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    padded = [*parts, 0, 0]
    return padded[0], padded[1]


def _layout() -> tuple[Any, Any, str]:
    for args_mod, app_mod in LAYOUTS:
        if _has_module(args_mod) and _has_module(app_mod):
            cli_args = importlib.import_module(args_mod)
            app_module = importlib.import_module(app_mod)
            if hasattr(cli_args, "make_arg_parser") and hasattr(app_module, "build_app"):
                return cli_args, app_module, f"{args_mod}+{app_mod}"
    import vllm

    raise WorkerError(
        "UnsupportedVllm",
        f"vLLM {getattr(vllm, '__version__', '?')} has a layout this tool does not know: "
        "no make_arg_parser/build_app in "
        + "; ".join(f"{a} + {b}" for a, b in LAYOUTS),
    )


def _guarded_prefixes() -> list[str]:
    for name in AUTH_MODULES:
        if not _has_module(name):
            continue
        mod = importlib.import_module(name)
        prefixes = getattr(mod, "GUARDED_PREFIX", None) or getattr(mod, "GUARDED_PREFIXES", None)
        if prefixes:
            return [str(p) for p in prefixes]
        cls = getattr(mod, "AuthenticationMiddleware", None)
        if cls is not None:
            found = _prefixes_from_source(cls)
            if found:
                return found
    raise WorkerError("UnsupportedVllm", "cannot find vLLM's API-key guarded prefixes "
                      f"(looked in {', '.join(AUTH_MODULES)})")


def _prefixes_from_source(cls: Any) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "startswith":
            for arg in node.args:
                if isinstance(arg, ast.Tuple) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in arg.elts
                ):
                    return [e.value for e in arg.elts]  # type: ignore[attr-defined]
    return []


def _plugins() -> list[str]:
    from importlib.metadata import entry_points

    out = []
    for group in ("vllm.endpoint_plugins", "vllm.general_plugins", "vllm.platform_plugins",
                  "vllm.io_processor_plugins"):
        for ep in entry_points(group=group):
            out.append(f"{group}:{ep.name}={ep.value}")
    return sorted(out)


class StandInModelConfig:
    """Offline stand-in for vLLM's ModelConfig: just what route registration reads.

    ``get_pooling_task`` is vLLM's own method, called on this object, so task
    resolution follows the installed version's real rules.
    """

    def __init__(self, architecture: str, num_labels: int) -> None:
        self.architectures = [architecture]
        self.architecture = architecture
        self.pooler_config = SimpleNamespace(task=None)
        self.io_processor_plugin = None
        self.hf_config = SimpleNamespace(num_labels=num_labels, architectures=[architecture])
        self.runner_type = "pooling"

    def get_pooling_task(self, supported_tasks: Any) -> Any:
        from vllm.config import ModelConfig

        return ModelConfig.get_pooling_task(self, supported_tasks)


def _model_config(req: dict[str, Any], args: Any, tasks: tuple[str, ...]) -> tuple[Any, str]:
    choice = req.get("model_config", "auto")
    pooling = False
    try:
        from vllm.tasks import POOLING_TASKS

        pooling = any(t in POOLING_TASKS for t in tasks)
    except ImportError:
        pooling = any(t in ("embed", "classify", "token_embed", "token_classify", "plugin") for t in tasks)
    model = getattr(args, "model", None) or ""
    if choice == "auto":
        if not pooling:
            return None, "none"
        choice = "local" if os.path.isfile(os.path.join(str(model), "config.json")) else "standin"
    if choice == "none":
        return None, "none"
    if choice == "standin":
        return StandInModelConfig(req.get("standin_architecture") or "BertForSequenceClassification",
                                  int(req.get("standin_num_labels", 1))), "standin"
    if choice == "local":
        if not os.path.isfile(os.path.join(str(model), "config.json")):
            raise WorkerError("ServeArgs", f"--model {model!r} is not a local model directory "
                              "(no config.json); use the offline stand-in instead")
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs.from_cli_args(args).create_model_config(), "local"
    raise WorkerError("Usage", f"unknown model_config choice {choice!r}")


def _reject_serve_args(message: str) -> None:
    """Replaces argparse's ``error`` (usage on stderr, exit 2) with a one-line WorkerError."""
    first = message.strip().splitlines()[0] if message.strip() else "invalid arguments"
    raise WorkerError("ServeArgs", f"vLLM rejected the serve arguments: {first}")


def _known_flags(parser: Any, flags: list[str]) -> list[str]:
    """The boolean ``flags`` this version's serve parser knows (others are skipped)."""
    known = getattr(parser, "_option_string_actions", {})
    return [str(f) for f in flags if f in known]


def _front_door(args: Any) -> None:
    """Refuse when ``vllm serve`` with these arguments and this environment would not serve the
    Python app (read as vLLM's own ``serve`` command decides, 0.28-0.33): the gRPC launcher
    (``--grpc``), the Rust frontend (``VLLM_USE_RUST_FRONTEND``, also behind ``--grpc-port``), or
    no API server at all (``--headless``). Its route table would then describe nothing that answers."""
    if getattr(args, "grpc", False):
        raise WorkerError("OtherServer", "with --grpc, `vllm serve` runs the gRPC server instead of "
                          "this HTTP app: its HTTP route table would describe nothing that answers")
    if getattr(args, "headless", False):
        raise WorkerError("OtherServer", "with --headless, `vllm serve` starts no API server: "
                          "there are no HTTP routes to inventory")
    envs = importlib.import_module("vllm.envs")
    if getattr(envs, "VLLM_USE_RUST_FRONTEND", False) or getattr(args, "grpc_port", None) is not None:
        raise WorkerError("OtherServer", "with VLLM_USE_RUST_FRONTEND=1, HTTP is served by the Rust "
                          "frontend (vllm-rs), not this Python app: inventory the running server "
                          "with `inventory live URL` instead")


def _build_vllm(req: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """Build the real vLLM app for the request: (app, parsed serve args, facts)."""
    started = time.monotonic()
    if not _has_module("vllm"):
        raise WorkerError("VllmNotFound", f"{sys.executable} has no vllm package installed")
    import vllm

    version = str(getattr(vllm, "__version__", "0"))
    lo, hi = SUPPORTED
    if not (lo <= _version_tuple(version) <= hi) and not req.get("allow_unsupported"):
        raise WorkerError(
            "UnsupportedVllm",
            f"vLLM {version} is outside the supported range "
            f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]} (pass --allow-unsupported to try anyway)",
        )
    cli_args, app_module, layout = _layout()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = cli_args.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    parser.error = _reject_serve_args
    serve_args = list(req.get("serve_args", []))
    serve_args += _known_flags(parser, req.get("optional_flags", []))
    try:
        args = parser.parse_args(serve_args)
    except SystemExit:
        raise WorkerError("ServeArgs", "vLLM rejected the serve arguments "
                          "(run `vllm serve --help`)") from None
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    validate = getattr(cli_args, "validate_parsed_serve_args", None)
    if validate is not None:
        try:
            validate(args)
        except (TypeError, ValueError) as exc:
            raise WorkerError("ServeArgs", f"vLLM rejected the serve arguments: {exc}") from None
    _front_door(args)
    tasks = tuple(req.get("tasks") or ("generate",))
    model_config, model_config_kind = _model_config(req, args, tasks)
    imported = time.monotonic()
    kwargs: dict[str, Any] = {"supported_tasks": tasks}
    params = inspect.signature(app_module.build_app).parameters
    if "model_config" in params:
        kwargs["model_config"] = model_config
    elif model_config is not None:
        raise WorkerError("UnsupportedVllm", "this vLLM's build_app takes no model_config")
    app = app_module.build_app(args, **kwargs)
    built = time.monotonic()
    api_key = bool(getattr(args, "api_key", None)) or bool(os.environ.get("VLLM_API_KEY"))
    return app, args, {
        "version": version,
        "layout": layout,
        "serve_args": serve_args,
        "tasks": list(tasks),
        "model_config": model_config_kind,
        "plugins": _plugins(),
        "guarded_prefixes": _guarded_prefixes(),
        "root_path": getattr(args, "root_path", None) or "",
        "api_key_configured": api_key,
        "timings": {"import_s": imported - started, "build_s": built - imported},
    }


def extract_vllm(req: dict[str, Any]) -> dict[str, Any]:
    app, _, facts = _build_vllm(req)
    routes = find_routes(app)
    if routes is None:
        raise WorkerError("UnsupportedVllm", "build_app returned an object with no routes")
    return {**facts, "middleware": middleware_names(app),
            "routes": walk_routes(routes, describe=describe_body)}


def serve_vllm(req: dict[str, Any], result_path: str) -> None:
    """Serve the real app engine-less (uvicorn, lifespan off) until killed.

    Handlers that need the engine answer 500; routing, middleware and the
    API-key check are vLLM's own. TLS comes from vLLM's own --ssl-* serve flags.
    """
    import uvicorn

    app, args, facts = _build_vllm(req)
    if req.get("witness"):   # record what reaches the app, for the prober (scanner/standin/_witness.py)
        app = standin_witness()(app)
    _write_result(result_path, {"ok": True, "data": {**facts, "pid": os.getpid()}})
    uvicorn.run(
        app, host=str(req.get("host", "127.0.0.1")), port=int(req["port"]), lifespan="off",
        log_level="warning", access_log=False,
        ssl_keyfile=getattr(args, "ssl_keyfile", None), ssl_certfile=getattr(args, "ssl_certfile", None),
        ssl_ca_certs=getattr(args, "ssl_ca_certs", None),
        ssl_cert_reqs=int(getattr(args, "ssl_cert_reqs", 0) or 0),
    )


def _import_target(target: str) -> Any:
    """``module:attr.path`` -> the object, or a WorkerError saying what is missing."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise WorkerError("AppLoad", f"{target!r} is not of the form module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise WorkerError("AppLoad", f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself failed while importing
        raise WorkerError("AppLoad", f"importing module {module_name!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise WorkerError("AppLoad", f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _call_factory(target: str, factory: Any) -> Any:
    if not callable(factory):
        raise WorkerError("AppLoad", f"{target} is a {type(factory).__name__}, not callable "
                          "(--factory needs a zero-argument function returning an app)")
    try:
        return factory()
    except TypeError as exc:
        raise WorkerError("AppLoad", f"{target} is not a zero-argument app factory: "
                          f"{exc}") from None


def _app_routes(target: str, obj: Any) -> tuple[Any, Any]:
    """The app (unwrapping ASGI middleware through ``.app``) and its route list."""
    app = obj
    for _ in range(16):
        routes = None if isinstance(app, type) else find_routes(app)
        if isinstance(routes, (list, tuple)):
            return app, routes
        app = getattr(app, "app", None)
        if app is None:
            break
    what = "a class" if isinstance(obj, type) else f"a {type(obj).__name__}"
    raise WorkerError("AppLoad", f"{target} is {what}, not a Starlette/FastAPI app "
                      "(it has no route table)")


def extract_asgi(req: dict[str, Any]) -> dict[str, Any]:
    target = str(req["target"])
    if req.get("app_dir"):
        sys.path.insert(0, str(req["app_dir"]))
    obj = _import_target(target)
    if req.get("factory") or (inspect.isfunction(obj) and find_routes(obj) is None):
        obj = _call_factory(target, obj)
    app, routes = _app_routes(target, obj)
    return {"middleware": middleware_names(app), "routes": walk_routes(routes, describe=describe_body)}


def _drop_own_dir() -> None:
    """``python _worker.py`` puts this folder first on sys.path; an app must not import from it."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def main(argv: list[str]) -> int:
    _drop_own_dir()
    if len(argv) != 3:
        print("usage: _worker.py REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        req = json.load(fh)
    try:
        if req.get("mode") == "serve":
            serve_vllm(req, argv[2])
            return 0
        data = extract_vllm(req) if req.get("mode") == "vllm" else extract_asgi(req)
        result: dict[str, Any] = {"ok": True, "data": data}
    except WorkerError as exc:
        result = {"ok": False, "error": {"kind": exc.kind, "message": exc.message}}
    except Exception as exc:  # reported as data; the caller turns it into one line
        result = {"ok": False, "error": {
            "kind": "Internal",
            "message": f"{type(exc).__name__}: {exc}",
            "where": traceback.format_exc(limit=-3).splitlines()[-4:],
        }}
    _write_result(argv[2], result)
    return 0


def _write_result(path: str, result: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
