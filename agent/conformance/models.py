"""The models suite: onnx's light_* architectures, agent.samples models and user packages, qualified."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import ModelError

_STATUS = {"passed": "passed", "failed": "failed", "error": "errored", "unavailable": "skipped"}
MODEL_BUDGET_S = 90.0  # wall time per model, all its rows together; rows that would start later are skipped


def light_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_packages(workdir: Path, names: list[str] | None = None) -> list[Path]:
    """Model-zoo packages for onnx's light_* models: inputs as onnx's runner makes them (arange / n),
    expected outputs from the shipped light_*_output_0.pb."""
    import onnx
    from onnx import numpy_helper

    out = []
    for src in sorted(light_dir().glob("light_*.onnx")):
        name = src.stem
        if names and name not in names:
            continue
        pkg = workdir / name
        ds = pkg / "test_data_set_0"
        ds.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, pkg / "model.onnx")
        model = onnx.load(str(src), load_external_data=False)
        inits = {i.name for i in model.graph.initializer}
        real = [i for i in model.graph.input if i.name not in inits]
        for k, vi in enumerate(real):
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            value = (np.arange(n).reshape(shape) / n).astype(np.float32)
            (ds / f"input_{k}.pb").write_bytes(numpy_helper.from_array(value, vi.name).SerializeToString())
        for k in range(len(model.graph.output)):
            golden = src.with_name(f"{name}_output_{k}.pb")
            if golden.exists():
                shutil.copyfile(golden, ds / f"output_{k}.pb")
        (pkg / "model.yaml").write_text(f"name: {name}\nversion: '1'\ntask: classification\n")
        out.append(pkg)
    return out


def sample_packages(workdir: Path) -> list[Path]:
    from agent import samples

    return [samples.sample_cnn_package(workdir / "sample-cnn"), samples.sample_ml_package(workdir / "sample-ml")]


def user_packages(directory: Path) -> list[Path]:
    """Every package in a user directory: sub-directories with a model.onnx, .tar.gz files, bare .onnx files."""
    if not directory.is_dir():
        raise ModelError(f"models directory not found: {directory}")
    found = []
    for p in sorted(directory.iterdir()):
        if (p.is_dir() and any(p.glob("*.onnx"))) or p.name.endswith((".tar.gz", ".tgz")) or p.suffix == ".onnx":
            found.append(p)
    return found


def run_models(
    packages: list[Path],
    profile: Any,
    target: Any,
    providers: list[str] | None,
    *,
    budget_s: float = 2.0,
    model_budget_s: float = MODEL_BUDGET_S,
    progress: Callable[..., None] | None = None,
    cache_dir: Path | None = None,
    workdir: Path | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(cases, model records) for the report: one case per (model, provider row).

    One model at a time: its archive is extracted, qualified within model_budget_s (rows in flight are cut
    there, later rows are skipped with the reason), then its extraction is removed. With a cache_dir the
    reference outputs and compiled blobs of a model are reused by the next run."""
    from agent.package.load import load_package
    from agent.qualify.harness import qualify
    from agent.qualify.options import QualifyOptions

    options = QualifyOptions(
        cache_dir=cache_dir, latency_budget_s=budget_s, all_precisions=True, deadline_s=model_budget_s
    )
    cases, records = [], []
    t0 = time.monotonic()
    for i, path in enumerate(packages):
        if progress is not None:
            elapsed = time.monotonic() - t0
            eta = elapsed / i * (len(packages) - i) if i else None
            progress("model", index=i + 1, total=len(packages), model=path.name, elapsed_s=elapsed, eta_s=eta)
        extract = (workdir / f"{i}") if workdir else None
        try:
            pkg = load_package(path, extract_to=extract)
            decision = qualify(pkg, profile, target, providers, options=options, progress=progress)
        except ModelError as exc:
            cases.append(
                {
                    "suite": "models",
                    "case": path.name,
                    "op": None,
                    "provider": "-",
                    "status": "errored",
                    "reason": str(exc),
                    "precision": None,
                }
            )
            continue
        finally:
            if extract is not None:
                shutil.rmtree(extract, ignore_errors=True)
        doc = decision.to_dict()
        records.append(_record(path.name, doc))
        cases.extend(_cases(path.name, doc))
    return cases, records


def _cases(model: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in doc["results"]:
        out.append(
            {
                "suite": "models",
                "case": model,
                "op": None,
                "provider": r["key"],
                "precision": r.get("precision"),
                "status": "skipped" if r.get("stage") == "budget" else _STATUS.get(r["status"], "errored"),
                "reason": r.get("reason", ""),
                "time_s": r.get("wall_s") or 0.0,
            }
        )
    return out


def _record(model: str, doc: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for r in doc["results"]:
        lat, acc = r.get("latency_ms") or {}, r.get("accuracy") or {}
        rows.append(
            {
                "provider": r["key"],
                "precision": r.get("precision"),
                "status": r["status"],
                "p50": lat.get("p50"),
                "p90": lat.get("p90"),
                "p99": lat.get("p99"),
                "runs": lat.get("runs"),
                "max_rel": acc.get("max_rel"),
                "cosine": acc.get("cosine"),
                "tolerance_max_rel": (acc.get("tolerance") or {}).get("max_rel"),
                "coverage": r.get("coverage"),
            }
        )
    return {
        "model": model,
        "sha256": doc["model"]["sha256"],
        "selected": doc.get("selected_key"),
        "reason": doc.get("reason"),
        "rows": rows,
    }
