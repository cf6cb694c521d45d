"""Run inside vLLM 0.29's venv: vLLM's own length checks on request bodies, engine-less.

    python render_oracle.py MODEL_DIR MAX_MODEL_LEN [MAX_NEW_TOKENS]  < lines

Builds a tiny local model in MODEL_DIR (a 1-layer llama config, no weights; a WordLevel tokenizer
over a few words whose ``Whitespace`` pre-tokenizer makes ``a!a!`` one token per byte, the worst
case, and ``hello `` one token per 6 bytes; a ``role: content`` chat template), starts vLLM's
GPU-less render state on it (``vllm launch render``'s own ``init_render_app_state``, serve
arguments ``--max-model-len MAX_MODEL_LEN`` and, when given, ``--override-generation-config
{"max_new_tokens": N}``), then reads JSON lines {"id", "path", "body"} and renders each body with
``ServingRender.render_chat_request`` / ``render_completion_request``: the authoritative
preprocessing the chat and completion servers delegate to (vllm/entrypoints/scale_out/render/
serving.py), with vLLM's length checks (``TokenizeParams``, vllm/renderers/params.py) and its
output budget (``get_max_tokens``). Writes ``RENDER {"id", "ok", "error", "max_tokens": [...],
"prompt_tokens": [...]}`` per body (one entry per prompt). Standard library, vLLM and tokenizers
only (run by path).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"

WORDS = ["hello", "world", "a", "!", "user", "assistant", "system", ":"]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def build_model(out: Path, window: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
        "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "vocab_size": len(vocab), "max_position_embeddings": window,
        "bos_token_id": 1, "eos_token_id": 2, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
    }), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": window, "chat_template": CHAT_TEMPLATE,
    }), encoding="utf-8")


async def main() -> None:
    from starlette.datastructures import State
    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    model, window = Path(sys.argv[1]), int(sys.argv[2])
    build_model(model, max(window, 8192))
    serve = ["--model", str(model), "--max-model-len", str(window)]
    if len(sys.argv) > 3:
        serve += ["--override-generation-config", json.dumps({"max_new_tokens": int(sys.argv[3])})]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(serve)
    config = AsyncEngineArgs.from_cli_args(args).create_model_config()
    config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    state = State()
    await init_render_app_state(VllmConfig(model_config=config), state, args)
    render = state.serving_render
    for line in sys.stdin:
        item = json.loads(line)
        body = {**json.loads(item["body"]), "model": str(model)}
        out = {"id": item["id"], "ok": False, "error": "", "max_tokens": [], "prompt_tokens": []}
        try:
            if item["path"] == "/v1/completions":
                got = await render.render_completion_request(CompletionRequest.model_validate(body))
            else:
                got = await render.render_chat_request(ChatCompletionRequest.model_validate(body))
        except Exception as e:   # vLLM's validation errors (its server answers 400)
            out["error"] = f"{type(e).__name__}: {e}"[:300]
        else:
            reqs = got if isinstance(got, list) else [got]
            if any(not hasattr(r, "sampling_params") for r in reqs):
                out["error"] = str(getattr(got, "error", got))[:300]
            else:
                out.update(ok=True, max_tokens=[r.sampling_params.max_tokens for r in reqs],
                           prompt_tokens=[len(r.token_ids) for r in reqs])
        print("RENDER " + json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
