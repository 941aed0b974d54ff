"""Inputs for a declared shape that no golden set has, made from the golden set's own values.

A data-dependent model (a text-to-speech model whose output length follows its token ids, a detector whose
work follows what it finds) run on arbitrary values can take a path it never takes in service: generated token
ids outside the vocabulary it was shown, or ones that drive it to its slowest branch. So by default nothing
outside what the model has seen is chosen: integer inputs (token ids, indices) are resampled from the golden
set's values (seeded), every other input is the golden value tiled along the dims that grow (and cut where
they shrink), and an input whose golden value already has the declared shape is used as it is. model.yaml
`input_values` still wins for the inputs it names; an input whose rank differs from its golden value is seeded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.providers.base import TensorSpec

SEED = 0  # the same generated inputs on every run and every device (as seeded_feeds' default)


def from_golden(
    specs: list[TensorSpec],
    golden: dict[str, Any],
    source: str,
    *,
    which: str,
    dynamic_dims: dict[str, int],
    input_shapes: dict[str, Any],
    values: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """(feeds at the declared `which` shape, {input: how its values were made}) for the inputs that changed."""
    from agent.package.seeded import resolve_shape, seeded_feeds

    seed = SEED
    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    made: dict[str, str] = {}
    for spec in specs:
        g = golden.get(spec.name)
        shape = resolve_shape(spec, dynamic_dims, input_shapes, which) if spec.name in input_shapes else None
        if g is not None and shape is None:
            feeds[spec.name] = g  # nothing declared for it: the golden value as it is
            continue
        if spec.name in values or not isinstance(g, np.ndarray) or g.ndim != len(shape or []) or g.size == 0:
            feeds.update(seeded_feeds([spec], dynamic_dims=dynamic_dims, input_shapes=input_shapes, which=which,
                                      values=values, seed=seed))  # fmt: skip
            how = "input_values" if spec.name in values else "seeded (its golden value has another rank)"
            made[spec.name] = f"{how}, shape {list(np.shape(feeds[spec.name]))}"
            continue
        assert shape is not None
        if list(g.shape) == list(shape):
            feeds[spec.name] = g
        elif g.dtype.kind in "iu":
            feeds[spec.name] = rng.choice(g.ravel(), size=tuple(shape)).astype(g.dtype)
            made[spec.name] = f"resampled from {source}'s {g.size} values, {list(g.shape)} -> {list(shape)}"
        else:
            feeds[spec.name] = tile(g, shape)
            made[spec.name] = f"tiled from {source}, {list(g.shape)} -> {list(shape)}"
    return feeds, made


def tile(value: np.ndarray, shape: list[int]) -> np.ndarray:
    """`value` repeated along each dim that grows and cut along each that shrinks."""
    index = np.ix_(*[np.arange(n) % max(1, m) for n, m in zip(shape, value.shape)])
    return np.ascontiguousarray(value[index])
