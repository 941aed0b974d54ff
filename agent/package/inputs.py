"""Identical inputs for every provider: golden test_data_set_N if present, else seeded feeds from the specs.

model.yaml declares shapes per input: `input_shapes: {x: [1, 3, 224, 224]}` (fixed) or `{x: {min: [..],
opt: [..], max: [..]}}` (a range, as TensorRT optimisation profiles do), `dynamic_dims: {H: 32}` by dim name,
and `input_values: {sr: 16000}` for scalar or semantic inputs. Accuracy is judged on golden data (else seeded
feeds at `opt`), latency is measured at `opt` (and at `max` when declared); a declared shape no golden set has is
made from the golden values (agent.package.fromgolden). A symbolic dim nobody declared is
assumed to be 1 and named in `assumed`. The daemon's warm-up replays exactly these inputs, golden first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import ModelError
from agent.package.seeded import assumed_dims, resolve_shape, seeded_feeds
from agent.providers.base import TensorSpec


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


def _has_values(t: Any) -> bool:
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


@dataclass
class InputPlan:
    """What qualification feeds: accuracy inputs (+ expected outputs when golden), latency at opt and max."""

    accuracy: dict[str, Any]
    expected: dict[str, Any] | None
    latency: dict[str, Any]
    at_max: dict[str, Any] | None = None
    assumed: dict[str, dict[str, int]] = field(default_factory=dict)
    desc: str = ""
    sources: dict[str, str] = field(default_factory=dict)  # point (golden, opt, max) -> where its inputs come from
    at_min: dict[str, Any] | None = None  # a range's min, when it differs from opt: timed to fit the max's estimate
    generated: dict[str, str] = field(default_factory=dict)  # "<point>.<input>" -> how its values were made

    def warm_sets(self) -> list[dict[str, Any]]:
        """The inputs in the order the daemon replays them before a swap: golden (accuracy) first."""
        sets = [self.accuracy]
        for extra in (self.latency, self.at_max):
            if extra is not None and all(extra is not s for s in sets):
                sets.append(extra)
        return sets


def plan_inputs(
    specs: list[TensorSpec], outputs: list[TensorSpec], meta: dict[str, Any], datasets: list[Path]
) -> InputPlan:
    """The inputs of one package (model.yaml `meta`, its golden `datasets`), the same in qualify and daemon."""
    dyn = dict(meta.get("dynamic_dims") or {})
    shapes = dict(meta.get("input_shapes") or {})
    values = dict(meta.get("input_values") or {})
    declared = bool(shapes or values)
    kw: dict[str, Any] = {"dynamic_dims": dyn, "input_shapes": shapes, "values": values}
    ranged = any(isinstance(v, dict) and v.get("max") for v in shapes.values())
    dims = ", ".join(f"{k}={v}" for k, v in dyn.items())
    if datasets:  # the package's own inputs wherever they fit; generated only what is missing
        from agent.package.fromgolden import from_golden

        feeds, expected = load_dataset(datasets[0], specs, outputs)
        gold = f"golden:{datasets[0].name}"
        sources, generated = {"golden": gold}, {}
        timed, timed_at = _timed_set(datasets, specs, outputs, shapes, "opt", feeds)
        if timed is None:  # no golden set has the declared opt shape: made from the golden values, said so
            timed, made = from_golden(specs, feeds, gold, which="opt", **kw)
            timed_at = "generated at declared opt from the golden values"
            generated.update({f"opt.{k}": v for k, v in made.items()})
        sources["opt"] = timed_at
        at_max = None
        if ranged:
            at_max, where_max = _timed_set(datasets, specs, outputs, shapes, "max", None)
            if at_max is None:
                at_max, made = from_golden(specs, feeds, gold, which="max", **kw)
                where_max = "generated at declared max from the golden values"
                generated.update({f"max.{k}": v for k, v in made.items()})
            sources["max"] = where_max
            timed_at += f"; at max: {where_max}"
        at_min = None
        if ranged and _min_differs(specs, shapes):
            at_min, sources["min"] = _timed_set(datasets, specs, outputs, shapes, "min", None)
            if at_min is None:
                at_min, made = from_golden(specs, feeds, gold, which="min", **kw)
                sources["min"] = "generated at declared min from the golden values"
                generated.update({f"min.{k}": v for k, v in made.items()})
        where = gold
        where += f"; latency on {timed_at}" if timed_at != where else ""
        return InputPlan(feeds, expected or None, timed, at_max, {}, where, sources, generated=generated, at_min=at_min)
    opt = seeded_feeds(specs, **kw)
    at_max = seeded_feeds(specs, which="max", **kw) if ranged else None
    assumed = assumed_dims(specs, dyn, shapes, values)
    desc = f"seeded(seed=0{', ' + dims if dims else ''}{', declared shapes' if declared else ''})"
    sources = {"opt": desc, **({"max": "seeded at declared max"} if at_max is not None else {})}
    at_min = seeded_feeds(specs, which="min", **kw) if ranged and _min_differs(specs, shapes) else None
    sources.update({"min": "seeded at declared min"} if at_min is not None else {})
    return InputPlan(opt, None, opt, at_max, assumed, desc, sources, at_min=at_min)


def _min_differs(specs: list[TensorSpec], shapes: dict[str, Any]) -> bool:
    """A declared range whose min is not its opt (a second size to fit the max point's estimate on)."""
    return any(
        resolve_shape(s, {}, shapes, "min") != resolve_shape(s, {}, shapes, "opt") for s in specs if s.name in shapes
    )


def _timed_set(
    datasets: Any, specs: list[TensorSpec], outputs: Any, shapes: Any, which: str, first: Any
) -> tuple[Any, Any]:
    """The package's own inputs to time at `which` (opt or max): the first golden set whose shapes match the
    declared ones (every set matches where nothing is declared for `which`); (None, None) when none does."""
    want = {n: resolve_shape(s, {}, shapes, which) for s in specs if (n := s.name) in shapes}
    if which == "max" and not want:
        return None, None
    for i, ds in enumerate(datasets):
        feeds = first if i == 0 and first is not None else load_dataset(ds, specs, outputs)[0]
        if all(list(np.shape(feeds.get(n))) == shape for n, shape in want.items()):  # type: ignore[arg-type]
            return feeds, f"golden:{ds.name}"
    return None, None


def package_plan(pkg: Any) -> InputPlan:
    """The InputPlan of a ModelPackage."""
    return plan_inputs(pkg.inputs, pkg.outputs, pkg.meta, pkg.datasets)


def package_inputs(pkg: Any) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """(accuracy feeds, golden outputs or None, description of the source) for a ModelPackage."""
    plan = package_plan(pkg)
    return plan.accuracy, plan.expected, plan.desc


def batch_size(feeds: dict[str, Any]) -> int:
    first = next((v for v in feeds.values() if isinstance(v, np.ndarray) and v.ndim > 0), None)
    return int(first.shape[0]) if first is not None else 1
