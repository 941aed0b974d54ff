"""Project-wide exception types. Everything below the CLI raises these; only the CLI prints or exits."""

import re


class EdgeAgentError(Exception):
    """Base class: an expected failure with a one-line, user-facing message."""

    exit_code = 1


class ConfigError(EdgeAgentError):
    """Invalid configuration; the message names the key path."""

    exit_code = 2


class ModelError(EdgeAgentError):
    """A model or model package is missing, corrupt, or fails the ONNX checker."""


class ManifestError(EdgeAgentError):
    """A manifest is malformed, unsigned, wrongly signed, expired or a downgrade."""


class ArtifactError(EdgeAgentError):
    """An artifact could not be fetched or verified (hash mismatch, stall, no space). `permanent`: trying the
    same pull again cannot help; the others (stalls, a source gone) are retried with backoff."""

    permanent = False


class ArtifactRefused(ArtifactError):
    """The source or the bytes are wrong for good: a hash mismatch, no usable source, an HTTP 401/403/410/416."""

    permanent = True


class DiskFull(ArtifactError):
    """Not enough free space under the state directory for the artifact (plus the reserve)."""

    permanent = True


class ProviderError(EdgeAgentError):
    """An execution provider cannot create a session or run."""


class TransportError(EdgeAgentError):
    """Broker unreachable, refused, or a protocol violation."""


class LifecycleError(EdgeAgentError):
    """An illegal transition or a failed lifecycle action."""


class ServingError(EdgeAgentError):
    """A serving-side failure (model not loaded, bad request)."""


_SOURCE_LOCATION = re.compile(
    r"(?:Exception from |\bat )?(?:[\w.\-]*/)*[\w.\-]+\.(?:cpp|cc|cxx|c|hpp|hh|h|py):\d+(?::\d+)?:?\s*"
)


def without_source_locations(text: str) -> str:
    """A runtime's message without the source locations it carries ("Exception from src/x.cpp:224:",
    "/onnxruntime_src/.../bfc_arena.cc:360", "at rowtask.py:126"): reasons say what, not where in whose code."""
    return re.sub(r"\s{2,}", " ", _SOURCE_LOCATION.sub("", text)).strip()
