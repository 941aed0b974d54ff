"""KServe v2 gRPC front end (grpcio's sync server): GRPCInferenceService (grpc/service) + grpc.health.v1 over the same
DataPlane as HTTP.

Limits: a message's declared length is checked against max_body_bytes by gRPC's core before it is allocated
(RESOURCE_EXHAUSTED); a message that arrived is counted against the shared request memory budget before it is
decoded; requests are handled by a bounded pool only once complete (slow senders hold a connection, not a thread),
at most `max_rpcs` at once (the rest get RESOURCE_EXHAUSTED at once), at most `max_per_peer` from one client
address, and connections idle for idle_timeout are closed. Token: metadata `authorization: Bearer <token>` on every
RPC but ServerLive, ServerReady and the health service. Domain errors become status codes in grpc/status only.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2_grpc

from agent.errors import ServingError
from agent.serving.dataplane import DataPlane
from agent.serving.grpc.service import InferenceServicer
from agent.serving.grpc.watch import Health, Streams
from agent.serving.proto import oip_pb2 as pb

SERVICE = "inference.GRPCInferenceService"


def _parsing(method: Callable[[Any, Any], Any], message: Any) -> Callable[[bytes, Any], Any]:
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


def _handlers(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """GRPCInferenceService's methods: infer on message bytes (grpc/raw: no protobuf copies of the tensors), the rest
    parsing their own request."""
    handlers = {}
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        impl = getattr(servicer, m.name)
        if m.client_streaming:  # ModelStreamInfer
            handlers[m.name] = grpc.stream_stream_rpc_method_handler(impl)
        elif m.name == "ModelInfer":
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(impl)
        else:
            serialize = getattr(pb, m.output_type.name).SerializeToString
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                _parsing(impl, getattr(pb, m.input_type.name)), response_serializer=serialize
            )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


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
            self.port: int = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ServingError(f"cannot listen on {address} (gRPC): {exc}") from exc
        if not self.port:
            raise ServingError(f"cannot listen on {address} (gRPC)")
        self.host = host

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> GRPCServer:
        self.server.start()
        self.health.start()
        return self

    def shutdown(self, grace: float = 5.0) -> None:
        self.health.stop()
        self.streams.stop()
        self.server.stop(grace).wait(grace + 1)
        self._pool.shutdown(wait=False)

    def __enter__(self) -> GRPCServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
