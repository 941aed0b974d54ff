"""Write an fp32 package's int8 twin: a package of variants {fp32, int8} made with onnxruntime.quantization
(static QDQ calibrated on the package's own test data, or dynamic), which the device qualifies side by side."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent.errors import ModelError

MODES = ("static", "dynamic")
INT8_FILE = "model.int8.onnx"


class _Calibration:
    """onnxruntime.quantization CalibrationDataReader over the package's golden input sets."""

    def __init__(self, sets: list[dict[str, Any]]):
        self._it: Iterator[dict[str, Any]] = iter(sets)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._it, None)


MIN_CALIBRATION_SETS = 8  # fewer real inputs than this and the calibrated ranges are one example's


def calibration_sets(pkg: Any) -> list[dict[str, Any]]:
    """Every test_data_set_N's inputs; ModelError when the package has none (static needs real data)."""
    from agent.package.inputs import load_dataset

    if not pkg.datasets:
        raise ModelError(
            f"{pkg.source}: static quantization calibrates on the package's test data, and it has none; "
            "add test_data_set_N/input_*.pb files (real inputs) or use --mode dynamic"
        )
    return [load_dataset(ds, pkg.inputs, pkg.outputs)[0] for ds in pkg.datasets]


def quantize_package(
    source: str | Path, out: str | Path, *, mode: str = "static", progress: Callable[..., None] | None = None
) -> dict[str, Any]:
    """Write OUT: the package as it is (its model is the fp32 variant) plus model.int8.onnx, and a model.yaml
    declaring `variants: {fp32: <model>, int8: model.int8.onnx}`. Returns what was written."""
    from agent.package.load import load_package

    say = progress or (lambda event, **f: None)
    if mode not in MODES:
        raise ModelError(f"unknown quantization mode {mode!r}; use one of {', '.join(MODES)}")
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ModelError(f"{dest}: already exists and is not an empty directory")
    with tempfile.TemporaryDirectory(prefix="edge-agent-quantize-") as tmp:
        say("load", path=str(source))
        pkg = load_package(source, extract_to=Path(tmp) / "src")
        if pkg.variants:
            raise ModelError(f"{pkg.source}: already a package of variants ({', '.join(pkg.variants)})")
        if pkg.precision != "fp32":
            raise ModelError(f"{pkg.model_path.name}: the model is {pkg.precision} already; quantize its fp32 original")
        sets = calibration_sets(pkg) if mode == "static" else []
        work = Path(tmp) / "out"
        shutil.copytree(pkg.root, work, ignore=shutil.ignore_patterns(".*"))
        int8 = work / INT8_FILE
        if mode == "static" and len(sets) < MIN_CALIBRATION_SETS:
            say(
                "warning",
                message=f"static quantization calibrates on {len(sets)} input set(s): the activation ranges come from "
                f"that alone; add test_data_set_N with more real inputs (>= {MIN_CALIBRATION_SETS} advised) or the "
                "int8 variant may fail qualification on inputs it never saw",
            )
        say("quantize", mode=mode, calibration_sets=len(sets))
        _quantize(pkg.model_path, int8, mode, sets)
        _write_meta(work, pkg, pkg.model_path.relative_to(pkg.root).as_posix())
        say("check", path=str(int8))
        made = load_package(work)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.rmdir()
        shutil.move(str(work), str(dest))
    import onnx

    from agent.package.precision import graph_precision, quant_ops

    proto = onnx.load(str(dest / INT8_FILE), load_external_data=False)
    return {
        "out": str(dest),
        "mode": mode,
        "calibration_sets": len(sets),
        "variants": {"fp32": made.model_path.name, "int8": INT8_FILE},
        "fp32_bytes": made.size_bytes,
        "int8_bytes": (dest / INT8_FILE).stat().st_size,
        "int8_precision": graph_precision(proto),
        "quant_ops": quant_ops(proto),
    }


def _quantize(src: Path, dst: Path, mode: str, sets: list[dict[str, Any]]) -> None:
    try:
        from onnxruntime import quantization as q
    except ImportError as exc:  # pragma: no cover - onnxruntime is a dependency
        raise ModelError(f"onnxruntime.quantization cannot be imported: {exc}") from exc
    import logging

    quiet = _DropAdvice()
    logging.getLogger().addFilter(quiet)  # ORT logs "consider pre-processing" on the root logger every call
    try:
        if mode == "static":
            q.quantize_static(
                str(src),
                str(dst),
                _Calibration(sets),
                quant_format=q.QuantFormat.QDQ,
                per_channel=True,
                activation_type=q.QuantType.QUInt8,
                weight_type=q.QuantType.QInt8,
            )
        else:
            q.quantize_dynamic(str(src), str(dst), weight_type=q.QuantType.QInt8)
    except Exception as exc:  # noqa: BLE001 - onnxruntime.quantization raises many types
        first = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelError(f"{src.name}: {mode} quantization failed: {first}") from exc
    finally:
        logging.getLogger().removeFilter(quiet)
    if not dst.is_file():
        raise ModelError(f"{src.name}: {mode} quantization wrote no model")


class _DropAdvice:
    """Drops onnxruntime.quantization's pre-processing advice (its quant_pre_process breaks external data)."""

    def filter(self, record: object) -> bool:
        return "pre-processing" not in str(getattr(record, "msg", ""))


def _write_meta(root: Path, pkg: Any, fp32_file: str) -> None:
    import yaml

    meta = dict(pkg.meta)
    meta.setdefault("name", pkg.name)
    meta["variants"] = {"fp32": fp32_file, "int8": INT8_FILE}
    meta.pop("reference", None)
    (root / "model.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
