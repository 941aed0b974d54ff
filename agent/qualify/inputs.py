"""Identical inputs for every provider: golden test_data_set_N if present, else seeded feeds from the specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import ModelError
from agent.providers.base import TensorSpec

DEFAULT_DYNAMIC = 1


def load_tensor(path: Path) -> tuple[str, Any]:
    """(name, value) from a TensorProto / SequenceProto / OptionalProto .pb file."""
    import onnx
    from onnx import numpy_helper

    data = path.read_bytes()
    errors = []
    for cls, convert in ((onnx.TensorProto, numpy_helper.to_array), (onnx.SequenceProto, numpy_helper.to_list)):
        proto = cls()
        try:
            proto.ParseFromString(data)
            if cls is onnx.TensorProto and not (proto.dims or proto.raw_data or _has_values(proto)):
                raise ValueError("empty tensor")
            return proto.name, convert(proto)
        except Exception as exc:  # noqa: BLE001 - try the next proto type
            errors.append(str(exc))
    raise ModelError(f"{path}: cannot read tensor: {errors[0]}")


def _has_values(t) -> bool:
    return any(
        len(getattr(t, f))
        for f in ("float_data", "int32_data", "int64_data", "double_data", "string_data", "uint64_data")
    )


def load_dataset(
    ds: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Feeds and expected outputs from one test_data_set_N dir; unnamed tensors map by index."""
    feeds = _load_indexed(ds, "input", inputs)
    expected = _load_indexed(ds, "output", outputs)
    if not feeds:
        raise ModelError(f"{ds}: no input_*.pb files")
    return feeds, expected


def _load_indexed(ds: Path, prefix: str, specs: list[TensorSpec]) -> dict[str, Any]:
    files = sorted(
        ds.glob(f"{prefix}_*.pb"),
        key=lambda p: int(p.stem.rsplit("_", 1)[-1]) if p.stem.rsplit("_", 1)[-1].isdigit() else 0,
    )
    out: dict[str, Any] = {}
    names = [s.name for s in specs]
    for i, f in enumerate(files):
        name, value = load_tensor(f)
        if name not in names:
            if i >= len(names):
                raise ModelError(f"{f}: the model has only {len(names)} {prefix}s")
            name = names[i]
        out[name] = value
    return out


def resolve_shape(spec: TensorSpec, dynamic_dims: dict[str, int], input_shapes: dict[str, list[int]]) -> list[int]:
    """Concrete shape: model.yaml input_shapes, else dynamic_dims by dim name, else 1."""
    if spec.name in input_shapes:
        return list(input_shapes[spec.name])
    return [d if isinstance(d, int) and d > 0 else int(dynamic_dims.get(str(d), DEFAULT_DYNAMIC)) for d in spec.shape]


def seeded_feeds(
    specs: list[TensorSpec], *, dynamic_dims=None, input_shapes=None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Deterministic inputs that respect dtypes and shapes (floats ~ N(0,1), ints in [0, 10), bools)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = resolve_shape(spec, dynamic_dims or {}, input_shapes or {})
        try:
            dtype = np.dtype(spec.dtype)
        except TypeError:
            dtype = _bf16(spec)  # numpy has no bfloat16; ml_dtypes (an onnx dependency) does
        if dtype.kind == "f" or dtype.name == "bfloat16":
            arr = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            arr = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "iu":
            arr = rng.integers(0, 10, shape).astype(dtype)
        else:
            raise ModelError(f"input {spec.name!r}: cannot generate data for type {spec.dtype}")
        feeds[spec.name] = arr
    return feeds


def _bf16(spec: TensorSpec) -> np.dtype:
    if spec.dtype != "bfloat16":
        raise ModelError(f"input {spec.name!r}: cannot generate data for type {spec.dtype}")
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def package_inputs(pkg) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """(feeds, golden outputs or None, description of the source) for a ModelPackage."""
    if pkg.datasets:
        feeds, expected = load_dataset(pkg.datasets[0], pkg.inputs, pkg.outputs)
        return feeds, (expected or None), f"golden:{pkg.datasets[0].name}"
    feeds = seeded_feeds(pkg.inputs, dynamic_dims=pkg.dynamic_dims, input_shapes=pkg.input_shapes)
    dims = ", ".join(f"{k}={v}" for k, v in pkg.dynamic_dims.items())
    return feeds, None, f"seeded(seed=0{', ' + dims if dims else ''})"


def batch_size(feeds: dict[str, Any]) -> int:
    first = next((v for v in feeds.values() if isinstance(v, np.ndarray) and v.ndim > 0), None)
    return int(first.shape[0]) if first is not None else 1
