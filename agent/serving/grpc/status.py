"""The gRPC edge: domain errors (serving/errors.py) as gRPC status codes, in one table (`code_of`), and the client's
address from gRPC's peer string."""

from __future__ import annotations

import grpc

from agent.errors import ServingError
from agent.serving import errors as e

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


def code_of(exc: BaseException) -> grpc.StatusCode:
    """The one place a domain error becomes a gRPC status code (INTERNAL for anything not in GRPC_CODE)."""
    for cls in type(exc).__mro__:
        if cls in GRPC_CODE:
            return GRPC_CODE[cls]
    return grpc.StatusCode.INTERNAL


def message_of(exc: BaseException) -> str:
    """The status details: a domain error's message; for anything else (a bug) its type and message."""
    return str(exc) if isinstance(exc, ServingError) else f"internal error: {type(exc).__name__}: {exc}"


def peer_host(peer: str) -> str:
    """The client's address from gRPC's peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000")."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")]
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer
