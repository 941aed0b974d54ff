"""Open Inference Protocol (KServe v2) routes: path + body in, (status, body, headers) out; no sockets here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import numpy as np

from agent.errors import ServingError
from agent.serving import codec
from agent.serving.dataplane import EXTENSIONS, SERVER_NAME, DataPlane, model_config, model_metadata
from agent.serving.entry import ModelEntry
from agent.serving.errors import InvalidInput, MethodNotAllowed, NotFound, ServerBusy, TooManyFailures, status_of
from agent.serving.http.decode import decode_request
from agent.serving.http.encode import encode_response
from agent.serving.http.jsondata import parse_json
from agent.serving.outsize import Hold, no_hold

__all__ = ["EXTENSIONS", "SERVER_NAME", "Router", "model_config", "model_metadata"]
JSON_TYPE = "application/json"
_MODEL = re.compile(r"^/v2/models/(?P<m>[^/]+)(?:/versions/(?P<v>[^/]+))?(?P<rest>/ready|/infer|/config|/stats)?$")


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = JSON_TYPE
    headers: dict[str, str] = field(default_factory=dict)
    parts: list[Any] | None = None  # instead of body: buffers sent in order (arrays' own memory), `length` bytes
    length: int = 0
    stream: Iterator[bytes] | None = None  # instead of body: sent chunked as it comes (SSE); closed if the client goes

    def buffers(self) -> tuple[list[Any], int]:
        """(buffers to send in order, total bytes)."""
        return (self.parts, self.length) if self.parts is not None else ([self.body], len(self.body))


def json_response(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc, separators=(",", ":"), allow_nan=False).encode())


def error_response(status: int, message: str) -> Response:
    return json_response(status, {"error": message})


def error_for(exc: BaseException) -> Response:
    """The one place an exception becomes an HTTP answer: a ServingError's status (405 with Allow, 503 busy
    with Retry-After), 500 for anything else (a bug: answered, and the server keeps serving)."""
    if not isinstance(exc, ServingError):
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
    resp = error_response(status_of(exc), str(exc))
    if isinstance(exc, MethodNotAllowed) and exc.allow:
        resp.headers["Allow"] = exc.allow
    elif isinstance(exc, ServerBusy):
        resp.headers["Retry-After"] = "1"
    elif isinstance(exc, TooManyFailures):
        resp.headers["Retry-After"] = str(max(1, int(exc.retry_after + 0.999)))
    return resp


class Router:
    """The HTTP front of the data plane: path + method -> a DataPlane call -> Response; raises ServingError
    subclasses (domain errors) that error_for maps to statuses."""

    def __init__(self, plane: DataPlane):
        self.plane = plane
        self._infer_paths: dict[str, tuple[str, str | None]] = {}

    def route(
        self,
        method: str,
        path: str,
        body: bytes | memoryview,
        header_length: int | None,
        ready: bool,
        charge: codec.Charge = codec.no_charge,
        hold: Hold = no_hold,
    ) -> Response:
        """Answer one request (HEAD is answered as GET; the caller sends only the head). `charge` counts the
        memory decoding will take against the request budget."""
        path = path.split("?", 1)[0]
        hit = self._infer_paths.get(path)  # infer paths seen before: no regex, no unquoting
        if hit is not None and method == "POST":
            return self.infer(hit[0], hit[1], body, header_length, charge, hold)
        plane = self.plane
        if path in ("/v2", "/v2/"):
            self._only(method, "GET")
            return json_response(200, plane.server_metadata())
        if path == "/v2/health/live":
            self._only(method, "GET")
            return json_response(200, {"live": True})
        if path == "/v2/health/ready":
            self._only(method, "GET")
            if ready and plane.ready():
                return json_response(200, {"ready": True})
            return error_response(503, "not ready: " + ("shutting down" if not ready else "a model is loading"))
        if path == "/metrics":
            self._only(method, "GET")
            return Response(200, plane.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        if path == "/v2/models/stats":
            self._only(method, "GET")
            return json_response(200, plane.statistics(None, None))
        if path.startswith("/v1/") or path.endswith(("/generate", "/generate_stream")):
            return self.generation(method, path, body)
        if path.startswith(
            ("/v2/repository", "/v2/systemsharedmemory", "/v2/cudasharedmemory", "/v2/trace", "/v2/logging")
        ):
            return self.extension(method, path, body)
        m = _MODEL.match(path)
        if m is None:
            raise NotFound(f"no such endpoint: {path}")
        name, version, rest = unquote(m["m"]), (unquote(m["v"]) if m["v"] else None), m["rest"]
        if rest == "/infer":
            self._only(method, "POST")
            if len(self._infer_paths) >= 1024:  # bounded: clients may invent paths
                self._infer_paths.clear()
            self._infer_paths[path] = (name, version)
            return self.infer(name, version, body, header_length, charge, hold)
        self._only(method, "GET")
        if rest == "/stats":
            return json_response(200, plane.statistics(name, version))
        if rest == "/ready":
            plane.entry_check(name, version)
            return json_response(200, {"name": name, "ready": True})
        if rest == "/config":
            return json_response(200, plane.model_config(name, version))
        return json_response(200, plane.model_metadata(name, version))

    def generation(self, method: str, path: str, body: bytes | memoryview) -> Response:
        """The generation routes (OpenAI-compatible /v1, Triton's /v2/models/M/generate[_stream]:
        agent.serving.generative.openai), when the plane has them."""
        if self.plane.generation is None:
            raise NotFound(f"no such endpoint: {path} (no generative model is served: serving.generative)")
        resp: Response = self.plane.generation(method, path, body)
        return resp

    def extension(self, method: str, path: str, body: bytes | memoryview) -> Response:
        """Repository, shared memory, trace and logging endpoints: served by the plane's extension hooks when
        they exist, refused with a 400 naming what is unsupported otherwise."""
        hook = self.plane.extension_hook(path)
        if hook is None:
            what = path.split("/")[2]
            raise InvalidInput(f"the {what} extension is not supported by this server (see /v2 'extensions')")
        doc = parse_json(body, what="the request") if len(body) else {}
        if not isinstance(doc, dict):
            raise InvalidInput("the request body must be a JSON object")
        self._only(
            method, "POST" if path.endswith(("/load", "/unload", "/register", "/unregister", "/index")) else "GET"
        )
        result = hook(path, doc)
        return json_response(200, result) if result is not None else Response(200, b"")

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed and not (method == "HEAD" and allowed == "GET"):
            allow = "GET, HEAD" if allowed == "GET" else allowed
            raise MethodNotAllowed(f"method {method[:20]} not allowed here; use {allowed}", allow)

    def infer(
        self,
        name: str,
        version: str | None,
        body: bytes | memoryview,
        header_length: int | None,
        charge: codec.Charge = codec.no_charge,
        hold: Hold = no_hold,
    ) -> Response:
        plane = self.plane
        plane.entry_check(name, version)  # unknown model -> 404 before the body is decoded
        if header_length == 0:  # raw binary request: the body is the model's only input, no JSON at all
            req = raw_request(plane.registry.entry(name, version or None), body)
        else:
            req = decode_request(body, header_length, charge)
        served, outputs = plane.infer(name, version, req, charge, req.classes, hold)
        parts, length, head_len = encode_response(name, served, outputs, req)
        if head_len is None:
            return Response(200, b"", parts=parts, length=length)
        return Response(
            200,
            b"",
            "application/octet-stream",
            {"Inference-Header-Content-Length": str(head_len)},
            parts=parts,
            length=length,
        )

    def metrics(self) -> str:
        return self.plane.metrics()


def raw_request(entry: ModelEntry, body: bytes | memoryview) -> codec.InferRequest:
    """Triton's raw binary request (Inference-Header-Content-Length: 0): the whole body is the data of the model's
    only input, its shape the model's with at most one variable dimension, derived from the body's size; every
    output comes back as binary data."""
    if len(entry.inputs) != 1:
        raise InvalidInput(
            f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with one input; "
            f"{entry.name!r} has {len(entry.inputs)}"
        )
    spec = entry.inputs[0]
    datatype = codec.datatype_of(spec.dtype)
    if datatype == "BYTES":
        raise InvalidInput("a raw binary request cannot carry a BYTES input; send a JSON header")
    dtype = codec.numpy_dtype(datatype)
    dims = [d if isinstance(d, int) and d >= 0 else -1 for d in spec.shape]
    known = 1
    for d in dims:
        known *= d if d >= 0 else 1
    if dims.count(-1) > 1:
        raise InvalidInput(
            f"input {spec.name!r} has shape {dims}: a raw binary request fits at most one variable dimension"
        )
    elements, rem = divmod(len(body), dtype.itemsize)
    if rem or (known and elements % known) or (-1 not in dims and elements != known):
        raise InvalidInput(
            f"raw binary body of {len(body)} bytes does not fit input {spec.name!r} ({datatype}, shape {dims})"
        )
    shape = [elements // known if d == -1 else d for d in dims] if known else [0 if d == -1 else d for d in dims]
    arr = np.frombuffer(body, dtype=dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype).reshape(shape)
    return codec.InferRequest(inputs={spec.name: arr}, binary_default=True)


def header_length(raw: str | None) -> int | None:
    """Parse Inference-Header-Content-Length (None when absent)."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise InvalidInput(f"Inference-Header-Content-Length must be plain ASCII digits, got {raw[:20]!r}")
    return int(raw)
