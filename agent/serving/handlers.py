"""Open Inference Protocol (KServe v2) routes: path + body in, (status, body, headers) out; no sockets here."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import agent
from agent.errors import ServingError
from agent.serving import codec
from agent.serving.errors import BadRequest, MethodNotAllowed, NotFound, ServerBusy, status_of
from agent.serving.metrics import Metric, model_families, render

SERVER_NAME = "edge-agent"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]
JSON_TYPE = "application/json"
_MODEL = re.compile(r"^/v2/models/(?P<m>[^/]+)(?:/versions/(?P<v>[^/]+))?(?P<rest>/ready|/infer|/config)?$")


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = JSON_TYPE
    headers: dict[str, str] = field(default_factory=dict)
    parts: list | None = None  # instead of body: buffers sent in order (arrays' own memory), `length` bytes
    length: int = 0

    def buffers(self) -> tuple[list, int]:
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
    return resp


def _dims(shape: Iterable[Any]) -> list[int]:
    return [d if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else -1 for d in shape]


def _tensors(specs: list) -> list[dict]:
    return [{"name": s.name, "datatype": codec.datatype_of(s.dtype), "shape": _dims(s.shape)} for s in specs]


def _scalars(meta: dict) -> dict:
    return {
        k: v
        for k, v in meta.items()
        if isinstance(v, (str, int, float, bool))
        and not k.startswith("_")
        and (not isinstance(v, float) or math.isfinite(v))
    }


def model_metadata(entry) -> dict:
    doc = {
        "name": entry.name,
        "versions": [entry.version],
        "platform": entry.meta.get("platform", "onnxruntime_onnx"),
        "inputs": _tensors(entry.inputs),
        "outputs": _tensors(entry.outputs),
    }
    params = _scalars(entry.meta)
    if params:
        doc["parameters"] = params
    return doc


def model_config(entry) -> dict:
    """Enough of Triton's model config for perf_analyzer: no batching dimension, explicit dims."""

    def io(specs: list) -> list[dict]:
        return [
            {"name": s.name, "data_type": codec.config_type(codec.datatype_of(s.dtype)), "dims": _dims(s.shape)}
            for s in specs
        ]

    return {
        "name": entry.name,
        "platform": entry.meta.get("platform", "onnxruntime_onnx"),
        "backend": "onnxruntime",
        "max_batch_size": 0,
        "input": io(entry.inputs),
        "output": io(entry.outputs),
    }


class Router:
    """Dispatches one request to the registry; raises ServingError subclasses for client mistakes."""

    def __init__(self, registry, collectors: list[Callable[[], Iterable[Metric]]], extra_metrics: Callable[[], list]):
        self.registry = registry
        self.collectors = collectors
        self.extra_metrics = extra_metrics
        self._infer_paths: dict[str, tuple[str, str | None]] = {}

    def route(
        self,
        method: str,
        path: str,
        body: bytes | memoryview,
        header_length: int | None,
        ready: bool,
        charge: codec.Charge = codec.no_charge,
    ) -> Response:
        """Answer one request (HEAD is answered as GET; the caller sends only the head). `charge` counts the
        memory decoding will take against the request budget."""
        path = path.split("?", 1)[0]
        hit = self._infer_paths.get(path)  # infer paths seen before: no regex, no unquoting
        if hit is not None and method == "POST":
            return self.infer(hit[0], hit[1], body, header_length, charge)
        if path in ("/v2", "/v2/"):
            self._only(method, "GET")
            return json_response(200, {"name": SERVER_NAME, "version": agent.__version__, "extensions": EXTENSIONS})
        if path == "/v2/health/live":
            self._only(method, "GET")
            return json_response(200, {"live": True})
        if path == "/v2/health/ready":
            self._only(method, "GET")
            if ready and self.registry.ready():
                return json_response(200, {"ready": True})
            return error_response(503, "not ready: " + ("shutting down" if not ready else "a model is loading"))
        if path == "/metrics":
            self._only(method, "GET")
            return Response(200, self.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        m = _MODEL.match(path)
        if m is None:
            raise NotFound(f"no such endpoint: {path}")
        name, version, rest = unquote(m["m"]), (unquote(m["v"]) if m["v"] else None), m["rest"]
        if rest == "/infer":
            self._only(method, "POST")
            if len(self._infer_paths) >= 1024:  # bounded: clients may invent paths
                self._infer_paths.clear()
            self._infer_paths[path] = (name, version)
            return self.infer(name, version, body, header_length, charge)
        self._only(method, "GET")
        entry = self.registry.entry(name, version)
        if rest == "/ready":
            return json_response(200, {"name": name, "ready": True})
        if rest == "/config":
            return json_response(200, model_config(entry))
        return json_response(200, model_metadata(entry))

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
    ) -> Response:
        self.registry.entry(name, version)  # unknown model -> 404 before the body is decoded
        req = codec.decode_request(body, header_length, charge)
        served, outputs = self.registry.infer(name, req.inputs, version=version, outputs=req.outputs)
        parts, length, head_len = codec.encode_response(name, served, outputs, req)
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
        families = model_families(self.registry.all_stats(), self.registry.models()) + list(self.extra_metrics())
        failed = 0
        for collect in list(self.collectors):
            try:
                families.extend(collect())
            except Exception:  # noqa: BLE001 - a broken collector must not break the scrape
                failed += 1
        families.append(
            Metric(
                "edge_agent_metrics_collector_errors",
                "gauge",
                "Collectors that raised during this scrape.",
                [("", {}, failed)],
            )
        )
        return render(families)


def header_length(raw: str | None) -> int | None:
    """Parse Inference-Header-Content-Length (None when absent)."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise BadRequest(f"Inference-Header-Content-Length must be plain ASCII digits, got {raw[:20]!r}")
    return int(raw)
