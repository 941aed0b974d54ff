"""KServe v2 gRPC infer messages with their raw tensor contents in place (protobuf wire format, top level only).

A ModelInferRequest's raw_input_contents come back as views into the message as received (protobuf would copy each
twice: into its arena, then into a bytes object); the rest of the message, small, is parsed by protobuf. A response
is its protobuf-serialized fields followed by raw_output_contents written from the arrays' own memory, one copy in
all. Anything the scan does not expect (groups, a truncated field) is left to protobuf, whose DecodeError stands.
"""

from __future__ import annotations

from typing import Any

from agent.serving.proto import oip_pb2 as pb
from agent.util.pbwire import LENGTH_DELIMITED, WireError, fields, varint

RAW_INPUT = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT = 6  # ModelInferResponse.raw_output_contents
STREAM_INFER_RESPONSE = 2  # ModelStreamInferResponse.infer_response


def _raw_spans(raw: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    """(spans of raw_input_contents values, spans of everything else) of a request; None when the message is not
    plain enough to split (protobuf then parses all of it)."""
    start = 0
    raws: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    try:
        for number, wire, at, a, b in fields(raw, 0, len(raw)):
            if number == RAW_INPUT and wire == LENGTH_DELIMITED:
                if at > start:
                    rest.append((start, at))
                raws.append((a, b))
                start = b
    except WireError:
        return None
    if len(raw) > start:
        rest.append((start, len(raw)))
    return raws, rest


def parse_request(raw: bytes) -> tuple[Any, list[memoryview]]:
    """(the ModelInferRequest without its raw_input_contents, those contents as views into `raw`); DecodeError for
    bytes that are not a ModelInferRequest."""
    spans = _raw_spans(raw)
    if spans is None:
        request = pb.ModelInferRequest.FromString(raw)  # raises DecodeError, or parses what the scan did not
        contents = [memoryview(c) for c in request.raw_input_contents]
        del request.raw_input_contents[:]
        return request, contents
    raws, rest = spans
    view = memoryview(raw)
    if not raws:
        return pb.ModelInferRequest.FromString(raw), []
    head = b"".join(view[a:b] for a, b in rest)
    return pb.ModelInferRequest.FromString(head), [view[a:b] for a, b in raws]


def response_parts(resp: Any, contents: list[Any]) -> tuple[list[Any], int]:
    """(buffers, total length) of a ModelInferResponse: `resp` serialized, then each of `contents` (bytes or
    C-contiguous arrays) as its raw_output_contents, in order."""
    head = resp.SerializeToString()
    parts: list[Any] = [head]
    total = len(head)
    for c in contents:
        n = memoryview(c).nbytes
        key = varint(RAW_OUTPUT << 3 | 2) + varint(n)
        parts.append(key)
        total += len(key) + n
        if n:
            parts.append(c)
    return parts, total


def response_bytes(resp: Any, contents: list[Any], stream: bool = False) -> bytes:
    """The serialized ModelInferResponse (stream: wrapped as a ModelStreamInferResponse's infer_response), each
    raw output copied once, into the message."""
    parts, total = response_parts(resp, contents)
    if stream:
        parts.insert(0, varint(STREAM_INFER_RESPONSE << 3 | 2) + varint(total))
    return b"".join(parts)
