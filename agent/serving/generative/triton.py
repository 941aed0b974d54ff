"""Triton's generate extension: POST /v2/models/{m}[/versions/{v}]/generate and /generate_stream.

Request: {"text_input": "...", "parameters": {"max_tokens", "temperature", "top_p", "stop"}} (the parameters may
also sit at the top level, as Triton accepts). /generate answers {"model_name", "model_version", "text_output"};
/generate_stream answers server-sent events, `data: {"model_name", "model_version", "text_output"}` per piece and
a last one with "finish_reason"."""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any
from urllib.parse import unquote

from agent.serving.errors import InvalidInput, MethodNotAllowed, ModelNotFound, NotFound
from agent.serving.generative.engine import GenerativeModel, Usage
from agent.serving.generative.params import KEEPALIVE, sampling_of, sse, texts
from agent.serving.generative.stream import GenerationStream, drain
from agent.serving.http.handlers import Response, json_response
from agent.serving.http.jsondata import parse_json

_PATH = re.compile(r"^/v2/models/(?P<m>[^/]+)(?:/versions/(?P<v>[^/]+))?/(?P<kind>generate|generate_stream)$")


def generate(models: dict[str, GenerativeModel], method: str, path: str, body: bytes | memoryview) -> Response:
    m = _PATH.match(path)
    if m is None:
        raise NotFound(f"no such endpoint: {path}")
    if method != "POST":
        raise MethodNotAllowed(f"{path} allows POST", "POST")
    name = unquote(m["m"])
    model = models.get(name)
    if model is None:
        raise ModelNotFound(f"no generative model {name!r} here (served: {', '.join(models) or 'none'})")
    doc = parse_json(body, what="the request")
    if not isinstance(doc, dict) or not isinstance(doc.get("text_input"), str):
        raise InvalidInput("the request must be a JSON object with a string text_input")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("parameters: expected an object")
    sampling = sampling_of({**{k: v for k, v in doc.items() if k != "parameters"}, **params})
    prompt = model.encode(doc["text_input"])
    lease = model.reserve(prompt, sampling)
    usage = Usage()
    pieces = model.generate(prompt, sampling, usage, lease, streamed=m["kind"] == "generate_stream")
    head = {"model_name": name, "model_version": unquote(m["v"]) if m["v"] else model.version}
    if m["kind"] == "generate_stream":
        stream = GenerationStream(_events(pieces, usage, head), pieces, lease)
        return Response(200, b"", "text/event-stream", headers={"Cache-Control": "no-cache"}, stream=stream)
    text = drain(pieces, lease)
    return json_response(200, {**head, "text_output": text, "finish_reason": usage.finish_reason})


def _events(pieces: Generator[str, None, None], usage: Usage, head: dict[str, Any]) -> Generator[bytes, None, None]:
    for text in texts(pieces):
        yield KEEPALIVE if text is None else sse({**head, "text_output": text})
    yield sse({**head, "text_output": "", "finish_reason": usage.finish_reason})
