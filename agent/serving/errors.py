"""Serving errors: the domain errors the registry and data plane raise, and the one map to HTTP statuses.

The core (registry, codec, data plane, auth, shared memory) raises what went wrong in its own terms (InvalidInput,
ModelNotFound, ModelUnavailable, ...); only a transport turns that into its status: `status_of` here for HTTP,
`grpc/status.code_of` for gRPC. Every serving error class lives in this module; none carries a status of its own.
"""

from __future__ import annotations

from agent.errors import ServingError


class InvalidInput(ServingError):
    """The request is malformed or does not match the model (name, dtype, shape, encoding)."""


class NotFound(ServingError):
    """Unknown endpoint or tensor name in the path."""


class ModelNotFound(NotFound):
    """Unknown model or version (or one never activated)."""


class ModelUnavailable(ServingError):
    """The model is known but not serving right now (stop-then-start gap, shutting down)."""


class ServerBusy(ServingError):
    """The server cannot take this request now (request body memory budget full): retry shortly."""


class InferenceFailed(ServingError):
    """The runtime raised after the request passed validation: a server-side failure."""


class Forbidden(ServingError):
    """An action that changes what the device serves (repository load/unload), asked of a server without a token."""


class Conflict(ServingError):
    """The model is being deployed: the repository action would race the deployment."""


class AlreadyExists(ServingError):
    """A shared memory region of that name is registered already (unregister it first)."""


class Unsupported(ServingError):
    """An extension this server does not implement."""


class TooManyFailures(ServingError):
    """A peer that sent too many wrong tokens must wait `retry_after` seconds before it may try again."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class PeerBusy(ServingError):
    """One client address (or the server) has as many calls or streams open as it may: retry shortly."""


# ---- the HTTP transport's own refusals -----------------------------------------------------------------------


class Unauthorized(ServingError):
    """Missing or wrong bearer token."""


class MethodNotAllowed(ServingError):
    """The path exists but not for this method; `allow` lists the methods it takes (the Allow header)."""

    def __init__(self, message: str, allow: str = ""):
        super().__init__(message)
        self.allow = allow


class RequestTimeout(ServingError):
    """The request head or body did not arrive in time."""


class LengthRequired(ServingError):
    """A POST without Content-Length (chunked bodies are not accepted)."""


class PayloadTooLarge(ServingError):
    """The request body is over the server's limit."""


HTTP_STATUS: dict[type[ServingError], int] = {
    InvalidInput: 400,
    Unauthorized: 401,
    NotFound: 404,
    MethodNotAllowed: 405,
    Forbidden: 403,
    RequestTimeout: 408,
    Conflict: 409,
    AlreadyExists: 409,
    LengthRequired: 411,
    PayloadTooLarge: 413,
    TooManyFailures: 429,
    PeerBusy: 429,
    InferenceFailed: 500,
    Unsupported: 501,
    ModelUnavailable: 503,
    ServerBusy: 503,
}


def status_of(exc: BaseException) -> int:
    """The HTTP status for an exception: the nearest serving error class in HTTP_STATUS; anything else 500."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500
