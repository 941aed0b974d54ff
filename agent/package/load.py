"""Model packages: directory, .tar.gz (safe extraction) or bare .onnx; checker, shape inference, model.yaml."""

from __future__ import annotations

import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ModelError
from agent.package import golden
from agent.package.declared import check_declared_memory, default_budget
from agent.package.onnxfile import graph_specs
from agent.providers.base import TensorSpec
from agent.util.hashing import sha256_file

MAX_EXTRACT_BYTES = 4 << 30
MAX_MEMBERS = 10_000
MAX_META_BYTES = 1 << 20  # model.yaml
_META_KEYS = {
    "name",
    "version",
    "task",
    "dynamic_dims",
    "input_shapes",
    "input_values",
    "tolerances",
    "required_providers",
    "description",
    "reference",
    "variants",
    "golden_source",  # how the golden outputs were made (edge-agent package writes it)
    "golden_made_by",  # {runtime, provider, version} that made them (agent.package.golden)
}


@dataclass
class ModelPackage:
    source: Path  # what the user gave
    root: Path  # directory holding model.onnx (extracted for archives)
    model_path: Path
    sha256: str
    name: str
    version: str
    task: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    dynamic_dims: dict[str, int] = field(default_factory=dict)
    input_shapes: dict[str, Any] = field(default_factory=dict)  # name -> [dims] or {min, opt, max}
    tolerances: dict[str, Any] = field(default_factory=dict)
    required_providers: list[str] = field(default_factory=list)
    datasets: list[Path] = field(default_factory=list)
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    opsets: dict[str, int] = field(default_factory=dict)
    op_types: list[str] = field(default_factory=list)
    size_bytes: int = 0
    precision: str = "fp32"  # the graph's own precision (agent.package.precision)
    reference_path: Path | None = None  # model.yaml reference: the fp32 original
    variants: dict[str, Path] = field(default_factory=dict)  # model.yaml variants: name -> model file

    def to_dict(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "name": self.name,
            "version": self.version,
            "path": str(self.source),
            "task": self.task,
            "size_bytes": self.size_bytes,
            "opsets": self.opsets,
            "op_types": self.op_types,
            "inputs": [_spec(t) for t in self.inputs],
            "outputs": [_spec(t) for t in self.outputs],
            "golden_datasets": [p.name for p in self.datasets],
            "golden_made_by": golden.made_by(self.meta) if self.datasets else None,
            "precision": self.precision,
            "reference": self.reference_path.name if self.reference_path else None,
            "variants": {k: v.name for k, v in self.variants.items()},
        }

    def tolerance_override(self, provider: str, precision: str | None) -> dict[str, Any]:
        """model.yaml tolerances: flat values apply to all; `provider` / `provider:precision` keys refine."""
        flat = {k: v for k, v in self.tolerances.items() if not isinstance(v, dict)}
        for key in (provider, f"{provider}:{precision}" if precision else None):
            if key and isinstance(self.tolerances.get(key), dict):
                flat.update(self.tolerances[key])
        return flat


def _spec(t: TensorSpec) -> dict[str, Any]:
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def load_package(
    path: str | Path, *, extract_to: str | Path | None = None, max_bytes: int = MAX_EXTRACT_BYTES
) -> ModelPackage:
    """Load and validate a package. Raises ModelError with the checker's reason on bad input."""
    source = Path(path)
    if not source.exists():
        raise ModelError(f"model package not found: {source}")
    kind = _kind(source)
    if kind == "dir":
        root = source
    elif kind == "archive":
        dest = Path(extract_to) if extract_to else Path(tempfile.mkdtemp(prefix="edge-agent-pkg-"))
        root = extract_archive(source, dest, max_bytes=max_bytes)
    else:
        root = source.parent
    meta = _read_meta(root) if kind != "onnx" else {}
    model_path = source if kind == "onnx" else _find_model(root, meta)
    return _build(source, root, model_path, meta)


