"""The transport-neutral inference core (KServe's data plane): metadata, readiness, infer with its response budget,
statistics, classification and /metrics over the registry; raises ServingError subclasses (domain errors) that each
front end (HTTP: handlers/wire/server; gRPC: grpc/front) maps to its own status at the edge."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import agent
from agent.serving import codec
from agent.serving.auth import AuthGate
from agent.serving.budget import BodyBudget
from agent.serving.entry import ModelEntry
from agent.serving.errors import InvalidInput, NotFound
from agent.serving.metrics import Metric, model_families, render
from agent.serving.outsize import Hold, check_response, no_hold
from agent.serving.registry import ModelRegistry
from agent.serving.shm import SharedMemory, ShmSlot

SERVER_NAME = "edge-agent"
# Exactly the extensions that work on both transports (docs/serving.md lists Triton's beside them).
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "classification", "system_shared_memory"]


def _dims(shape: Iterable[Any]) -> list[int]:
    return [d if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else -1 for d in shape]


def _tensors(specs: list[Any]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": codec.datatype_of(s.dtype), "shape": _dims(s.shape)} for s in specs]


def _scalars(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in meta.items()
        if isinstance(v, (str, int, float, bool))
        and not k.startswith("_")
        and (not isinstance(v, float) or math.isfinite(v))
    }


def model_metadata(entry: ModelEntry) -> dict[str, Any]:
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


def model_config(entry: ModelEntry) -> dict[str, Any]:
    """Enough of Triton's model config for perf_analyzer: no batching dimension, explicit dims."""

    def io(specs: list[Any]) -> list[dict[str, Any]]:
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


