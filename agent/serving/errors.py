"""ServingError subclasses, each carrying the HTTP status the OIP server answers with."""

from __future__ import annotations

from agent.errors import ServingError


class BadRequest(ServingError):
    """The request is malformed or does not match the model (name, dtype, shape, encoding)."""

    status = 400


class Unauthorized(ServingError):
    """Missing or wrong bearer token."""

    status = 401


class NotFound(ServingError):
    """Unknown model, version, endpoint or tensor name in the path."""

    status = 404


class MethodNotAllowed(ServingError):
    """The path exists but not for this method; `allow` lists the methods it takes (the Allow header)."""

    status = 405

    def __init__(self, message: str, allow: str = ""):
        super().__init__(message)
        self.allow = allow


class RequestTimeout(ServingError):
    """The request head or body did not arrive in time."""

    status = 408


class LengthRequired(ServingError):
    """A POST without Content-Length (chunked bodies are not accepted)."""

    status = 411


class PayloadTooLarge(ServingError):
    status = 413


class ModelUnavailable(ServingError):
    """The model is known but not serving right now (stop-then-start gap, shutting down)."""

    status = 503


class ServerBusy(ServingError):
    """The server cannot take this request now (request body memory budget full): retry shortly."""

    status = 503


class InferenceFailed(ServingError):
    """The runtime raised after the request passed validation: a server-side failure."""

    status = 500


def status_of(exc: BaseException) -> int:
    """HTTP status for an exception: its own for serving errors, 500 for everything else."""
    return int(getattr(exc, "status", 500)) if isinstance(exc, ServingError) else 500
