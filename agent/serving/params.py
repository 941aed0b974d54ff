"""Request and output parameters of the inference protocol: which are honoured, which are refused (one home for
both transports)."""

from __future__ import annotations

from typing import Any

from agent.serving.errors import InvalidInput

# Honoured: binary_data_output (codec), shared_memory_* (shm). Accepted with Triton's meaning for a stateless,
# single-instance model: priority (one queue: every request has the same priority), timeout (microseconds a request
# may wait in a queue: requests never queue for a model here, they run or are refused at once), headers.
KNOWN = {"binary_data_output", "priority", "timeout", "headers"}
SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")
SHM = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


def check_request(params: dict[str, Any]) -> None:
    """Refuse request parameters the server cannot honour (sequence batching; unknown names)."""
    seq = [k for k in SEQUENCE if k in params and params[k] not in (0, "", False, None)]
    if seq:
        raise InvalidInput(f"parameter(s) {seq} need a sequence model; this server serves stateless models only")
    unknown = sorted(k for k in params if k not in KNOWN and k not in SEQUENCE)
    if unknown:
        raise InvalidInput(f"unsupported request parameter(s) {unknown[:8]}; supported: {sorted(KNOWN)}")
    timeout = params.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0):
        raise InvalidInput("parameter 'timeout' must be a non-negative integer (microseconds)")


def class_count(name: str, params: dict[str, Any]) -> int | None:
    """The classification extension's class_count of one output (None when not asked)."""
    raw = params.get("classification")
    if raw is None or raw is False or raw == 0:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise InvalidInput(f"output {name!r}: classification must be a positive integer (class_count)")
    return int(raw)