def classify(arr: np.ndarray, count: int, labels: list[str] | None) -> np.ndarray:
    """Triton's classification extension: the top `count` classes of each batch row (of the whole tensor when it
    has one dimension) as BYTES "value:index[:label]", highest first."""
    if count < 1:
        raise InvalidInput(f"class_count must be a positive integer, got {count}")
    if arr.dtype.kind not in "biuf":
        raise InvalidInput(f"classification needs a numeric output, got {arr.dtype}")
    rows = arr.reshape(1, -1) if arr.ndim <= 1 else arr.reshape(arr.shape[0], -1)
    k = min(count, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        top = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for j, i in enumerate(top):
            label = f":{labels[i]}" if labels is not None and i < len(labels) else ""
            out[r, j] = f"{float(row[i]):f}:{int(i)}{label}".encode()
    return out.reshape(k) if arr.ndim <= 1 else out


class DataPlane:
    """What both front ends share: registry, token gate, request memory budget, limits and metrics families."""

    def __init__(
        self,
        registry: ModelRegistry,
        *,
        token: str | None = None,
        budget: BodyBudget,
        max_body_bytes: int,
        collectors: list[Callable[[], Iterable[Metric]]] | None = None,
        shm_in_place: bool = False,
    ):
        self.registry = registry
        self.auth = AuthGate(token)
        self.budget = budget
        self.max_body_bytes = int(max_body_bytes)
        self.max_response_bytes = budget.limit  # a response's encoded size (issue 29 item 1); its memory: budget
        self.collectors: list[Callable[[], Iterable[Metric]]] = collectors if collectors is not None else []
        self.transport_metrics: list[Callable[[], Iterable[Metric]]] = []
        self.hooks: dict[str, Callable[[str, dict[str, Any]], Any]] = {}  # path prefix -> extension handler (HTTP)
        self.grpc_hooks: dict[
            str, Callable[[str, dict[str, Any]], Any]
        ] = {}  # extension -> handler(method, doc) (gRPC)
        self.shm = SharedMemory(in_place=shm_in_place)  # serving.shm_in_place (docs/serving.md)
        self.hooks["/v2/systemsharedmemory"] = self.shm.http
        self.grpc_hooks["systemsharedmemory"] = self.shm.call
        self.extensions = list(EXTENSIONS)  # what /v2 and ServerMetadata list: grows as extensions are installed
        self.accepting = True
        # generation routes (/v1, /v2/models/M/generate): (method, path, body) -> handlers.Response, when served
        self.generation: Callable[[str, str, bytes | memoryview], Any] | None = None

    def extension_hook(self, path: str) -> Callable[[str, dict[str, Any]], Any] | None:
        for prefix, hook in self.hooks.items():
            if path.startswith(prefix):
                return hook
        return None

    # ---- health and metadata ------------------------------------------------------------------------
    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": agent.__version__, "extensions": list(self.extensions)}

    def ready(self) -> bool:
        return self.accepting and bool(self.registry.ready())

    def model_ready(self, name: str, version: str | None) -> bool:
        return bool(self.registry.ready(name, version or None))

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        return model_metadata(self.registry.entry(name, version or None))

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        return model_config(self.registry.entry(name, version or None))

    # ---- inference ------------------------------------------------------------------------------------
    def infer(
        self,
        name: str,
        version: str | None,
        req: codec.InferRequest,
        charge: codec.Charge = codec.no_charge,
        classes: dict[str, int] | None = None,
        hold: Hold = no_hold,
    ) -> tuple[str, dict[str, Any]]:
        """Run one decoded request; the response's encoded size is checked and its memory charged before any
        byte of it is produced. classes: output name -> class_count (classification extension)."""
        feeds = req.inputs
        slots: list[ShmSlot] = [v for v in feeds.values() if type(v) is ShmSlot]  # type: ignore[misc]
        if slots:
            feeds = {k: self.shm.read(v) if type(v) is ShmSlot else v for k, v in feeds.items()}
        placed: dict[str, np.ndarray] = {}
        place = self._placer(req, slots, placed) if req.shm_out and not classes else None
        served, outputs = self.registry.infer(name, feeds, version or None, req.outputs, place)
        if classes:
            labels = self.registry.entry(name, served).meta.get("_labels")
            for out, count in classes.items():
                value = outputs.get(out)
                if isinstance(value, np.ndarray):
                    outputs[out] = classify(value, count, labels if isinstance(labels, list) else None)
        for out, target in req.shm_out.items():
            value = outputs.get(out)
            if out in placed:  # the runtime wrote it into the region
                req.shm_written[out] = int(placed[out].nbytes)
            elif isinstance(value, np.ndarray):
                req.shm_written[out] = self.shm.write(out, value, target)
        check_response(outputs, req, self.max_response_bytes, charge, hold)
        return served, outputs

    def _placer(
        self, req: codec.InferRequest, slots: list[ShmSlot], placed: dict[str, np.ndarray]
    ) -> Callable[[ModelEntry, list[str]], dict[str, np.ndarray] | None]:
        """place() for registry.infer: when every output asked for goes to shared memory and the model declares
        its shape and dtype, the windows the runtime writes them into (filling `placed`); else None (the plain
        run, then shm.write)."""

        def place(entry: ModelEntry, names: list[str]) -> dict[str, np.ndarray] | None:
            if sys.byteorder != "little" or not hasattr(entry.session, "run_into"):
                return None
            specs = {s.name: s for s in entry.outputs}
            into = {}
            for out in names:
                target, spec = req.shm_out.get(out), specs.get(out)
                if target is None or spec is None or not all(type(d) is int and d >= 0 for d in spec.shape):
                    return None
                try:
                    dtype = np.dtype(spec.dtype)
                except TypeError:  # bfloat16 and the like
                    return None
                if dtype.kind not in "biuf":
                    return None
                arr = self.shm.place(out, dtype, tuple(spec.shape), target, slots)
                if arr is None:
                    return None
                into[out] = arr
            placed.update(into)
            return into

        return place

    def entry_check(self, name: str, version: str | None) -> None:
        """NotFound for an unknown model or version (before a body is decoded)."""
        self.registry.entry(name, version or None)

    # ---- statistics (Triton's document shape) ---------------------------------------------------------
    def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """{"model_stats": [...]} as Triton's statistics extension; queue/compute_input/compute_output and cache
        are not measured here and read 0 (docs/serving.md)."""
        models = self.registry.models()
        if name:
            if name not in models:
                raise NotFound(f"unknown model {name!r}; serving: {sorted(models)}")
            targets = [(name, version or models[name])]
        else:
            targets = sorted(models.items())
        out = []
        for model, ver in targets:
            try:
                stats = self.registry.model_stats(model, ver)
            except NotFound:
                raise NotFound(f"no statistics for model {model!r} version {ver}") from None
            snap = stats.snapshot()
            ok = snap["requests"] - snap["errors"] - snap["request_failures"]
            ns = int(stats.latency_sum * 1e9)
            last = stats.last_end()
            zero = {"count": 0, "ns": 0}
            out.append(
                {
                    "name": model,
                    "version": str(ver),
                    "last_inference": int((time.time() - (time.perf_counter() - last)) * 1000) if last else 0,
                    "inference_count": ok,
                    "execution_count": ok,
                    "inference_stats": {
                        "success": {"count": ok, "ns": ns},
                        "fail": {"count": snap["errors"] + snap["request_failures"] + snap["rejected"], "ns": 0},
                        "queue": dict(zero),
                        "compute_input": dict(zero),
                        "compute_infer": {"count": ok, "ns": ns},
                        "compute_output": dict(zero),
                        "cache_hit": dict(zero),
                        "cache_miss": dict(zero),
                    },
                    "batch_stats": [],
                }
            )
        return {"model_stats": out}

    # ---- metrics ----------------------------------------------------------------------------------------
    def _auth_metrics(self) -> list[Metric]:
        failed, throttled = self.auth.counts()
        return [
            Metric(
                "edge_agent_auth_failures_total",
                "counter",
                "Requests refused for a missing or wrong token, by transport.",
                [("", {"transport": t}, n) for t, n in sorted(failed.items())],
            ),
            Metric(
                "edge_agent_auth_throttled_total",
                "counter",
                "Requests refused unchecked: their peer sent too many wrong tokens (slowed down), by transport.",
                [("", {"transport": t}, n) for t, n in sorted(throttled.items())],
            ),
        ]

    def metrics(self) -> str:
        families = model_families(self.registry.all_stats(), self.registry.models()) + self._auth_metrics()
        failed = 0
        for collect in [*self.transport_metrics, *self.collectors]:
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
