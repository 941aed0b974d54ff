"""OpenAI-compatible routes on the inference port: POST /v1/completions, POST /v1/chat/completions (with
`"stream": true`: server-sent events, `data: {...}` per piece and `data: [DONE]`), GET /v1/models.

Chat messages are joined as `role: content` lines and an `assistant:` line (the model's own chat template is not
applied yet: docs/generative.md). Errors are ServingErrors: the HTTP edge (handlers.error_for) gives the status."""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator
from typing import Any

from agent.serving.errors import InvalidInput, MethodNotAllowed, ModelNotFound, NotFound
from agent.serving.generative.engine import GenerativeModel, Usage
from agent.serving.generative.params import KEEPALIVE, sampling_of, sse, texts
from agent.serving.generative.stream import GenerationStream, drain
from agent.serving.http.handlers import Response, json_response
from agent.serving.http.jsondata import parse_json


def chat_prompt(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages: expected a non-empty list of {role, content}")
    lines = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidInput("messages: each needs a string role and a string content")
        lines.append(f"{m['role']}: {m['content']}")
    return "\n".join(lines) + "\nassistant:"


class OpenAIRoutes:
    """Path + body -> Response for the /v1 routes, over the generative models this daemon serves."""

    def __init__(self, models: dict[str, GenerativeModel]) -> None:
        self.models = models

    def __call__(self, method: str, path: str, body: bytes | memoryview) -> Response:
        path = path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            if method not in ("GET", "HEAD"):
                raise MethodNotAllowed(f"{path} allows GET", "GET, HEAD")
            data = [
                {"id": n, "object": "model", "created": m.created, "owned_by": "edge-agent"}
                for n, m in self.models.items()
            ]
            return json_response(200, {"object": "list", "data": data})
        if path not in ("/v1/completions", "/v1/chat/completions"):
            raise NotFound(f"no such endpoint: {path}")
        if method != "POST":
            raise MethodNotAllowed(f"{path} allows POST", "POST")
        doc = parse_json(body, what="the request")
        if not isinstance(doc, dict):
            raise InvalidInput("the request body must be a JSON object")
        chat = path.endswith("/chat/completions")
        return self._complete(doc, chat)

    def _model(self, doc: dict[str, Any]) -> tuple[str, GenerativeModel]:
        name: Any = doc.get("model")
        if name is None and len(self.models) == 1:
            name = next(iter(self.models))
        if not isinstance(name, str) or name not in self.models:
            raise ModelNotFound(f"no generative model {name!r} here (served: {', '.join(self.models) or 'none'})")
        return name, self.models[name]

    def _complete(self, doc: dict[str, Any], chat: bool) -> Response:
        name, model = self._model(doc)
        text: Any = chat_prompt(doc.get("messages")) if chat else doc.get("prompt")
        if not isinstance(text, str):
            raise InvalidInput("prompt: expected a string (lists of prompts are not supported)")
        sampling = sampling_of(doc)
        prompt = model.encode(text)
        lease = model.reserve(prompt, sampling)  # 503 with the reason when the KV budget cannot hold it
        usage = Usage()
        pieces = model.generate(prompt, sampling, usage, lease, streamed=bool(doc.get("stream")))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        head = {"id": rid, "created": int(time.time()), "model": name}
        if doc.get("stream"):
            events = _chat_events(pieces, usage, head) if chat else _text_events(pieces, usage, head)
            stream = GenerationStream(events, pieces, lease)
            return Response(200, b"", "text/event-stream", headers={"Cache-Control": "no-cache"}, stream=stream)
        out = drain(pieces, lease)
        counts = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        }
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": out},
                "finish_reason": usage.finish_reason,
            }
            return json_response(200, {**head, "object": "chat.completion", "choices": [choice], "usage": counts})
        choice = {"index": 0, "text": out, "logprobs": None, "finish_reason": usage.finish_reason}
        return json_response(200, {**head, "object": "text_completion", "choices": [choice], "usage": counts})


def _text_events(
    pieces: Generator[str, None, None], usage: Usage, head: dict[str, Any]
) -> Generator[bytes, None, None]:
    base = {**head, "object": "text_completion"}
    for text in texts(pieces):
        piece = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        yield KEEPALIVE if text is None else sse({**base, "choices": [piece]})
    yield sse({**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": usage.finish_reason}]})
    yield b"data: [DONE]\n\n"


def _chat_events(
    pieces: Generator[str, None, None], usage: Usage, head: dict[str, Any]
) -> Generator[bytes, None, None]:
    base = {**head, "object": "chat.completion.chunk"}
    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    for text in texts(pieces):
        delta = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        yield KEEPALIVE if text is None else sse({**base, "choices": [delta]})
    yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": usage.finish_reason}]})
    yield b"data: [DONE]\n\n"
