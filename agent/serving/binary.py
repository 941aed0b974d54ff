"""The binary tensor data extension's framing, both transports: where a binary input lies in a body (BinarySlot) and
its array read in place; BYTES tensors as length-prefixed elements, both ways; arrays whose memory is wire bytes."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from agent.serving.budget import BYTES_CHAR_FACTOR, BYTES_ELEMENT_COST
from agent.serving.codec import LITTLE, Charge, no_charge
from agent.serving.errors import InvalidInput


class BinarySlot(NamedTuple):
    """Where one binary input lies in the body's binary part, checked against its shape and datatype."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    elements: int
    offset: int
    size: int
    wire: np.dtype | None  # the little-endian dtype to read it as; None for BYTES (length-prefixed elements)


def parse_bytes(name: str, blob: memoryview, count: int, charge: Charge = no_charge) -> np.ndarray:
    end = len(blob)
    if count * 4 > end:  # each element has at least its 4-byte length: checked before anything is allocated
        raise InvalidInput(f"input {name!r}: shape holds {count} BYTES elements but its data has only {end} bytes")
    charge(count * BYTES_ELEMENT_COST + BYTES_CHAR_FACTOR * end, f"BYTES input {name!r}")
    arr = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > end:
            raise InvalidInput(f"input {name!r}: BYTES data ends after {i} of {count} elements")
        (n,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        if pos + n > end:
            raise InvalidInput(f"input {name!r}: BYTES element {i} claims {n} bytes past the end of its data")
        try:
            arr[i] = str(blob[pos : pos + n], "utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(
                f"input {name!r}: BYTES element {i} is not UTF-8 (ONNX string tensors carry text)"
            ) from None
        pos += n
    if pos != end:
        raise InvalidInput(f"input {name!r}: {end - pos} bytes left over after {count} BYTES elements")
    return arr


def wire_dtype(dtype: np.dtype) -> np.dtype | None:
    return None if dtype.kind == "O" else dtype if LITTLE or dtype.itemsize == 1 else dtype.newbyteorder("<")


def binary_tensor(slot: BinarySlot, binary: memoryview, charge: Charge = no_charge) -> np.ndarray:
    """The input's array: a view into the body (BYTES: parsed elements); the slot's size was checked."""
    if slot.wire is None:
        blob = binary[slot.offset : slot.offset + slot.size]
        return parse_bytes(slot.name, blob, slot.elements, charge).reshape(slot.shape)
    arr = np.frombuffer(binary, dtype=slot.wire, count=slot.elements, offset=slot.offset)
    if slot.dtype == np.bool_:
        arr = arr.view(np.uint8) != 0
    return arr.reshape(slot.shape)


def binary_blob(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for item in arr.reshape(-1):
            b = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    return np.ascontiguousarray(
        arr, dtype=arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
    ).tobytes()


def wire_ready(arr: np.ndarray) -> bool:
    """Can the array's own memory go on the wire as binary data (C-contiguous, little-endian, numeric)?"""
    dtype = arr.dtype
    return arr.flags.c_contiguous and dtype.kind in "biuf" and (dtype.itemsize == 1 or (LITTLE and dtype.isnative))
