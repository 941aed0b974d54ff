"""Facts read from one ONNX file: its graph's tensor specs and its sha256."""

from __future__ import annotations

from typing import Any

from agent.providers.base import TensorSpec


def graph_specs(proto: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Graph inputs (initializers excluded) and outputs as TensorSpecs."""
    inits = {i.name for i in proto.graph.initializer}
    ins = [_vi_spec(v) for v in proto.graph.input if v.name not in inits]
    outs = [_vi_spec(v) for v in proto.graph.output]
    return ins, outs


def _vi_spec(vi: Any) -> TensorSpec:
    from onnx import helper

    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return TensorSpec(vi.name, vi.type.WhichOneof("value") or "unknown", ())
    try:
        dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    except Exception:  # noqa: BLE001 - bfloat16/float8 without ml_dtypes
        dtype = str(tt.elem_type)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return TensorSpec(vi.name, dtype, dims)
