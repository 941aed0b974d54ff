"""The protobuf wire format, top level of one message, read in place (bytes, memoryview or mmap): no copy, no
objects. One home for it: the gRPC infer path (serving/grpc/raw: raw tensor contents as views) and delta recipes
(artifacts/recipe: ONNX initializers' raw_data offsets in a mapped model) both walk messages with it."""

from __future__ import annotations

import mmap
from collections.abc import Iterator

LENGTH_DELIMITED = 2
Data = bytes | bytearray | memoryview | mmap.mmap  # what a message is read in place from


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (truncated, an unknown wire type, field number 0)."""


def read_varint(data: Data, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it); WireError past `end` or over 10 bytes."""
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise WireError("truncated or over-long varint")


def varint(n: int) -> bytes:
    """`n` (>= 0) as a varint."""
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def fields(data: Data, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of its key, start of its value, end of its value) of every field of the
    message in data[start:end], in order; a length-delimited value's span excludes its length prefix. WireError
    (raised as the walk reaches it) when the message is not well formed: groups are refused (not in proto3)."""
    pos = start
    while pos < end:
        at = pos
        key, pos = read_varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == 0:
            _, value_end = read_varint(data, pos, end)
        elif wire == 1:
            value_end = pos + 8
        elif wire == 5:
            value_end = pos + 4
        elif wire == LENGTH_DELIMITED:
            length, pos = read_varint(data, pos, end)
            value_end = pos + length
        else:
            raise WireError(f"wire type {wire}")
        if value_end > end:
            raise WireError("a field runs past the message")
        yield number, wire, at, pos, value_end
        pos = value_end


def spans(data: Data, start: int, end: int, wanted: int) -> list[tuple[int, int]]:
    """(start, end) of every length-delimited field `wanted` of the message in data[start:end]; WireError as fields."""
    return [(a, b) for n, w, _, a, b in fields(data, start, end) if n == wanted and w == LENGTH_DELIMITED]
