"""`edge-agent package`: build a model package from a model and real sample inputs, or check a hand-made one.

A package is the directory the daemon and `qualify` read (agent.package.load): model.onnx, model.yaml and
test_data_set_N/{input,output}_K.pb. Here the inputs come from the user's files (.npy, .npz, .pb; .wav through
the standard library; images through Pillow where it is installed); the shapes the graph leaves symbolic are
read off those inputs and proposed as `input_shapes` (a range when the sets differ); the golden outputs are the
fp32 run of onnxruntime's CPU provider, and model.yaml says so (`golden_source`, and `golden_made_by`:
{runtime, version, provider}, which qualification reads). The result is then loaded
with the same code the daemon uses (load_package, plan_inputs), so a package this writes is one it accepts.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.errors import ModelError
from agent.package.check import check, fit
from agent.package.inputbudget import (
    Budget,
    charge_image,
    charge_pb,
    charge_wav,
    default_budget,
    read_npy_file,
    read_npz,
)
from agent.providers.base import TensorSpec

if TYPE_CHECKING:  # pragma: no cover
    import onnx

MAX_INPUT_FILE_BYTES = 1 << 30  # a sample input bigger than this is not a sample


@dataclass
class Built:
    """What `package` wrote and what it inferred (the CLI prints it, --json gives it as is)."""

    out: Path
    name: str
    version: str
    sets: int
    input_shapes: dict[str, Any]
    symbolic: dict[str, dict[str, list[int]]]  # input -> {dim name: values seen across the sets}
    golden_source: str
    notes: list[str] = field(default_factory=list)
    golden_made_by: dict[str, str] = field(default_factory=dict)  # {runtime, version, provider}

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "name": self.name,
            "version": self.version,
            "golden_sets": self.sets,
            "input_shapes": self.input_shapes,
            "symbolic_dims": self.symbolic,
            "golden_source": self.golden_source,
            "golden_made_by": self.golden_made_by,
            "notes": self.notes,
        }


def read_sample(path: Path, budget: Budget | None = None) -> dict[str, np.ndarray] | list[np.ndarray]:
    """One input file: a mapping (an .npz, or a named .pb) or a positional list of arrays. Each size the file
    declares is charged to the budget before it is decoded (agent.package.inputbudget)."""
    path = Path(path)
    budget = budget if budget is not None else Budget(default_budget())
    if not path.is_file():
        raise ModelError(f"{path}: no such file")
    if path.stat().st_size > MAX_INPUT_FILE_BYTES:
        raise ModelError(
            f"{path}: {path.stat().st_size} bytes is over the {MAX_INPUT_FILE_BYTES} byte limit for a sample"
        )
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            return [read_npy_file(path, budget)]
        if suffix == ".npz":
            return read_npz(path, budget)
        if suffix == ".pb":
            from agent.package.inputs import load_tensor

            charge_pb(path, budget)
            name, value = load_tensor(path)
            return {name: np.asarray(value)} if name else [np.asarray(value)]
        if suffix == ".wav":
            return [_read_wav(path, budget)]
        if suffix in (".png", ".jpg", ".jpeg", ".bmp"):
            charge_image(path, budget)
            return [_read_image(path)]
    except (ValueError, OSError, EOFError) as exc:
        raise ModelError(f"{path}: cannot read: {exc}") from None
    raise ModelError(f"{path}: unknown input format {suffix!r} (use .npy, .npz, .pb, .wav or an image)")


def _read_wav(path: Path, budget: Budget) -> np.ndarray:
    """PCM WAV as float32 in [-1, 1], mono (channels averaged), shape [samples]."""
    import wave

    with wave.open(str(path), "rb") as w:
        width, channels, frames = w.getsampwidth(), w.getnchannels(), w.getnframes()
        charge_wav(path, frames, channels, width, budget)
        raw = w.readframes(frames)
    kinds = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2147483648.0)}
    if width not in kinds:
        raise ModelError(f"{path}: {8 * width}-bit WAV is not supported (8, 16 or 32-bit PCM)")
    dtype, offset, scale = kinds[width]
    data = (np.frombuffer(raw, dtype=dtype).astype(np.float32) - offset) / scale
    mono: np.ndarray = data.reshape(-1, channels).mean(axis=1).astype(np.float32)
    return mono


def _read_image(path: Path) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise ModelError(
            f"{path}: reading images needs Pillow (pip install pillow), or save the input as .npy"
        ) from None
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))  # HWC uint8
    except Image.DecompressionBombError as exc:  # Pillow's own pixel cap, under a --max-input-bytes above it
        raise ModelError(f"{path}: {exc}") from None


def group_sets(
    samples: list[tuple[Path, dict[str, np.ndarray] | list[np.ndarray]]], specs: list[TensorSpec]
) -> list[dict[str, np.ndarray]]:
    """Input sets from the files in order: a named file fills its inputs; positional arrays fill the next
    unfilled inputs; a set is complete when every input has a value."""
    names = [s.name for s in specs]
    sets: list[dict[str, np.ndarray]] = []
    current: dict[str, np.ndarray] = {}
    for path, sample in samples:
        items = (
            list(sample.items())
            if isinstance(sample, dict)
            else [(next(n for n in names if n not in current), a) for a in sample]
        )
        for name, arr in items:
            if name not in names:
                raise ModelError(f"{path}: the model has no input {name!r} (inputs: {', '.join(names)})")
            if name in current:
                raise ModelError(f"{path}: input {name!r} given twice in one set")
            current[name] = arr
            if len(current) == len(names):
                sets.append(current)
                current = {}
    if current:
        missing = [n for n in names if n not in current]
        raise ModelError(f"the last input set has no value for {', '.join(missing)}: give one file per input, in order")
    if not sets:
        raise ModelError("no inputs given: pass --inputs FILE... (one file per model input, or .npz files)")
    return sets


def infer_shapes(
    specs: list[TensorSpec], sets: list[dict[str, np.ndarray]]
) -> tuple[dict[str, Any], dict[str, dict[str, list[int]]]]:
    """input_shapes for every input with a symbolic dim (a list when all sets agree, else {min, opt, max} with
    opt = the first set), and the symbolic dims by name with the values seen."""
    shapes: dict[str, Any] = {}
    symbolic: dict[str, dict[str, list[int]]] = {}
    for spec in specs:
        dyn = [i for i, g in enumerate(spec.shape) if not (isinstance(g, int) and g > 0)]
        if not dyn:
            continue
        seen = [list(s[spec.name].shape) for s in sets]
        symbolic[spec.name] = {_dim_name(spec.shape, i): sorted({sh[i] for sh in seen}) for i in dyn}
        if all(sh == seen[0] for sh in seen):
            shapes[spec.name] = seen[0]
        else:
            lo = [min(sh[i] for sh in seen) for i in range(len(seen[0]))]
            hi = [max(sh[i] for sh in seen) for i in range(len(seen[0]))]
            shapes[spec.name] = {"min": lo, "opt": seen[0], "max": hi}
    return shapes, symbolic


def _dim_name(shape: tuple[Any, ...], i: int) -> str:
    """A symbolic dim's name in the graph; `dimI` where it has none (or shares '?' with others)."""
    g = shape[i]
    named = isinstance(g, str) and g not in ("", "?") and sum(1 for d in shape if d == g) == 1
    return g if named else f"dim{i}"


