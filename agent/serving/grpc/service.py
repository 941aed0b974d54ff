"""GRPCInferenceService (KServe v2) on grpcio's sync server: each RPC is authorized, counted per client address,
run on the data plane, and its domain errors become a status at the edge (grpc/status.code_of).

Infer messages are read and written as bytes (grpc/raw): raw tensor contents are read in place and a response's
written once, not copied by protobuf on the way in and three times on the way out.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from agent.errors import ServingError
from agent.serving.budget import Ledger
from agent.serving.dataplane import DataPlane
from agent.serving.errors import PeerBusy, TooManyFailures, Unsupported
from agent.serving.grpc.codec import decode, encode, params_of
from agent.serving.grpc.raw import parse_request, response_bytes
from agent.serving.grpc.status import code_of, message_of, peer_host
from agent.serving.grpc.watch import Streams
from agent.serving.metrics import Metric
from agent.serving.proto import oip_pb2 as pb

T = TypeVar("T")


def stream_error(message: str) -> bytes:
    """A serialized ModelStreamInferResponse carrying an error (the stream goes on, Triton's way)."""
    return bytes(pb.ModelStreamInferResponse(error_message=message).SerializeToString())


class InferenceServicer:
    """Each RPC: authorize, call the data plane, map its domain errors to a status code."""

    def __init__(self, plane: DataPlane, max_per_peer: int = 32, streams: Streams | None = None):
        self.plane = plane
        self.streams = streams or Streams(4, 60.0)
        self.max_per_peer = max(1, int(max_per_peer))
        self._busy: collections.Counter[str] = collections.Counter()  # RPCs in flight per client address
        self._lock = threading.Lock()
        self.codes: collections.Counter[str] = collections.Counter()  # RPCs answered, by status code name
        plane.transport_metrics.append(self._metrics)

    def _count(self, code: grpc.StatusCode) -> None:
        with self._lock:
            self.codes[code.name] += 1

    def _metrics(self) -> list[Metric]:
        with self._lock:
            codes = sorted(self.codes.items())
        return [
            Metric(
                "edge_agent_grpc_responses_total",
                "counter",
                "gRPC calls answered (inference service), by status code.",
                [("", {"code": c}, n) for c, n in codes],
            )
        ]

    # ---- plumbing -----------------------------------------------------------------------------------
    def _auth(self, context: Any) -> None:
        auth = self.plane.auth
        if auth.token is None:
            return
        cred = None
        for key, value in context.invocation_metadata():
            if key == "authorization" and isinstance(value, str):
                scheme, _, rest = value.strip().partition(" ")
                cred = rest.strip() if scheme.lower() == "bearer" else None
        auth.check(peer_host(context.peer()), cred, "grpc")

    def _enter(self, peer: str) -> None:
        """One more RPC in flight for this client address; at max_per_peer it is refused (one client cannot take
        every slot of the server's max_rpcs)."""
        with self._lock:
            if self._busy[peer] >= self.max_per_peer:
                raise PeerBusy(
                    f"{peer} has {self.max_per_peer} calls in flight, the most one client may; retry shortly"
                )
            self._busy[peer] += 1

    def _leave(self, peer: str) -> None:
        with self._lock:
            self._busy[peer] -= 1
            if not self._busy[peer]:
                del self._busy[peer]

    def _call(self, context: Any, fn: Callable[[], T], *, open_: bool = False) -> T:
        peer, entered = peer_host(context.peer()), False
        try:
            if not open_:
                self._auth(context)
            self._enter(peer)
            entered = True
            result = fn()
            self._count(grpc.StatusCode.OK)
            return result
        except Exception as exc:  # noqa: BLE001 - every failure answered with a status, the server keeps serving
            self._count(code_of(exc))
            if isinstance(exc, TooManyFailures):
                context.set_trailing_metadata((("retry-after", str(max(1, int(exc.retry_after + 0.999)))),))
            context.abort(code_of(exc), message_of(exc))
        finally:
            if entered:
                self._leave(peer)
        raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

    # ---- health and metadata ------------------------------------------------------------------------
    def ServerLive(self, request: Any, context: Any) -> Any:
        return self._call(context, lambda: pb.ServerLiveResponse(live=True), open_=True)

    def ServerReady(self, request: Any, context: Any) -> Any:
        return self._call(context, lambda: pb.ServerReadyResponse(ready=self.plane.ready()), open_=True)

    def ModelReady(self, request: Any, context: Any) -> Any:
        return self._call(
            context, lambda: pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))
        )

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self._call(context, lambda: pb.ServerMetadataResponse(**self.plane.server_metadata()))

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        def run() -> Any:
            doc = self.plane.model_metadata(request.name, request.version)
            doc.pop("parameters", None)
            return json_format.ParseDict(doc, pb.ModelMetadataResponse())

        return self._call(context, run)

    def ModelConfig(self, request: Any, context: Any) -> Any:
        def run() -> Any:
            doc = self.plane.model_config(request.name, request.version)
            return pb.ModelConfigResponse(config=json_format.ParseDict(doc, pb.ModelConfig()))

        return self._call(context, run)

    def ModelStatistics(self, request: Any, context: Any) -> Any:
        def run() -> Any:
            doc = self.plane.statistics(request.name or None, request.version or None)
            return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

        return self._call(context, run)

    # ---- inference ------------------------------------------------------------------------------------
    def _infer(self, request: Any, raws: list[memoryview], size: int, stream: bool = False) -> bytes:
        """One ModelInferRequest (parsed by grpc/raw.parse_request; `size` bytes as received) answered as the
        serialized response (stream: a ModelStreamInferResponse)."""
        plane = self.plane
        plane.entry_check(request.model_name, request.model_version)
        if not plane.accepting:
            raise ServingError("server is shutting down")
        ledger = Ledger(plane.budget)
        try:
            ledger.hold(size)  # the message as received (gRPC checked its length before allocating)
            req = decode(request, raws, ledger.charge)
            served, outputs = plane.infer(
                request.model_name, request.model_version, req, ledger.charge, req.classes, ledger.hold
            )
            ledger.charge(sum(getattr(v, "nbytes", 0) for v in outputs.values()), "the response message")
            resp, contents = encode(request.model_name, served, outputs, req)
            return response_bytes(resp, contents, stream)
        finally:
            ledger.close()

    def ModelInfer(self, raw: bytes, context: Any) -> bytes:
        """Unary infer on the message's bytes: its raw contents are read in place and the response's written once."""
        try:
            request, raws = parse_request(raw)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {exc}")
        return self._call(context, lambda: self._infer(request, raws, len(raw)))

    def ModelStreamInfer(self, raws: Iterator[bytes], context: Any) -> Iterator[bytes]:
        """A stream holds a handler thread while it is open (grpcio's sync server): at most max_streams are open
        at once (the rest get RESOURCE_EXHAUSTED), and one that sends nothing for stream_idle_s is cancelled."""
        try:
            self._auth(context)
            self.streams.open(context)
        except Exception as exc:  # noqa: BLE001
            self._count(code_of(exc))
            context.abort(code_of(exc), str(exc))
        try:
            yield from self._stream(raws, context)
        finally:
            self.streams.close(context)

    def _stream(self, raws: Iterator[bytes], context: Any) -> Iterator[bytes]:
        for raw in raws:
            self.streams.touch(context)
            try:
                request, contents = parse_request(raw)
            except DecodeError as exc:
                yield stream_error(f"malformed ModelInferRequest: {exc}")
                continue
            try:
                yield self._infer(request, contents, len(raw), stream=True)
            except Exception as exc:  # noqa: BLE001 - the stream carries the error and goes on (Triton's way)
                yield stream_error(message_of(exc))

    # ---- extensions: served by the data plane's hooks, or refused --------------------------------------
    def _extension(self, context: Any, kind: str, method: str, doc: dict[str, Any], response: Any) -> Any:
        def run() -> Any:
            hook = self.plane.grpc_hooks.get(kind)
            if hook is None:
                raise Unsupported(f"the {kind} extension is not supported by this server (see ServerMetadata)")
            result = hook(method, doc)
            if result is not None:
                json_format.ParseDict(result, response, ignore_unknown_fields=True)
            return response

        return self._call(context, run)

    def RepositoryIndex(self, request: Any, context: Any) -> Any:
        doc = {"ready": request.ready, "_grpc": True}
        return self._extension(context, "repository", "index", doc, pb.RepositoryIndexResponse())

    def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        doc = {"model_name": request.model_name, "parameters": params_of(request.parameters)}
        return self._extension(context, "repository", "load", doc, pb.RepositoryModelLoadResponse())

    def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        doc = {"model_name": request.model_name, "parameters": params_of(request.parameters)}
        return self._extension(context, "repository", "unload", doc, pb.RepositoryModelUnloadResponse())

    def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        doc = {"name": request.name, "_grpc": True}
        return self._extension(context, "systemsharedmemory", "status", doc, pb.SystemSharedMemoryStatusResponse())

    def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        doc = {"name": request.name, "key": request.key, "offset": request.offset, "byte_size": request.byte_size}
        return self._extension(context, "systemsharedmemory", "register", doc, pb.SystemSharedMemoryRegisterResponse())

    def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        doc = {"name": request.name}
        return self._extension(
            context, "systemsharedmemory", "unregister", doc, pb.SystemSharedMemoryUnregisterResponse()
        )

    def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return self._extension(context, "cudasharedmemory", "status", {}, pb.CudaSharedMemoryStatusResponse())

    def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        return self._extension(context, "cudasharedmemory", "register", {}, pb.CudaSharedMemoryRegisterResponse())

    def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return self._extension(context, "cudasharedmemory", "unregister", {}, pb.CudaSharedMemoryUnregisterResponse())

    def TraceSetting(self, request: Any, context: Any) -> Any:
        return self._extension(context, "trace", "setting", {}, pb.TraceSettingResponse())

    def LogSettings(self, request: Any, context: Any) -> Any:
        return self._extension(context, "logging", "settings", {}, pb.LogSettingsResponse())