def _kind(source: Path) -> str:
    """dir | archive | onnx, by name or, for content-addressed blobs without a suffix, by magic bytes."""
    if source.is_dir():
        return "dir"
    if source.name.endswith((".tar.gz", ".tgz", ".tar")):
        return "archive"
    if source.suffix == ".onnx":
        return "onnx"
    with open(source, "rb") as f:
        head = f.read(512)
    if head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar":
        return "archive"
    return "onnx"  # the checker gives the precise reason if it is not one


def _find_model(root: Path, meta: dict[str, Any]) -> Path:
    if (root / "model.onnx").is_file():
        return root / "model.onnx"
    first = next(iter((meta.get("variants") or {}).values()), None) if isinstance(meta.get("variants"), dict) else None
    if isinstance(first, str) and (root / first).is_file() and ".." not in Path(first).parts:
        return root / first  # a package of variants without model.onnx: the first variant is the model
    found = sorted(root.glob("*.onnx"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise ModelError(f"{root}: no model.onnx in the package")
    raise ModelError(f"{root}: several .onnx files and no model.onnx: {', '.join(p.name for p in found)}")


def extract_archive(archive: Path, dest: Path, *, max_bytes: int = MAX_EXTRACT_BYTES) -> Path:
    """Extract safely (no absolute paths, no '..', no links leaving dest, size limit); return the package root."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            _check_members(members, max_bytes)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:  # Python < 3.11.4 (Debian bookworm's 3.11.2, hence Raspberry Pi OS): checked above; plain modes
                for m in members:
                    m.mode &= 0o755
                    m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
                tar.extractall(dest, members=members)
    except (tarfile.TarError, EOFError, OSError, zlib_error()) as exc:
        raise ModelError(f"{archive}: cannot extract archive: {exc}") from exc
    entries = [p for p in dest.iterdir() if not p.name.startswith(".")]
    if not (dest / "model.onnx").exists() and len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest


def zlib_error() -> type[Exception]:
    import zlib

    return zlib.error


def _check_members(members: list[tarfile.TarInfo], max_bytes: int) -> None:
    if len(members) > MAX_MEMBERS:
        raise ModelError(f"archive has {len(members)} entries (limit {MAX_MEMBERS})")
    total = 0
    for m in members:
        name = m.name
        if name.startswith(("/", "\\")) or ".." in Path(name).parts:
            raise ModelError(f"archive entry escapes the package: {name!r}")
        if m.issym() or m.islnk():
            target = os.path.normpath(os.path.join(os.path.dirname(name), m.linkname)) if m.issym() else m.linkname
            if m.linkname.startswith("/") or target.startswith(".."):
                raise ModelError(f"archive link {name!r} points outside the package: {m.linkname!r}")
        elif not (m.isfile() or m.isdir()):
            raise ModelError(f"archive entry {name!r} is not a regular file or directory")
        total += max(m.size, 0)
        if total > max_bytes:
            raise ModelError(f"archive expands beyond the size limit ({max_bytes} bytes)")


def _read_meta(root: Path) -> dict[str, Any]:
    path = root / "model.yaml"
    if not path.exists():
        return {}
    from agent.util.yamlsafe import load_file

    meta = load_file(path, "model.yaml", ModelError, max_bytes=MAX_META_BYTES) or {}
    if not isinstance(meta, dict):
        raise ModelError(f"{path}: expected a mapping at the top level")
    _validate_meta(meta, path)
    return meta


def _validate_meta(meta: dict[str, Any], path: Path) -> None:
    def bad(key: str, what: str) -> ModelError:
        return ModelError(f"{path}: {key}: {what}")

    unknown = set(meta) - _META_KEYS
    if unknown:
        raise bad(sorted(unknown)[0], f"unknown key (known: {', '.join(sorted(_META_KEYS))})")
    for key in ("name", "task"):
        if key in meta and not isinstance(meta[key], str):
            raise bad(key, "expected a string")
    if not isinstance(meta.get("dynamic_dims") or {}, dict):
        raise bad("dynamic_dims", "expected a mapping of dim name to a positive integer")
    for dim, val in (meta.get("dynamic_dims") or {}).items():
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise bad(f"dynamic_dims.{dim}", "expected a positive integer")
    shapes = meta.get("input_shapes") or {}
    if not isinstance(shapes, dict):
        raise bad("input_shapes", "expected a mapping of input name to a shape or {min, opt, max}")
    for name, shape in shapes.items():
        _validate_shape(shape, f"input_shapes.{name}", bad)
    if not isinstance(meta.get("input_values") or {}, dict):
        raise bad("input_values", "expected a mapping of input name to a value (a number or a list)")
    for name, value in (meta.get("input_values") or {}).items():
        if isinstance(value, dict):
            _validate_range(value, f"input_values.{name}", bad)
        elif not _plain_value(value):
            raise bad(f"input_values.{name}", "expected a number, a boolean, a (nested) list of them, or {low, high}")
    _validate_tolerances(meta.get("tolerances") or {}, bad)
    if "golden_made_by" in meta:
        golden.validate(meta["golden_made_by"], bad)
    req = meta.get("required_providers", [])
    if not isinstance(req, list) or not all(isinstance(p, str) for p in req):
        raise bad("required_providers", "expected a list of provider names")


def _validate_shape(shape: Any, key: str, bad: Any) -> None:
    def dims(value: Any, where: str) -> list[int]:
        if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
            raise bad(where, "expected a list of non-negative integers")
        if any(d < 0 for d in value):
            raise bad(where, "expected a list of non-negative integers")
        return value

    if not isinstance(shape, dict):
        dims(shape, key)
        return
    unknown = set(shape) - {"min", "opt", "max"}
    if unknown or "opt" not in shape:
        raise bad(key, "a range is {min: [...], opt: [...], max: [...]} (opt required)")
    got = {k: dims(shape[k], f"{key}.{k}") for k in ("min", "opt", "max") if k in shape}
    if len({len(v) for v in got.values()}) > 1:
        raise bad(key, "min, opt and max must have the same rank")
    order = [got[k] for k in ("min", "opt", "max") if k in got]
    for lo, hi in zip(order, order[1:]):
        if any(a > b for a, b in zip(lo, hi)):
            raise bad(key, f"expected min <= opt <= max in every dim, got {lo} then {hi}")


def _validate_range(value: dict[str, Any], key: str, bad: Any) -> None:
    """input_values range: {low, high} (integers: token ids in [low, high); floats: uniform in [low, high])."""
    if set(value) - {"low", "high"} or "high" not in value:
        raise bad(key, "a range is {low: N, high: M} (high required; integers are drawn from [low, high))")
    low, high = value.get("low", 0), value["high"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) or not low < high:
        raise bad(key, f"expected numbers with low < high, got low {low!r}, high {high!r}")


def _plain_value(value: Any) -> bool:
    if isinstance(value, list):
        return all(_plain_value(v) for v in value)
    return isinstance(value, (int, float, bool))


def check_declared_shapes(pkg: ModelPackage) -> None:
    """model.yaml input_shapes/input_values name real inputs, with the graph's rank and fixed dims."""
    specs = {t.name: t for t in pkg.inputs}
    for key in ("input_shapes", "input_values"):
        for name in pkg.meta.get(key) or {}:
            if name not in specs:
                raise ModelError(
                    f"model.yaml: {key}.{name}: the model has no input {name!r} (inputs: {', '.join(specs)})"
                )
    for name, shape in pkg.input_shapes.items():
        spec = specs[name]
        for which, dims in shape.items() if isinstance(shape, dict) else [("", shape)]:
            key = f"input_shapes.{name}" + (f".{which}" if which else "")
            if len(dims) != len(spec.shape):
                raise ModelError(f"model.yaml: {key}: rank {len(dims)}, but input {name!r} has rank {len(spec.shape)}")
            for i, (d, g) in enumerate(zip(dims, spec.shape)):
                if isinstance(g, int) and g > 0 and d != g:
                    raise ModelError(f"model.yaml: {key}: dim {i} is {d}, but the model fixes it at {g}")


def _validate_tolerances(tols: Any, bad: Any) -> None:
    from agent.targets.schema import TOLERANCE_FIELDS

    if not isinstance(tols, dict):
        raise bad("tolerances", "expected a mapping")
    for key, val in tols.items():
        items = val.items() if isinstance(val, dict) else [(key, val)]
        prefix = f"tolerances.{key}." if isinstance(val, dict) else "tolerances."
        for k, v in items:
            if k not in TOLERANCE_FIELDS:
                raise bad(f"{prefix}{k}".rstrip("."), f"unknown tolerance (known: {', '.join(TOLERANCE_FIELDS)})")
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise bad(f"{prefix}{k}", "expected a non-negative number or null")


def _build(source: Path, root: Path, model_path: Path, meta: dict[str, Any]) -> ModelPackage:
    from agent.package import variants
    from agent.package.precision import graph_precision

    proto = check_model(model_path)
    inputs, outputs = graph_specs(proto)
    reference, declared_variants = variants.resolve(root, meta)
    named = {"reference": reference, **{f"variants.{k}": v for k, v in declared_variants.items()}}
    for key, path in named.items():
        if path is not None and path != model_path:
            check_model(path)
            variants.check_same_interface(root / "model.yaml", key, path, model_path, (inputs, outputs))
    pkg = ModelPackage(
        source=source,
        root=root,
        model_path=model_path,
        sha256=sha256_file(model_path),
        name=str(meta.get("name") or _default_name(source, model_path)),
        version=str(meta.get("version", "0")),
        task=meta.get("task"),
        meta=meta,
        dynamic_dims=dict(meta.get("dynamic_dims") or {}),
        input_shapes={
            k: (dict(v) if isinstance(v, dict) else list(v)) for k, v in (meta.get("input_shapes") or {}).items()
        },
        tolerances=dict(meta.get("tolerances") or {}),
        required_providers=list(meta.get("required_providers") or []),
        datasets=golden_datasets(root) if model_path.parent == root else [],
        inputs=inputs,
        outputs=outputs,
        opsets={(o.domain or "ai.onnx"): o.version for o in proto.opset_import},
        op_types=sorted({(f"{n.domain}." if n.domain else "") + n.op_type for n in proto.graph.node}),
        size_bytes=model_path.stat().st_size,
        precision=graph_precision(proto),
        reference_path=reference,
        variants=declared_variants,
    )
    check_declared_shapes(pkg)
    check_declared_memory(pkg.inputs, pkg.dynamic_dims, pkg.input_shapes, default_budget())
    return pkg


def golden_datasets(root: Path) -> list[Path]:
    """The package's test_data_set_N directories in N order."""
    return sorted((p for p in Path(root).glob("test_data_set_*") if p.is_dir()), key=_ds_index)


def read_meta(root: Path) -> dict[str, Any]:
    """model.yaml of a package directory, validated ({} when there is none)."""
    return _read_meta(Path(root))


def _ds_index(p: Path) -> int:
    tail = p.name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 1 << 30


def _default_name(source: Path, model_path: Path) -> str:
    if model_path.name != "model.onnx":
        return model_path.stem
    return source.name.split(".")[0] if source.is_file() else source.name


def check_model(model_path: Path) -> Any:
    """onnx.checker (full) + strict shape inference; returns the ModelProto with inferred shapes."""
    import onnx

    try:
        proto = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for corrupt bytes
        raise ModelError(f"{model_path}: not a valid ONNX model: {_first_line(exc)}") from exc
    try:
        onnx.checker.check_model(str(model_path), full_check=True)
    except Exception as exc:  # noqa: BLE001 - ValidationError, InferenceError, ...
        raise ModelError(f"{model_path}: rejected by the ONNX checker: {_first_line(exc)}") from exc
    return proto


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:2])[:400]
