"""`edge-agent package --check DIR`: every fix a hand-made package needs, found by the code the daemon loads
packages with (agent.package.load). A model.yaml key the loader refuses is named with its fix, set aside, and
the package is loaded again, so one run lists the fix of every key, not only the first; then the golden sets are
read and fitted to the model's inputs as `edge-agent package` writes them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import ModelError
from agent.providers.base import TensorSpec


@dataclass(frozen=True)
class Finding:
    """One thing a package needs: where (a file or model.yaml key), what is wrong, what to do."""

    where: str
    problem: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where, "problem": self.problem, "fix": self.fix}


MAX_ROUNDS = 64  # keys set aside before giving up (a model.yaml is at most 1 MiB)
_KEY = re.compile(r"model\.yaml: (.+?): (.*)", re.S)


def _load_every_key(path: Path) -> tuple[Any, list[Finding]]:
    """(the package as the daemon loads it, or None; one Finding per model.yaml key it refuses)."""
    from agent.package import load as loader
    from agent.util.yamlsafe import load_file

    try:
        return loader.load_package(path), []
    except ModelError as exc:
        first = exc
    yaml_path = path / "model.yaml"
    if not (path.is_dir() and yaml_path.is_file() and _KEY.search(str(first))):
        return None, [Finding(str(path), str(first), _fix_for(str(first)))]
    try:
        meta = load_file(yaml_path, "model.yaml", ModelError, max_bytes=loader.MAX_META_BYTES) or {}
    except ModelError as exc:
        return None, [Finding(str(yaml_path), str(exc), "fix the YAML syntax")]
    found: list[Finding] = []
    error: ModelError = first
    for _ in range(MAX_ROUNDS):
        m = _KEY.search(str(error))
        if m is None or not isinstance(meta, dict) or not _drop(meta, m.group(1)):
            found.append(Finding(str(path), str(error), _fix_for(str(error))))
            return None, found
        found.append(Finding(f"model.yaml: {m.group(1)}", m.group(2), _fix_for(str(error))))
        try:
            loader._validate_meta(meta, yaml_path)
            pkg = loader._build(path, path, loader._find_model(path, meta), meta)
        except ModelError as exc:
            error = exc
            continue
        return pkg, found
    return None, found


def _drop(meta: dict[str, Any], key: str) -> bool:
    """Set aside `key` (`input_shapes.x`: that input's entry; `bogus`: the top-level key); False if absent."""
    top, _, rest = key.partition(".")
    if top not in meta:
        return False
    inner = meta[top]
    if rest and isinstance(inner, dict) and rest in inner:
        del inner[rest]
    else:
        del meta[top]
    return True


def check(path: Path) -> list[Finding]:
    """Every fix a package needs, as the daemon would find them (empty: it will be accepted and qualified)."""
    from agent.generative.package import check_generative, is_generative

    if is_generative(path):  # kind: generative (docs/generative.md): the runtime's own layout, no golden sets
        return [Finding(*f) for f in check_generative(path)]
    return _check_onnx(Path(path))


def _check_onnx(path: Path) -> list[Finding]:
    from agent.package.inputs import load_dataset
    from agent.package.seeded import assumed_dims

    pkg, found = _load_every_key(path)
    if pkg is None:
        return found
    meta = pkg.meta
    for key in ("name", "version"):
        if key not in meta:
            found.append(
                Finding(
                    f"model.yaml: {key}", f"no {key}", f"add `{key}:` (the daemon reports it; default {key} is used)"
                )
            )
    if not pkg.datasets:
        found.append(
            Finding(
                "test_data_set_0",
                "no golden data: accuracy is judged against a reference run, latency on generated inputs",
                "write real inputs and their outputs: edge-agent package MODEL.onnx --inputs FILE... --out DIR",
            )
        )
        assumed = assumed_dims(pkg.inputs, pkg.dynamic_dims, pkg.input_shapes, meta.get("input_values"))
        for inp, dims in assumed.items():
            found.append(
                Finding(
                    f"model.yaml: input_shapes.{inp}",
                    f"symbolic dims {', '.join(dims)} are declared nowhere and would be guessed as 1",
                    f"add input_shapes: {{{inp}: [...]}} with the shape it serves, or golden data",
                )
            )
    for ds in pkg.datasets:
        try:
            feeds, expected = load_dataset(ds, pkg.inputs, pkg.outputs)
        except ModelError as exc:
            found.append(Finding(ds.name, str(exc), "rewrite the set with edge-agent package"))
            continue
        for spec in pkg.inputs:
            if spec.name not in feeds:
                found.append(Finding(ds.name, f"no value for input {spec.name!r}", "add input_K.pb for it"))
                continue
            try:
                fit(spec, np.asarray(feeds[spec.name]), f"{ds.name} input {spec.name!r}")
            except ModelError as exc:
                found.append(Finding(ds.name, str(exc), "save the input in the model's dtype and shape"))
        if not expected:
            found.append(
                Finding(ds.name, "inputs without outputs: nothing to judge accuracy against", "add output_K.pb")
            )
    return found


def _fix_for(message: str) -> str:
    if "checker" in message or "not a valid ONNX" in message:
        return "re-export the model (the ONNX checker must accept it: python -m onnx.checker MODEL.onnx)"
    if "model.yaml" in message:
        return "correct that key of model.yaml (docs/qualification.md lists the keys)"
    return "see the message"


def fit(spec: TensorSpec, arr: np.ndarray, where: str) -> tuple[np.ndarray, str | None]:
    """The array in the input's dtype and rank; the note says what was converted."""
    note = None
    want = np.dtype(spec.dtype)
    if arr.ndim == len(spec.shape) - 1:
        arr, note = arr[np.newaxis], f"{where}: added a batch dimension"
    if arr.ndim == 3 and len(spec.shape) == 4 and arr.shape[-1] == 3 and spec.shape[1] == 3:
        arr = arr.transpose(2, 0, 1)[np.newaxis]
        note = f"{where}: image HWC -> NCHW"
    if len(spec.shape) == 4 and arr.ndim == 4 and arr.shape[-1] == 3 and spec.shape[1] == 3 and arr.shape[1] != 3:
        arr = arr.transpose(0, 3, 1, 2)
        note = f"{where}: image NHWC -> NCHW"
    if arr.ndim != len(spec.shape):
        raise ModelError(
            f"{where}: rank {arr.ndim} {list(arr.shape)}, but input {spec.name!r} has rank {len(spec.shape)}"
        )
    for i, (d, g) in enumerate(zip(arr.shape, spec.shape)):
        if isinstance(g, int) and g > 0 and d != g:
            raise ModelError(f"{where}: dim {i} is {d}, but the model fixes input {spec.name!r} at {list(spec.shape)}")
    if arr.dtype != want:
        if arr.dtype.kind == "u" and arr.dtype.itemsize == 1 and want.kind == "f":
            arr, note = (arr.astype(want) / 255.0).astype(want), f"{where}: uint8 -> {want.name} / 255"
        elif arr.dtype.kind == want.kind or (arr.dtype.kind in "iu" and want.kind in "iu"):
            if want.kind in "iu" and arr.size and (arr.min() < np.iinfo(want).min or arr.max() > np.iinfo(want).max):
                raise ModelError(f"{where}: values do not fit {want.name}")
            arr = arr.astype(want)
        else:
            raise ModelError(f"{where}: {arr.dtype.name} values for input {spec.name!r} of type {want.name}")
    return np.ascontiguousarray(arr), note
