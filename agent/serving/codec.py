"""The Open Inference Protocol's tensor vocabulary, shared by both transports' codecs: KServe v2 datatypes and numpy
dtypes, the decoded InferRequest, the memory charge hook, and what the protocol can carry as an output.

Request decoding (REST) lives in decode.py, response encoding in encode.py, the binary tensor data extension's
framing in binary.py and JSON tensor data in jsondata.py; gRPC's in grpc/codec.py."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.datatypes import DATATYPES
from agent.serving.errors import InferenceFailed, InvalidInput
from agent.serving.shm import ShmOut

LITTLE = sys.byteorder == "little"  # wire order is little-endian: native dtypes (the singletons) need no swap
_BYTES_NAMES = {"object", "str", "string", "bytes", "bytes_", "str_"}
_BY_NUMPY = {v: k for k, v in DATATYPES.items()}


def _bf16() -> np.dtype[Any]:
    try:
        import ml_dtypes  # shipped with onnx; numpy itself has no bfloat16
    except ImportError as exc:  # pragma: no cover - onnx depends on ml_dtypes
        raise InvalidInput("BF16 tensors need the ml_dtypes package, which is not installed") from exc
    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return dtype


def numpy_dtype(datatype: Any, where: str = "") -> np.dtype:
    """numpy dtype for a KServe datatype name; InvalidInput naming the OIP datatypes if it is missing or unknown."""
    name = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if name is None:
        what = "'datatype' is missing" if datatype is None else f"unknown datatype {str(datatype)[:40]!r}"
        raise InvalidInput(f"{where}{what}; expected one of {', '.join(DATATYPES)}")
    return _bf16() if name == "bfloat16" else np.dtype(name)


_OF_DTYPE: dict[Any, str] = {}  # numpy dtype -> datatype, for the dtypes seen (np.dtype.name is slow Python code)


def datatype_of(dtype: Any) -> str:
    """KServe datatype name for a numpy dtype or dtype name ("float32" -> "FP32", object/str -> "BYTES")."""
    if type(dtype) is str:
        return _datatype_of(dtype)
    hit = _OF_DTYPE.get(dtype)
    if hit is None:
        hit = _datatype_of(np.dtype(dtype).name)
        if len(_OF_DTYPE) < 64:
            _OF_DTYPE[dtype] = hit
    return hit


def _datatype_of(name: str) -> str:
    if name in _BYTES_NAMES or name.startswith(("str", "bytes", "<U", "|S")):
        return "BYTES"
    if name not in _BY_NUMPY:
        raise InvalidInput(f"dtype {name!r} has no Open Inference Protocol datatype")
    return _BY_NUMPY[name]


def config_type(datatype: str) -> str:
    """Triton model-config type ("FP32" -> "TYPE_FP32", "BYTES" -> "TYPE_STRING")."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


Charge = Callable[[int, str], None]  # counts bytes against the request memory budget (budget.Ledger.charge)


def no_charge(n: int, what: str) -> None:
    return None


def oip_name(dtype: np.dtype) -> str:
    """The datatype name for messages (BF16 included, which numpy names bfloat16)."""
    return "BF16" if dtype.name == "bfloat16" else datatype_of(dtype)


@dataclass
class InferRequest:
    """A decoded infer request: numpy inputs in request order and the outputs asked for."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None  # None: all outputs
    binary: dict[str, bool] = field(default_factory=dict)  # per requested output
    binary_default: bool = False
    id: str | None = None
    classes: dict[str, int] = field(default_factory=dict)  # output -> class_count (classification extension)
    params: dict[str, Any] = field(default_factory=dict)  # the request's parameters (checked: params.py)
    shm_out: dict[str, ShmOut] = field(default_factory=dict)  # outputs to write to shared memory (shm.py)
    shm_written: dict[str, int] = field(default_factory=dict)  # ... and the bytes written, once they are


def carriable(name: str, value: Any) -> np.ndarray:
    """The output as an array OIP can carry; InferenceFailed (500, a clear message) for sequences and maps
    (skl2onnx's ZipMap gives a list of dicts), which would otherwise go out as a Python repr."""
    if isinstance(value, np.ndarray) and value.dtype.kind != "O":
        return value
    if isinstance(value, np.ndarray) and all(isinstance(x, (str, bytes)) for x in value.flat[:1]):
        return value
    first = value[0] if isinstance(value, (list, tuple)) and value else value
    kind = f"sequence of {type(first).__name__}" if isinstance(value, (list, tuple)) else type(value).__name__
    raise InferenceFailed(
        f"output {name!r} is a {kind}, which the Open Inference Protocol cannot carry (it serves tensors only); "
        "qualification refuses such models: convert with options={'zipmap': False} (skl2onnx) or end the graph "
        "in tensors"
    )
