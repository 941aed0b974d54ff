"""KServe v2 gRPC infer messages with their raw tensor contents in place (protobuf wire format, top level only).

A ModelInferRequest's raw_input_contents come back as views into the message as received (protobuf would copy each
twice: into its arena, then into a bytes object); the rest of the message, small, is parsed by protobuf. A response
is its protobuf-serialized fields followed by raw_output_contents written from the arrays' own memory, one copy in
all. Anything the scan does not expect (groups, a truncated field) is left to protobuf, whose DecodeError stands.
"""

from __future__ import annotations

from typing import Any

from agent.serving.proto import oip_pb2 as pb

RAW_INPUT = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT = 6  # ModelInferResponse.raw_output_contents
STREAM_INFER_RESPONSE = 2  # ModelStreamInferResponse.infer_response


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it); IndexError past `end`, ValueError when over 10 bytes."""
    value = shift = 0
    while True:
        if pos >= end:
            raise IndexError(pos)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint over 10 bytes")


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _raw_spans(raw: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    """(spans of raw_input_contents values, spans of everything else) of a request; None when the message is not
    plain enough to split (protobuf then parses all of it)."""
    end, pos, start = len(raw), 0, 0
    raws: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    try:
        while pos < end:
            at = pos
            key, pos = _varint(raw, pos, end)
            kind = key & 7
            if kind == 0:
                _, pos = _varint(raw, pos, end)
            elif kind == 1:
                pos += 8
            elif kind == 5:
                pos += 4
            elif kind == 2:
                n, pos = _varint(raw, pos, end)
                if key >> 3 == RAW_INPUT:
                    if pos + n > end:
                        return None
                    if at > start:
                        rest.append((start, at))
                    raws.append((pos, pos + n))
                    start = pos + n
                pos += n
            else:
                return None
    except (IndexError, ValueError):
        return None
    if pos != end:
        return None
    if end > start:
        rest.append((start, end))
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
