"""Inputs made from a seed: the shape a declared point resolves to, the dims a package leaves to the default, and
seeded (or `input_values`-ranged) tensors for the inputs no golden set covers (agent.package.inputs plans with
them, agent.package.fromgolden falls back to them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.errors import ModelError
from agent.providers.base import TensorSpec

DEFAULT_DYNAMIC = 1


def resolve_shape(
    spec: TensorSpec, dynamic_dims: dict[str, int], input_shapes: dict[str, Any], which: str = "opt"
) -> list[int]:
    """Concrete shape: model.yaml input_shapes (a list, or the `which` of min/opt/max), else dynamic_dims by
    dim name, else 1."""
    declared = input_shapes.get(spec.name)
    if isinstance(declared, dict):
        return list(declared.get(which) or declared["opt"])
    if declared is not None:
        return list(declared)
    return [d if isinstance(d, int) and d > 0 else int(dynamic_dims.get(str(d), DEFAULT_DYNAMIC)) for d in spec.shape]


def assumed_dims(
    specs: list[TensorSpec], dynamic_dims: dict[str, int], input_shapes: dict[str, Any], values: Any
) -> dict[str, dict[str, int]]:
    """{input: {dim: value}} for every symbolic dim that nothing in the package declares (it becomes 1)."""
    out: dict[str, dict[str, int]] = {}
    for spec in specs:
        if spec.name in input_shapes or spec.name in (values or {}):
            continue
        for i, d in enumerate(spec.shape):
            if not (isinstance(d, int) and d > 0) and str(d) not in dynamic_dims:
                out.setdefault(spec.name, {})[str(d) if d not in (None, "", -1) else f"dim{i}"] = DEFAULT_DYNAMIC
    return out


def seeded_feeds(
    specs: list[TensorSpec],
    *,
    dynamic_dims: Any = None,
    input_shapes: Any = None,
    seed: int = 0,
    which: str = "opt",
    values: Any = None,
) -> dict[str, np.ndarray]:
    """Deterministic inputs that respect dtypes and shapes (floats ~ N(0,1), ints in [0, 10), bools);
    `values` (model.yaml input_values) gives an input's value outright (a scalar fills the shape)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = resolve_shape(spec, dynamic_dims or {}, input_shapes or {}, which)
        try:
            dtype = np.dtype(spec.dtype)
        except TypeError:
            dtype = _bf16(spec)  # numpy has no bfloat16; ml_dtypes (an onnx dependency) does
        given = (values or {}).get(spec.name)
        if isinstance(given, dict):  # a range: {low, high} (ints: high exclusive, a vocabulary of token ids)
            feeds[spec.name] = _ranged(rng, spec, given, dtype, shape)
            continue
        if given is not None:
            feeds[spec.name] = _given(spec, given, dtype, shape)
            continue
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

    bf16: np.dtype = np.dtype(ml_dtypes.bfloat16)
    return bf16


def _ranged(rng: Any, spec: TensorSpec, given: dict[str, Any], dtype: np.dtype, shape: list[int]) -> np.ndarray:
    """model.yaml input_values range: integers uniform in [low, high), floats uniform in [low, high]."""
    low, high = given.get("low", 0), given["high"]
    if dtype.kind in "iu":
        ints: np.ndarray = rng.integers(int(low), int(high), shape).astype(dtype)
        return ints
    if dtype.kind == "f" or dtype.name == "bfloat16":
        floats: np.ndarray = rng.uniform(float(low), float(high), shape).astype(dtype)
        return floats
    raise ModelError(f"input_values.{spec.name}: a range needs a numeric input, not {spec.dtype}")


def _given(spec: TensorSpec, value: Any, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    """model.yaml input_values: a scalar fills the input's shape; a list is the value as written."""
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ModelError(f"input_values.{spec.name}: not a {dtype.name} value: {exc}") from None
    return np.full(shape, arr, dtype=arr.dtype) if arr.ndim == 0 and shape else arr
