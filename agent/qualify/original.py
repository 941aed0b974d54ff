"""A quantized or fp16 model against its fp32 original (`model.yaml: reference: FILE`): task metrics on the
same inputs (top-1/top-5 agreement for classifiers, max_rel otherwise) and the speed-up on the same provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import EdgeAgentError
from agent.qualify import accuracy
from agent.targets.schema import Tolerance

MAX_SETS = 64  # golden sets used for agreement (each set is one more inference per provider)
MAX_SET_BYTES = 64 << 20  # and no more input bytes than this in all (they travel to every row's child)
SEEDED_SETS = 8  # without golden data: this many seeded input sets


def input_sets(pkg: Any, first: dict[str, Any]) -> list[dict[str, Any]]:
    """The inputs both models see: every golden set (up to MAX_SETS), else seeded sets (seed 0 first)."""
    from agent.package.inputs import load_dataset
    from agent.package.seeded import seeded_feeds

    if pkg.datasets:
        sets, total = [first], _nbytes(first)
        for ds in pkg.datasets[1:MAX_SETS]:
            feeds = load_dataset(ds, pkg.inputs, pkg.outputs)[0]
            total += _nbytes(feeds)
            if total > MAX_SET_BYTES:
                break
            sets.append(feeds)
        return sets
    extra = [
        seeded_feeds(
            pkg.inputs,
            dynamic_dims=pkg.dynamic_dims,
            input_shapes=pkg.input_shapes,
            values=dict(pkg.meta.get("input_values") or {}),
            seed=s,
        )
        for s in range(1, SEEDED_SETS)
    ]
    return [first, *extra]


def _nbytes(feeds: dict[str, Any]) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in feeds.values())


def original_outputs(*, model_path: str, sets: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Child task: the fp32 original's outputs on ORT CPU for every input set."""
    from agent.providers import get

    sess = get("cpu").open_session(model_path)
    try:
        return [sess.run(feeds) for feeds in sets], f"fp32 original {Path(model_path).name} on onnxruntime-cpu"
    finally:
        sess.close()


def _joined(outs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """One array per output over all sets: stacked along the batch axis (classifier rows add up)."""
    joined = {}
    for name in outs[0]:
        parts = [np.asarray(o[name]) for o in outs if name in o]
        try:
            joined[name] = np.concatenate(parts, axis=0) if parts[0].ndim else np.stack(parts)
        except ValueError:  # shapes differ between sets beyond the batch axis
            joined[name] = np.concatenate([p.astype(np.float64).ravel() for p in parts])
    return joined


def is_classifier(task: str | None) -> bool | None:
    """model.yaml `task`: classification -> True, another task -> False, none -> None (judge by shape)."""
    return None if not task else "classif" in task.lower()


def task_violations(metrics: dict[str, dict[str, Any]], tol: Tolerance, classifier: bool | None = None) -> list[str]:
    """Classifier outputs are judged by top-1 agreement with the original, others by max_rel and cosine.
    classifier None: every classifier-shaped output ([N, C] floats) counts as one."""
    reasons = []
    for name, m in metrics.items():
        if "top1_agreement" in m and classifier is not False:
            if tol.top1_agreement is not None and m["top1_agreement"] < tol.top1_agreement:
                reasons.append(
                    f"{name}: top1_agreement {m['top1_agreement']:.3f} < {tol.top1_agreement} "
                    f"over {m.get('top1_rows')} rows"
                )
            continue
        reasons.extend(accuracy.violations({name: m}, tol))
    return reasons


def compare(
    sess: Any,
    sets: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    tol: Tolerance,
    classifier: bool | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """(the row's accuracy record, problems): the model on this provider against the original, all sets."""
    got = [sess.run(feeds) for feeds in sets]
    metrics = accuracy.compare(_joined(reference), _joined(got))
    problems = task_violations(metrics, tol, classifier)
    record = {
        "outputs": metrics,
        "tolerance": tol.to_dict(),
        "against": "fp32 original",
        "sets": len(sets),
        **accuracy.summarize(metrics),
    }
    return record, problems


def speedup(
    open_original: Any, feeds: dict[str, Any], p50_ms: float | None, budget_s: float, batch: int
) -> dict[str, Any]:
    """The original's latency on the same provider and the speed-up (original p50 / this model's p50)."""
    from agent.qualify import latency

    try:
        sess = open_original()
    except EdgeAgentError as exc:
        return {"error": f"the original does not open on this provider: {exc}"}
    try:
        lat = latency.measure(lambda: sess.run(feeds), budget_s=budget_s, batch=batch)
    except EdgeAgentError as exc:
        return {"error": f"the original does not run on this provider: {exc}"}
    finally:
        sess.close()
    p50 = lat.get("p50")
    out: dict[str, Any] = {"p50_ms": p50, "p99_ms": lat.get("p99"), "runs": lat.get("runs")}
    if p50 and p50_ms:
        out["speedup"] = round(p50 / p50_ms, 3)
    return out
