"""Ground truth for the integration test; runs in vLLM's own Python, not collected by pytest.

    python build_app_routes.py REQUEST.json OUT.json

REQUEST: {"serve_args": [...], "optional_flags": [...], "tasks": [...], "standin": bool}
(optional flags are passed only when this vLLM's parser knows them). Calls vLLM's
build_app() directly and writes to OUT (vLLM logs to stdout, so nothing is printed):

* ``routes``: [path, sorted methods or null, class name] for every entry of app.routes;
* ``bodies``: [path, sorted methods, model qualnames, top-level field names] for every route
  whose handler has a parameter annotated with pydantic models (Annotated, Union unwrapped):
  read from the handler's own signature and the models' ``model_fields``, not from FastAPI's
  body field or a JSON Schema.

Written independently of scanner/inventory/_worker.py on purpose.
"""

import importlib
import inspect
import json
import sys
import typing
from types import SimpleNamespace


def parser_module():
    for name in ("vllm.entrypoints.common.cli_args",     # 0.33
                 "vllm.entrypoints.launchers.cli_args",  # 0.29
                 "vllm.entrypoints.openai.cli_args"):    # 0.28
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise SystemExit("no vLLM serve argument parser found")


def app_module():
    for name in ("vllm.entrypoints.launchers.app", "vllm.entrypoints.openai.api_server"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "build_app"):
            return mod
    raise SystemExit("no build_app found")


class PoolingModelStandIn(SimpleNamespace):
    """A sequence-classification model as route registration sees it (num_labels=1)."""

    def get_pooling_task(self, supported_tasks):
        from vllm.config import ModelConfig

        return ModelConfig.get_pooling_task(self, supported_tasks)


def models_of(annotation):
    """The pydantic models an annotation names (Annotated and Union unwrapped)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out = []
    for arg in typing.get_args(annotation):
        out += [m for m in models_of(arg) if m not in out]
    return out


def handler_bodies(route):
    endpoint = getattr(route, "endpoint", None)
    if endpoint is None or not getattr(route, "methods", None):
        return None
    try:
        params = inspect.signature(endpoint).parameters.values()
    except (TypeError, ValueError):
        return None
    models = [m for p in params for m in models_of(p.annotation)]
    if not models:
        return None
    names = set()
    for m in models:
        for name, info in m.model_fields.items():
            alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
            names.add(alias or name)
    return [route.path, sorted(route.methods), [f"{m.__module__}.{m.__qualname__}" for m in models],
            sorted(names)]


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        req = json.load(fh)
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = parser_module().make_arg_parser(FlexibleArgumentParser())
    known = getattr(parser, "_option_string_actions", {})
    optional = [f for f in req.get("optional_flags", []) if f in known]
    args = parser.parse_args([*req["serve_args"], *optional])
    model_config = None
    if req.get("standin"):
        arch = "BertForSequenceClassification"
        model_config = PoolingModelStandIn(
            architectures=[arch], architecture=arch, runner_type="pooling",
            pooler_config=SimpleNamespace(task=None), io_processor_plugin=None,
            hf_config=SimpleNamespace(num_labels=1, architectures=[arch]))
    app = app_module().build_app(args, supported_tasks=tuple(req["tasks"]),
                                 model_config=model_config)
    rows = [[r.path, sorted(r.methods) if getattr(r, "methods", None) else None,
             type(r).__name__] for r in app.routes]
    bodies = [b for b in map(handler_bodies, app.routes) if b is not None]
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump({"routes": rows, "bodies": bodies}, fh)


if __name__ == "__main__":
    main()
