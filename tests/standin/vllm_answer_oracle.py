"""Run inside vLLM's venv: read JSON lines {"id", "kind", "doc"} on stdin and write one line per
item: does vLLM 0.29's own response model (the one its server serialises that answer from)
accept ``doc``? {"id", "valid", "error"}. Standard library and vLLM only (this file is run by
path)."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.protocol import CompletionResponse, CompletionStreamResponse
from vllm.entrypoints.openai.responses.protocol import ResponsesResponse, StreamingResponsesResponse
from vllm.entrypoints.pooling.embed.protocol import EmbeddingResponse

MODELS = {
    "chat": ChatCompletionResponse, "chat.chunk": ChatCompletionStreamResponse,
    "completion": CompletionResponse, "completion.chunk": CompletionStreamResponse,
    "embedding": EmbeddingResponse, "response": ResponsesResponse,
}
# vLLM's union leaves out the text events it sends (the openai types it builds them from)
EVENTS = TypeAdapter(StreamingResponsesResponse | ResponseStreamEvent)


def judge(item: dict) -> dict:
    out = {"id": item["id"], "valid": False, "error": ""}
    try:
        if item["kind"] == "response.event":
            event = EVENTS.validate_python(item["doc"])
            if event.type != item["doc"].get("type"):
                raise ValueError(f"read as {event.type}")
        else:
            MODELS[item["kind"]].model_validate(item["doc"])
    except Exception as e:   # reported, not raised
        out["error"] = str(e)[:2000]
        return out
    out["valid"] = True
    return out


def main() -> None:
    import warnings
    warnings.simplefilter("ignore")
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write("ORACLE " + json.dumps(judge(json.loads(line))) + "\n")


if __name__ == "__main__":
    main()
