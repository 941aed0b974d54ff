"""KServe v2 gRPC front end (grpcio): GRPCInferenceService + grpc.health.v1 over the same DataPlane as HTTP.

Domain errors become gRPC status codes here and nowhere else (`code_of`). Limits: a message's declared length is
checked against max_body_bytes by gRPC's core before it is allocated (RESOURCE_EXHAUSTED); a message that arrived
is counted against the shared request memory budget before it is decoded; requests are handled by a bounded pool
only once complete (slow senders hold a connection, not a thread), at most `max_rpcs` at once (the rest get
RESOURCE_EXHAUSTED at once), and connections idle for idle_timeout are closed. Token: metadata
`authorization: Bearer <token>` on every RPC but ServerLive, ServerReady and the health service.
"""

from __future__ import annotations

import collections
import threading
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2_grpc

from agent.errors import ServingError
from agent.serving import errors as e
from agent.serving.budget import Ledger
from agent.serving.dataplane import DataPlane
from agent.serving.errors import PeerBusy, TooManyFailures, Unsupported
from agent.serving.grpc_codec import decode, encode, params_of
from agent.serving.grpc_watch import Health, Streams
from agent.serving.metrics import Metric
from agent.serving.proto import oip_pb2 as pb
from agent.serving.proto import oip_pb2_grpc as pbg  # the servicer base class (its registration is not used)

SERVICE = "inference.GRPCInferenceService"
GRPC_CODE: dict[type[ServingError], grpc.StatusCode] = {  # the domain errors (serving/errors.py) as gRPC codes
    e.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    e.LengthRequired: grpc.StatusCode.INVALID_ARGUMENT,
    e.Unauthorized: grpc.StatusCode.UNAUTHENTICATED,
    e.Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    e.NotFound: grpc.StatusCode.NOT_FOUND,
    e.Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    e.AlreadyExists: grpc.StatusCode.FAILED_PRECONDITION,
    e.MethodNotAllowed: grpc.StatusCode.UNIMPLEMENTED,
    e.Unsupported: grpc.StatusCode.UNIMPLEMENTED,
    e.RequestTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    e.PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.TooManyFailures: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.PeerBusy: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.ModelUnavailable: grpc.StatusCode.UNAVAILABLE,
    e.ServerBusy: grpc.StatusCode.UNAVAILABLE,
}
OPEN_METHODS = ("ServerLive", "ServerReady")


def code_of(exc: BaseException) -> grpc.StatusCode:
    """The one place a domain error becomes a gRPC status code (INTERNAL for anything not in GRPC_CODE)."""
    for cls in type(exc).__mro__:
        if cls in GRPC_CODE:
            return GRPC_CODE[cls]
    return grpc.StatusCode.INTERNAL


