"""Serving errors: the domain errors the registry and data plane raise, and the one map to HTTP statuses.

The core (registry, codec, handlers) raises what went wrong in its own terms (InvalidInput, ModelNotFound,
ModelUnavailable, ...); only a transport turns that into its status, through `status_of` (HTTP). A second
transport (gRPC) adds its own map beside this one and shares every rule of the core.
"""

from __future__ import annotations

from agent.errors import ServingError


class InvalidInput(ServingError):
    """The request is malformed or does not match the model (name, dtype, shape, encoding)."""


BadRequest = InvalidInput  # the name the request path has used


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
    RequestTimeout: 408,
    LengthRequired: 411,
    PayloadTooLarge: 413,
    InferenceFailed: 500,
    ModelUnavailable: 503,
    ServerBusy: 503,
}


def status_of(exc: BaseException) -> int:
    """The HTTP status for an exception: the nearest serving error class in HTTP_STATUS; a transport's own
    refusal outside the table may carry its `status`; anything else 500."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    own = getattr(exc, "status", None) if isinstance(exc, ServingError) else None
    return own if isinstance(own, int) else 500