def reference_run(model_path: Path, sets: list[dict[str, np.ndarray]]) -> tuple[list[list[np.ndarray]], str]:
    """The fp32 CPU outputs of every set and a line saying how they were made."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        outs = [sess.run(None, feeds) for feeds in sets]
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types with the reason
        raise ModelError(f"{model_path}: onnxruntime CPU cannot run the given inputs: {_short(exc)}") from None
    return outs, f"onnxruntime {ort.__version__} CPUExecutionProvider, the model as given (edge-agent package)"


def golden_made_by() -> dict[str, str]:
    """model.yaml golden_made_by for reference_run's outputs (agent.package.golden)."""
    import onnxruntime as ort

    from agent.package.golden import by_onnxruntime

    return by_onnxruntime(ort.__version__, "CPUExecutionProvider")


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass(frozen=True)
class Label:
    """What the package says it is: model.yaml's name (None: the model file's stem), version and task."""

    name: str | None
    version: str
    task: str | None = None


def build(
    model: Path,
    inputs: list[Path],
    out: Path,
    *,
    label: Label,
    force: bool,
    max_input_bytes: int | None = None,
) -> Built:
    """Write the package under `out` and check it as the daemon will. max_input_bytes: what all inputs together
    may decode into (default: inputbudget.default_budget())."""
    name, version, task = label.name, label.version, label.task
    import yaml
    from onnx import numpy_helper

    from agent.package.load import check_model
    from agent.package.onnxfile import graph_specs

    model, out = Path(model), Path(out)
    proto = check_model(model)
    specs, outputs = graph_specs(proto)
    if out.exists() and any(out.iterdir()) and not force:
        raise ModelError(f"{out}: not empty (use --force to overwrite)")
    budget = Budget(default_budget() if max_input_bytes is None else max_input_bytes)
    sets = group_sets([(p, read_sample(p, budget)) for p in inputs], specs)
    notes: list[str] = []
    fitted = []
    for k, feeds in enumerate(sets):
        row = {}
        for spec in specs:
            row[spec.name], note = fit(spec, feeds[spec.name], f"set {k} input {spec.name!r}")
            if note:
                notes.append(note)
        fitted.append(row)
    shapes, symbolic = infer_shapes(specs, fitted)
    outs, how = reference_run(model, fitted)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("test_data_set_*"):
        shutil.rmtree(stale)
    shutil.copyfile(model, out / "model.onnx")
    _copy_external_data(proto, model.parent, out)
    meta: dict[str, Any] = {"name": name or model.stem, "version": str(version), **({"task": task} if task else {})}
    if shapes:
        meta["input_shapes"] = shapes
    meta["golden_source"] = how
    meta["golden_made_by"] = golden_made_by()  # which runtime and provider: qualify says when a row is that one
    (out / "model.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=1 << 16))
    for k, (feeds, results) in enumerate(zip(fitted, outs)):
        ds = out / f"test_data_set_{k}"
        ds.mkdir()
        for i, spec in enumerate(specs):
            (ds / f"input_{i}.pb").write_bytes(numpy_helper.from_array(feeds[spec.name], spec.name).SerializeToString())
        for i, (spec, value) in enumerate(zip(outputs, results)):
            tensor = numpy_helper.from_array(np.asarray(value), spec.name)
            (ds / f"output_{i}.pb").write_bytes(tensor.SerializeToString())
    problems = check(out)
    if problems:
        raise ModelError(f"{out}: the written package does not pass its own check: {problems[0].problem}")
    return Built(out, meta["name"], meta["version"], len(fitted), shapes, symbolic, how, notes, meta["golden_made_by"])


def _copy_external_data(proto: onnx.ModelProto, src_dir: Path, out: Path) -> None:
    """External-data files the model names, copied beside it (their locations stay relative)."""
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                rel = Path(entry.value)
                if rel.is_absolute() or ".." in rel.parts:
                    raise ModelError(f"initializer {init.name!r}: external data outside the model's folder: {rel}")
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                if not (out / rel).exists():
                    shutil.copyfile(src_dir / rel, out / rel)
