"""A tiny local model directory for ``vllm-rs render``; runs in vLLM's own Python (it needs the
``tokenizers`` package vLLM depends on), not collected by pytest.

    python build_tiny_model.py DIR

Writes ``config.json`` (a 1-layer llama, no weights: render never loads any), ``tokenizer.json``
(a WordLevel model over a dozen words, ``Whitespace`` pre-tokenizer: vllm-rs's fast loader
does not know it and falls back to Hugging Face tokenizers, which is harmless) and
``tokenizer_config.json`` with a chat template. Nothing is downloaded.
"""

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = ["hello", "world", "the", "a", "user", "assistant", "system", ":", "!", "?", "."]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def main() -> None:
    out = Path(sys.argv[1])
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
        "num_hidden_layers": 1, "vocab_size": len(vocab), "max_position_embeddings": 128,
        "bos_token_id": 1, "eos_token_id": 2, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
    }, indent=1), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 128, "chat_template": CHAT_TEMPLATE,
    }, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
