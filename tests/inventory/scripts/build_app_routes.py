"""Ground truth for the integration test; runs in vLLM's own Python, not collected by pytest.

    python build_app_routes.py REQUEST.json OUT.json

REQUEST: {"serve_args": [...], "tasks": [...], "standin": bool}. Calls vLLM's
build_app() directly and writes [path, sorted methods or null, class name] for
every entry of app.routes to OUT (vLLM logs to stdout, so nothing is printed).
Written independently of scanner/inventory/_worker.py on purpose.
"""

import importlib
import json
import sys
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


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        req = json.load(fh)
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = parser_module().make_arg_parser(FlexibleArgumentParser()).parse_args(req["serve_args"])
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
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump(rows, fh)


if __name__ == "__main__":
    main()
