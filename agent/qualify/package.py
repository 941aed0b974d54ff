"""Model packages: directory, .tar.gz (safe extraction) or bare .onnx; checker, shape inference, model.yaml."""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ModelError
from agent.providers.base import TensorSpec

MAX_EXTRACT_BYTES = 4 << 30
MAX_MEMBERS = 10_000
_META_KEYS = {
    "name",
    "version",
    "task",
    "dynamic_dims",
    "input_shapes",
    "tolerances",
    "required_providers",
    "description",
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
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    tolerances: dict[str, Any] = field(default_factory=dict)
    required_providers: list[str] = field(default_factory=list)
    datasets: list[Path] = field(default_factory=list)
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    opsets: dict[str, int] = field(default_factory=dict)
    op_types: list[str] = field(default_factory=list)
    size_bytes: int = 0

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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    model_path = source if kind == "onnx" else _find_model(root)
    meta = _read_meta(root) if kind != "onnx" and model_path.parent == root else {}
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


def _find_model(root: Path) -> Path:
    if (root / "model.onnx").is_file():
        return root / "model.onnx"
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
    import yaml

    try:
        meta = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ModelError(f"{path}: invalid YAML: {exc}") from exc
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
    for dim, val in (meta.get("dynamic_dims") or {}).items():
        if not isinstance(val, int) or val < 1:
            raise bad(f"dynamic_dims.{dim}", "expected a positive integer")
    for name, shape in (meta.get("input_shapes") or {}).items():
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise bad(f"input_shapes.{name}", "expected a list of non-negative integers")
    _validate_tolerances(meta.get("tolerances") or {}, bad)
    req = meta.get("required_providers", [])
    if not isinstance(req, list) or not all(isinstance(p, str) for p in req):
        raise bad("required_providers", "expected a list of provider names")


def _validate_tolerances(tols: Any, bad) -> None:
    from agent.qualify.accuracy import TOLERANCE_FIELDS

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
    proto = check_model(model_path)
    inputs, outputs = graph_specs(proto)
    return ModelPackage(
        source=source,
        root=root,
        model_path=model_path,
        sha256=sha256_file(model_path),
        name=str(meta.get("name") or _default_name(source, model_path)),
        version=str(meta.get("version", "0")),
        task=meta.get("task"),
        meta=meta,
        dynamic_dims=dict(meta.get("dynamic_dims") or {}),
        input_shapes={k: list(v) for k, v in (meta.get("input_shapes") or {}).items()},
        tolerances=dict(meta.get("tolerances") or {}),
        required_providers=list(meta.get("required_providers") or []),
        datasets=sorted((p for p in model_path.parent.glob("test_data_set_*") if p.is_dir()), key=_ds_index)
        if model_path.parent == root
        else [],
        inputs=inputs,
        outputs=outputs,
        opsets={(o.domain or "ai.onnx"): o.version for o in proto.opset_import},
        op_types=sorted({(f"{n.domain}." if n.domain else "") + n.op_type for n in proto.graph.node}),
        size_bytes=model_path.stat().st_size,
    )


def _ds_index(p: Path) -> int:
    tail = p.name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 1 << 30


def _default_name(source: Path, model_path: Path) -> str:
    if model_path.name != "model.onnx":
        return model_path.stem
    return source.name.split(".")[0] if source.is_file() else source.name


def check_model(model_path: Path):
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


def graph_specs(proto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Graph inputs (initializers excluded) and outputs as TensorSpecs."""
    inits = {i.name for i in proto.graph.initializer}
    ins = [_vi_spec(v) for v in proto.graph.input if v.name not in inits]
    outs = [_vi_spec(v) for v in proto.graph.output]
    return ins, outs


def _vi_spec(vi) -> TensorSpec:
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
