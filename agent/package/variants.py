"""Variants of one model in a package (`model.yaml: variants: {fp32: model.onnx, int8: model.int8.onnx}`) and
the fp32 original a quantized model is compared with (`reference: FILE`): resolved, checked, described."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import ModelError
from agent.names import is_valid_name


@dataclass(frozen=True)
class Variant:
    """One model file to qualify. name None: the package's only model (rows keep their plain keys)."""

    name: str | None
    model_path: Path
    sha256: str
    precision: str  # the graph's own precision: fp32 | fp16 | bf16 | int8
    reference: Path | None = None  # the fp32 original it is compared with
    declared: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # graph inputs and outputs

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.model_path.name,
            "sha256": self.sha256,
            "precision": self.precision,
            "reference": self.reference.name if self.reference else None,
        }


def package_file(root: Path, rel: Any, key: str, meta_path: Path) -> Path:
    """A file named in model.yaml: relative, inside the package, an existing regular file."""
    if not isinstance(rel, str) or not rel:
        raise ModelError(f"{meta_path}: {key}: expected a file name inside the package")
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts:
        raise ModelError(f"{meta_path}: {key}: {rel!r} must be a relative path inside the package")
    path = root / rel
    if not path.is_file() or path.is_symlink():
        raise ModelError(f"{meta_path}: {key}: {rel!r} is not a file in the package")
    return path


def resolve(root: Path, meta: dict[str, Any]) -> tuple[Path | None, dict[str, Path]]:
    """(reference file or None, variant name -> file) from model.yaml; ModelError names the key."""
    meta_path = root / "model.yaml"
    ref = package_file(root, meta["reference"], "reference", meta_path) if meta.get("reference") else None
    raw = meta.get("variants")
    if raw is None:
        return ref, {}
    if not isinstance(raw, dict) or not raw:
        raise ModelError(f"{meta_path}: variants: expected a mapping of variant name -> model file")
    out: dict[str, Path] = {}
    for name, rel in raw.items():
        if not is_valid_name(name) or len(name) > 32:  # names' rule; short: rows are keyed variant/provider
            raise ModelError(f"{meta_path}: variants.{name}: a variant name is letters, digits, '.', '_', '-'")
        out[name] = package_file(root, rel, f"variants.{name}", meta_path)
    return ref, out


def check_same_interface(
    meta_path: Path, key: str, path: Path, model: Path, specs: tuple[list[Any], list[Any]]
) -> None:
    """A variant or reference must take and give the same tensors by name as the package's model (float
    types may differ: an fp16 graph with fp16 inputs), or serving and comparison would not line up."""
    _, declared, _ = describe(path)
    for kind, mine in (("inputs", specs[0]), ("outputs", specs[1])):
        want = [t.name for t in mine]
        got = [d["name"] for d in declared[kind]]
        if sorted(got) != sorted(want):
            raise ModelError(
                f"{meta_path}: {key}: {path.name} has {kind} {got} but {model.name} has {want}; "
                "variants and the reference must share input and output names"
            )


def describe(path: Path) -> tuple[str, dict[str, list[dict[str, Any]]], Any]:
    """(graph precision, declared inputs/outputs, proto) of a model file (load_package has checked it)."""
    import onnx

    from agent.package.onnxfile import graph_specs
    from agent.package.precision import graph_precision

    proto = onnx.load(str(path), load_external_data=False)
    ins, outs = graph_specs(proto)

    def spec(t: Any) -> dict[str, Any]:
        return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}

    return graph_precision(proto), {"inputs": [spec(t) for t in ins], "outputs": [spec(t) for t in outs]}, proto


def variants_of(pkg: Any) -> list[Variant]:
    """What to qualify: each declared variant, else the package's model. A quantized or fp16 variant is
    compared with `reference`, else with the package's fp32 variant when it has one."""
    from agent.util.hashing import sha256_file

    if not pkg.variants:
        declared = {"inputs": pkg.to_dict()["inputs"], "outputs": pkg.to_dict()["outputs"]}
        ref = pkg.reference_path if pkg.reference_path and pkg.reference_path != pkg.model_path else None
        return [Variant(None, pkg.model_path, pkg.sha256, pkg.precision, ref, declared)]
    described = {name: describe(path) for name, path in pkg.variants.items()}
    fp32 = next((pkg.variants[n] for n, d in described.items() if d[0] == "fp32"), None)
    out = []
    for name, path in pkg.variants.items():
        precision, declared, _ = described[name]
        ref = pkg.reference_path or (fp32 if precision != "fp32" else None)
        sha = pkg.sha256 if path == pkg.model_path else sha256_file(path)
        out.append(Variant(name, path, sha, precision, ref if ref != path else None, declared))
    return out


def adapt_feeds(feeds: dict[str, Any], declared: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The package's inputs cast to a variant's float input types (an fp16 graph with fp16 inputs gets the
    same values as float16); other inputs are passed as they are."""
    want = {d["name"]: d["dtype"] for d in declared.get("inputs", [])}
    out = {}
    for name, value in feeds.items():
        dtype = want.get(name)
        if isinstance(value, np.ndarray) and dtype and value.dtype.kind == "f" and dtype != value.dtype.name:
            try:
                value = value.astype(_np_dtype(dtype))
            except TypeError:
                pass
        out[name] = value
    return out


def _np_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)
