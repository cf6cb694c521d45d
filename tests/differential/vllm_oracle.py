"""Run inside vLLM's venv: read JSON lines {"id", "path", "content_type", "body"
(base64), "fields"} on stdin and
write one JSON line per body: how vLLM 0.29's own request model reads it (FastAPI's JSON rule,
Python's json, pydantic's model_validate): {"id", "json": parsed as JSON, "valid": the model
accepted it, "values": {field: the value the model holds}} for the fields asked for that the
model declares (a dotted path: a member of a nested object, ``sampling_params.max_tokens``; None
where the body left a SamplingParams member to vLLM's serving default, is_sampling_param_provided). Standard library and vLLM only (this file is run by path)."""

from __future__ import annotations

import base64
import email.message
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.entrypoints.openai.chat_completion.protocol import (
    BatchChatCompletionRequest,
    ChatCompletionRequest,
)
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

# /v1/embeddings: the input form of vLLM's EmbeddingRequest union (what the openai client sends)
MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
          "/v1/responses": ResponsesRequest, "/v1/chat/completions/batch": BatchChatCompletionRequest,
          "/v1/embeddings": EmbeddingCompletionRequest, "/inference/v1/generate": GenerateRequest}


def nested_value(req: object, path: str) -> object:
    """The value a validated request holds at a dotted path (absent on the way: None); a
    SamplingParams member the body did not set: None (vLLM's serving applies its own default)."""
    head, _, name = path.partition(".")
    parent = getattr(req, head, None)
    if parent is None or not hasattr(parent, name):
        return None
    provided = getattr(req, "is_sampling_param_provided", None)
    if head == "sampling_params" and provided is not None and not provided(name):
        return None
    return getattr(parent, name)


def reads_json(content_type: str | None) -> bool:
    """FastAPI's rule (fastapi/routing.py, get_request_handler)."""
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def judge(item: dict) -> dict:
    out = {"id": item["id"], "json": False, "valid": False, "values": {}}
    if not reads_json(item.get("content_type")):
        return out
    try:
        doc = json.loads(base64.b64decode(item["body"]))
    except ValueError:
        return out
    out["json"] = True
    model = MODELS.get(item["path"])
    if model is None or not isinstance(doc, dict):
        return out
    try:
        req = model.model_validate(doc)
    except Exception:
        return out
    out["valid"] = True
    for name in item.get("fields", ()):
        if "." in name and name.partition(".")[0] in model.model_fields:
            value = nested_value(req, name)
            out["values"][name] = value if value is None or isinstance(value, int | str) else repr(value)
        elif name in model.model_fields:
            value = getattr(req, name)
            out["values"][name] = value if value is None or isinstance(value, int | str) else repr(value)
    return out


def main() -> None:
    import warnings
    warnings.simplefilter("ignore")
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write("ORACLE " + json.dumps(judge(json.loads(line))) + "\n")


if __name__ == "__main__":
    main()