class InferenceServicer(pbg.GRPCInferenceServiceServicer):
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

    def _call(self, context: Any, fn, *, open_: bool = False) -> Any:
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
            message = str(exc) if isinstance(exc, ServingError) else f"internal error: {type(exc).__name__}: {exc}"
            context.abort(code_of(exc), message)
        finally:
            if entered:
                self._leave(peer)

    # ---- health and metadata ------------------------------------------------------------------------
    def ServerLive(self, request, context):
        return self._call(context, lambda: pb.ServerLiveResponse(live=True), open_=True)

    def ServerReady(self, request, context):
        return self._call(context, lambda: pb.ServerReadyResponse(ready=self.plane.ready()), open_=True)

    def ModelReady(self, request, context):
        return self._call(
            context, lambda: pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))
        )

    def ServerMetadata(self, request, context):
        return self._call(context, lambda: pb.ServerMetadataResponse(**self.plane.server_metadata()))

    def ModelMetadata(self, request, context):
        def run() -> Any:
            doc = self.plane.model_metadata(request.name, request.version)
            doc.pop("parameters", None)
            return json_format.ParseDict(doc, pb.ModelMetadataResponse())

        return self._call(context, run)

    def ModelConfig(self, request, context):
        def run() -> Any:
            doc = self.plane.model_config(request.name, request.version)
            return pb.ModelConfigResponse(config=json_format.ParseDict(doc, pb.ModelConfig()))

        return self._call(context, run)

    def ModelStatistics(self, request, context):
        def run() -> Any:
            doc = self.plane.statistics(request.name or None, request.version or None)
            return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

        return self._call(context, run)

    # ---- inference ------------------------------------------------------------------------------------
    def _infer(self, request: Any) -> Any:
        plane = self.plane
        plane.entry_check(request.model_name, request.model_version)
        if not plane.accepting:
            raise ServingError("server is shutting down")
        ledger = Ledger(plane.budget)
        try:
            ledger.hold(request.ByteSize())  # the message as received (gRPC checked its length before allocating)
            req = decode(request, ledger.charge)
            served, outputs = plane.infer(
                request.model_name, request.model_version, req, ledger.charge, req.classes, ledger.hold
            )
            ledger.charge(sum(getattr(v, "nbytes", 0) for v in outputs.values()), "the response message")
            return encode(request.model_name, served, outputs, req)
        finally:
            ledger.close()

    def ModelInfer(self, request, context):
        return self._call(context, lambda: self._infer(request))

    def ModelStreamInfer(self, request_iterator, context):
        """A stream holds a handler thread while it is open (grpcio's sync server): at most max_streams are open
        at once (the rest get RESOURCE_EXHAUSTED), and one that sends nothing for stream_idle_s is cancelled."""
        try:
            self._auth(context)
            self.streams.open(context)
        except Exception as exc:  # noqa: BLE001
            self._count(code_of(exc))
            context.abort(code_of(exc), str(exc))
        try:
            yield from self._stream(request_iterator, context)
        finally:
            self.streams.close(context)

    def _stream(self, request_iterator: Any, context: Any) -> Any:
        for request in request_iterator:
            self.streams.touch(context)
            if isinstance(request, Exception):  # bytes that were not a ModelInferRequest (_parsing_stream)
                yield pb.ModelStreamInferResponse(error_message=f"malformed ModelInferRequest: {request}")
                continue
            try:
                yield pb.ModelStreamInferResponse(infer_response=self._infer(request))
            except Exception as exc:  # noqa: BLE001 - the stream carries the error and goes on (Triton's way)
                msg = str(exc) if isinstance(exc, ServingError) else f"internal error: {type(exc).__name__}: {exc}"
                yield pb.ModelStreamInferResponse(error_message=msg)

    # ---- extensions: served by the data plane's hooks, or refused --------------------------------------
    def _extension(self, context: Any, kind: str, method: str, doc: dict, response: Any) -> Any:
        def run() -> Any:
            hook = self.plane.grpc_hooks.get(kind)
            if hook is None:
                raise Unsupported(f"the {kind} extension is not supported by this server (see ServerMetadata)")
            result = hook(method, doc)
            if result is not None:
                json_format.ParseDict(result, response, ignore_unknown_fields=True)
            return response

        return self._call(context, run)

    def RepositoryIndex(self, request, context):
        doc = {"ready": request.ready, "_grpc": True}
        return self._extension(context, "repository", "index", doc, pb.RepositoryIndexResponse())

    def RepositoryModelLoad(self, request, context):
        doc = {"model_name": request.model_name, "parameters": params_of(request.parameters)}
        return self._extension(context, "repository", "load", doc, pb.RepositoryModelLoadResponse())

    def RepositoryModelUnload(self, request, context):
        doc = {"model_name": request.model_name, "parameters": params_of(request.parameters)}
        return self._extension(context, "repository", "unload", doc, pb.RepositoryModelUnloadResponse())

    def SystemSharedMemoryStatus(self, request, context):
        doc = {"name": request.name, "_grpc": True}
        return self._extension(context, "systemsharedmemory", "status", doc, pb.SystemSharedMemoryStatusResponse())

    def SystemSharedMemoryRegister(self, request, context):
        doc = {"name": request.name, "key": request.key, "offset": request.offset, "byte_size": request.byte_size}
        return self._extension(context, "systemsharedmemory", "register", doc, pb.SystemSharedMemoryRegisterResponse())

    def SystemSharedMemoryUnregister(self, request, context):
        doc = {"name": request.name}
        return self._extension(
            context, "systemsharedmemory", "unregister", doc, pb.SystemSharedMemoryUnregisterResponse()
        )

    def CudaSharedMemoryStatus(self, request, context):
        return self._extension(context, "cudasharedmemory", "status", {}, pb.CudaSharedMemoryStatusResponse())

    def CudaSharedMemoryRegister(self, request, context):
        return self._extension(context, "cudasharedmemory", "register", {}, pb.CudaSharedMemoryRegisterResponse())

    def CudaSharedMemoryUnregister(self, request, context):
        return self._extension(context, "cudasharedmemory", "unregister", {}, pb.CudaSharedMemoryUnregisterResponse())

    def TraceSetting(self, request, context):
        return self._extension(context, "trace", "setting", {}, pb.TraceSettingResponse())

    def LogSettings(self, request, context):
        return self._extension(context, "logging", "settings", {}, pb.LogSettingsResponse())


