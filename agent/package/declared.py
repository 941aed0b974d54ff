"""The memory budget of what model.yaml declares: every input shape (list or min/opt/max range) and every
dynamic_dims value is sized from its dims and the input's datatype before anything is allocated; one that
cannot fit names its key (a 10^12 dim is a package error, not a MemoryError in numpy)."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from agent.errors import ModelError
from agent.package.seeded import DEFAULT_DYNAMIC
from agent.providers.base import TensorSpec

FALLBACK_BUDGET = 4 << 30  # bytes, when physical memory cannot be read


def default_budget() -> tuple[int, str]:
    """(bytes, where the figure comes from): this machine's physical memory (sysconf). A declared input larger than
    that cannot be allocated here at all; serving.memory_max (agent.serving.memory) bounds what a model may use
    once it runs, and qualification enforces it."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        pages = page = -1
    if pages > 0 and page > 0:
        return pages * page, "physical memory"
    return FALLBACK_BUDGET, f"{FALLBACK_BUDGET >> 30} GiB (physical memory unknown)"


def check_declared_memory(
    specs: list[TensorSpec], dynamic_dims: dict[str, int], input_shapes: dict[str, Any], budget: tuple[int, str]
) -> None:
    """ModelError `model.yaml: <key>: ... exceeds the memory budget` for the first declaration over `budget`."""
    limit, source = budget
    by_name = {s.name: s for s in specs}
    for dim in dynamic_dims:
        for spec in specs:
            if any(str(d) == str(dim) for d in spec.shape if not (isinstance(d, int) and d > 0)):
                shape = [
                    d if isinstance(d, int) and d > 0 else int(dynamic_dims.get(str(d), DEFAULT_DYNAMIC))
                    for d in spec.shape
                ]
                _fits(f"dynamic_dims.{dim}", spec, shape, limit, source)
    for name, shape in input_shapes.items():
        found = by_name.get(name)
        if found is None:
            continue  # check_declared_shapes names it
        spec = found
        for which, dims in shape.items() if isinstance(shape, dict) else [("", shape)]:
            _fits(f"input_shapes.{name}" + (f".{which}" if which else ""), spec, list(dims), limit, source)


def _fits(key: str, spec: TensorSpec, dims: list[int], limit: int, source: str) -> None:
    try:
        itemsize = np.dtype(spec.dtype).itemsize or 1
    except TypeError:
        itemsize = 8  # strings and unknown types: at least a pointer each
    need = math.prod(int(d) for d in dims) * itemsize  # Python ints: no overflow
    if need > limit:
        raise ModelError(
            f"model.yaml: {key}: input {spec.name!r} of shape {dims} ({spec.dtype}) needs {_size(need)}, over the "
            f"memory budget {_size(limit)} ({source}); declare smaller dims"
        )


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
