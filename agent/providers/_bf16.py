"""bfloat16 tensors through onnxruntime's Python API, which has no numpy type for them: OrtValues in and out."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from agent.providers.base import TensorSpec

ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16


def has_bf16(specs: Sequence[TensorSpec]) -> bool:
    """True when any TensorSpec is bfloat16 (then the session must run through OrtValues)."""
    return any(s.dtype == "bfloat16" for s in specs)


def run_ort_values(rt: Any, sess: Any, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """sess.run for graphs with bfloat16 inputs or outputs: ml_dtypes.bfloat16 arrays in, the same out."""
    values = {name: _to_ort(rt, np.ascontiguousarray(arr)) for name, arr in feeds.items()}
    return [_to_numpy(v) for v in sess.run_with_ort_values(names, values)]


def _to_ort(rt: Any, arr: np.ndarray) -> Any:
    if arr.dtype.name == "bfloat16":
        return rt.OrtValue.ortvalue_from_numpy_with_onnx_type(arr.view(np.uint16), onnx_element_type=ONNX_BFLOAT16)
    return rt.OrtValue.ortvalue_from_numpy(arr)


def _to_numpy(value: Any) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return np.asarray(value.numpy())
    import ml_dtypes  # a dependency of onnx; numpy itself has no bfloat16

    shape = tuple(value.shape())
    raw = ctypes.string_at(value.data_ptr(), 2 * math.prod(shape)) if math.prod(shape) else b""
    out: np.ndarray = np.frombuffer(raw, dtype=np.dtype(ml_dtypes.bfloat16)).reshape(shape).copy()
    return out