def _parsing(method: Any, message: Any):
    """A unary handler that parses its request itself: bytes that are not the message get INVALID_ARGUMENT.
    (grpcio's own deserializer answers INTERNAL and leaves the HTTP/2 stream open: after max_concurrent_streams
    such messages the client's connection refuses every stream.)"""

    def handle(raw: bytes, context: Any) -> Any:
        try:
            request = message.FromString(raw)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {message.DESCRIPTOR.name}: {exc}")
        return method(request, context)

    return handle


def _parsing_stream(method: Any, message: Any):
    def handle(raws: Any, context: Any) -> Any:
        def parsed() -> Any:
            for raw in raws:
                try:
                    yield message.FromString(raw)
                except DecodeError as exc:
                    yield exc

        return method(parsed(), context)

    return handle


def _handlers(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """GRPCInferenceService's methods, each parsing its own request (_parsing)."""
    handlers = {}
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request = getattr(pb, m.input_type.name)
        impl = getattr(servicer, m.name)
        serialize = getattr(pb, m.output_type.name).SerializeToString
        if m.client_streaming:
            handlers[m.name] = grpc.stream_stream_rpc_method_handler(
                _parsing_stream(impl, request), response_serializer=serialize
            )
        else:
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                _parsing(impl, request), response_serializer=serialize
            )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def peer_host(peer: str) -> str:
    """The client's address from gRPC's peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000")."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")]
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer


class GRPCServer:
    """The gRPC front: port=0 picks a free one (see .port); shutdown(grace) lets RPCs in flight finish."""

    def __init__(
        self,
        plane: DataPlane,
        host: str = "127.0.0.1",
        port: int = 8001,
        *,
        workers: int = 16,
        max_rpcs: int = 64,
        max_per_peer: int = 32,
        idle_timeout: float = 60.0,
    ):
        self.plane = plane
        limit = plane.max_body_bytes
        options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", max(limit, plane.budget.limit)),
            ("grpc.max_connection_idle_ms", int(idle_timeout * 1000)),
            ("grpc.max_concurrent_streams", 16),
            ("grpc.so_reuseport", 0),
        ]
        self._pool = futures.ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="grpc")
        self.server = grpc.server(self._pool, options=options, maximum_concurrent_rpcs=max(1, max_rpcs))
        self.streams = Streams(max(1, workers // 4), idle_timeout)
        self.servicer = InferenceServicer(plane, min(max_per_peer, max_rpcs), self.streams)
        self.server.add_generic_rpc_handlers((_handlers(self.servicer),))
        self.health = Health(plane, SERVICE)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ServingError(f"cannot listen on {address} (gRPC): {exc}") from exc
        if not self.port:
            raise ServingError(f"cannot listen on {address} (gRPC)")
        self.host = host

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> "GRPCServer":
        self.server.start()
        self.health.start()
        return self

    def shutdown(self, grace: float = 5.0) -> None:
        self.health.stop()
        self.streams.stop()
        self.server.stop(grace).wait(grace + 1)
        self._pool.shutdown(wait=False)

    def __enter__(self) -> "GRPCServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()
