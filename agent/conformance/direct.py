"""A plain in-process ONNX Runtime CPU loop over node cases: the independent baseline that the conformance
runner's counts are checked against (tests) and timed against (bench). Uses no provider code."""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

_ONNX_BFLOAT16 = 16


def direct_ort_status(case: Any) -> str:
    """passed | failed | errored for one NodeCase: InferenceSession on CPU + onnx's own comparison."""
    import onnxruntime as ort

    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(case.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feeds = {i.name: v for i, v in zip(case.model.graph.input, case.inputs) if v is not None}
        outs = _run(ort, sess, [o.name for o in case.model.graph.output], feeds)
    except Exception:  # noqa: BLE001 - any runtime error is an "errored" case
        return "errored"
    return compare(case, outs)


def compare(case: Any, outs: list[Any]) -> str:
    """passed | failed: the outputs against the case's expected ones with onnx's own tolerances."""
    from onnx.backend.test.runner import Runner

    try:
        Runner.assert_similar_outputs(case.outputs, outs, rtol=case.rtol, atol=case.atol)
    except (AssertionError, TypeError, ValueError):
        return "failed"
    return "passed"


def _run(ort: Any, sess: Any, names: list[str], feeds: dict[str, Any]) -> list[Any]:
    """sess.run, or OrtValues when bfloat16 is involved (numpy has no bfloat16; ml_dtypes arrays are not
    accepted by sess.run)."""
    bf16 = any(isinstance(v, np.ndarray) and v.dtype.name == "bfloat16" for v in feeds.values()) or any(
        "bfloat16" in o.type for o in sess.get_outputs()
    )
    if not bf16:
        return sess.run(names, feeds)
    values = {
        k: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            np.ascontiguousarray(v).view(np.uint16), onnx_element_type=_ONNX_BFLOAT16
        )
        if v.dtype.name == "bfloat16"
        else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))
        for k, v in feeds.items()
    }
    return [_numpy(v) for v in sess.run_with_ort_values(names, values)]


def _numpy(value: Any) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    import ml_dtypes

    shape = tuple(value.shape())
    n = math.prod(shape)
    raw = ctypes.string_at(value.data_ptr(), 2 * n) if n else b""
    return np.frombuffer(raw, dtype=ml_dtypes.bfloat16).reshape(shape).copy()
