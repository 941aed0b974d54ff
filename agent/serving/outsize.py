"""Response size before any byte is produced: the encoded size of every output (JSON or binary) from its shape and
datatype, checked against the response limit and counted against the request memory budget (issue 29 item 1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from agent.serving.codec import Charge, InferRequest, datatype_of
from agent.serving.errors import PayloadTooLarge, ServerBusy

Hold = Callable[[int], None]  # counts bytes already taken (budget.Ledger.hold)


def no_hold(n: int) -> None:
    return None


# Longest JSON text of one element by datatype, its separating comma included (json.dumps of numpy's tolist()):
# "-9223372036854775808," is 21 characters; a float goes out as Python's repr of a double, at most 24 characters
# ("-2.2250738585072014e-308"); BF16/FP16/FP32 are widened to double first, so the same bound holds.
JSON_ELEMENT_CHARS = {
    "BOOL": 6,
    "INT8": 5,
    "UINT8": 4,
    "INT16": 7,
    "UINT16": 6,
    "INT32": 12,
    "UINT32": 11,
    "INT64": 21,
    "UINT64": 21,
    "FP16": 25,
    "BF16": 25,
    "FP32": 25,
    "FP64": 25,
}
# What encoding holds beyond the text, per element: tolist() makes a Python object (int or float: 24-32 bytes)
# and a list slot (8 bytes); the text exists twice (str, then its UTF-8 bytes).
JSON_ELEMENT_OBJECT = 40
JSON_TEXT_COPIES = 2
BYTES_CHAR_JSON = 6  # a byte of a BYTES element may become a \u00XX escape
HEAD_SLACK = 256  # per output: name, datatype, shape, parameters


class ResponseTooLarge(PayloadTooLarge):
    """The response the request asks for would exceed the server's limit (413): nothing of it was produced."""


def _bytes_chars(arr: np.ndarray) -> int:
    total = 0
    for item in arr.reshape(-1):
        total += len(item) if isinstance(item, (bytes, str)) else len(str(item))
    return total


def output_cost(name: str, value: Any, as_binary: bool) -> tuple[int, int]:
    """(encoded bytes, memory bytes encoding holds beyond the array) of one output; shape and datatype only
    (BYTES: the element lengths)."""
    if not isinstance(value, np.ndarray):
        return HEAD_SLACK, 0  # not a tensor: codec.carriable refuses it with its own message
    count = int(value.size)
    try:
        datatype = datatype_of(value.dtype)
    except Exception:  # noqa: BLE001 - codec refuses it later, naming the dtype
        return HEAD_SLACK, 0
    if datatype == "BYTES":
        chars = _bytes_chars(value)
        if as_binary:
            size = 4 * count + chars * 4  # str elements: up to 4 UTF-8 bytes per code point
            return HEAD_SLACK + size, size  # joined into one blob
        text = chars * BYTES_CHAR_JSON + 3 * count
        return HEAD_SLACK + text, text * JSON_TEXT_COPIES + JSON_ELEMENT_OBJECT * count
    if as_binary:
        return HEAD_SLACK + value.nbytes, 0  # the array's own memory goes on the wire (or one copy when swapped)
    text = JSON_ELEMENT_CHARS.get(datatype, 25) * count
    return HEAD_SLACK + text, text * JSON_TEXT_COPIES + JSON_ELEMENT_OBJECT * count


def check_response(outputs: dict[str, Any], req: InferRequest, limit: int, charge: Charge, hold: Hold = no_hold) -> int:
    """Refuse (ResponseTooLarge, 413) a response whose encoded size would exceed `limit`, naming the way out;
    count the memory it holds against the request budget before any byte is produced, so that admission counts
    responses with requests: the output arrays (already made: `hold`, never refused) and what encoding them will
    take (`charge`: refused with ResponseTooLarge when it cannot fit, ServerBusy when others fill the budget).
    Returns the encoded size bound."""
    encoded = extra = arrays = 0
    as_json = []
    for name, value in outputs.items():
        if name in req.shm_written:  # written to the client's shared memory: only its entry is encoded
            encoded += HEAD_SLACK
            continue
        binary = bool(req.binary.get(name, req.binary_default))
        size, more = output_cost(name, value, binary)
        encoded += size
        extra += more
        arrays += value.nbytes if isinstance(value, np.ndarray) else 0
        if not binary:
            as_json.append(name)
    hint = (
        "ask for binary outputs (parameters.binary_data_output: true, or binary_data per output: "
        f"{', '.join(repr(n) for n in as_json[:4])}) or send a smaller batch"
        if as_json
        else "send a smaller batch"
    )
    if encoded > limit:
        raise ResponseTooLarge(
            f"the response would take up to {encoded} bytes encoded, over the server's limit of {limit} bytes; {hint}"
        )
    hold(arrays)
    try:
        charge(extra, "encoding the response")
    except ServerBusy:
        raise
    except PayloadTooLarge as exc:
        raise ResponseTooLarge(f"{exc}; {hint}") from None
    return encoded
