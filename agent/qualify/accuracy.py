"""Accuracy metrics per output (max_abs, scale-robust max_rel, cosine, top-1/top-5) and tolerance checks.

max_rel is the largest absolute error divided by the output's scale, max(|reference|) (1.0 when the
reference is all zeros), so it stays meaningful when single values are near zero, unlike elementwise
relative error. sqnr_db is the signal-to-quantization-noise ratio, 10 log10(sum ref^2 / sum (ref - got)^2), in dB
(None when the outputs are identical: no noise). Classifier-shaped outputs ([N, C] floats, C >= 2) also get top-1 agreement (argmax equal,
fraction of rows) and top-5 agreement (mean overlap of the two top-5 sets).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.targets.schema import TOLERANCE_FIELDS, Tolerance


def as_tolerance(obj: Any) -> Tolerance:
    """Accept a Tolerance-like object (targets), a dict (model.yaml) or None (defaults)."""
    if obj is None:
        return Tolerance()
    if isinstance(obj, Tolerance):
        return obj
    if isinstance(obj, dict):
        return Tolerance(**{k: obj[k] for k in TOLERANCE_FIELDS if k in obj})
    return Tolerance(**{k: getattr(obj, k) for k in TOLERANCE_FIELDS if hasattr(obj, k)})


def override(base: Tolerance, patch: dict[str, Any] | None) -> Tolerance:
    """model.yaml values win field by field."""
    if not patch:
        return base
    values = base.to_dict()
    values.update({k: patch[k] for k in TOLERANCE_FIELDS if k in patch})
    return Tolerance(**values)


def output_metrics(ref: np.ndarray, got: np.ndarray, length_change: float | None = None) -> dict[str, Any]:
    """Metrics for one output. Shape or dtype-kind mismatches are reported, not raised. With `length_change`
    (the target's max_length_change), an output whose length differs from the reference along one dim by at
    most that fraction is compared on the overlapping part, and `length` says so."""
    ref, got = np.asarray(ref), np.asarray(got)
    m: dict[str, Any] = {"shape": list(ref.shape), "dtype": str(ref.dtype)}
    if ref.shape != got.shape:
        m["error"] = f"shape {list(got.shape)} != reference {list(ref.shape)}"
        axes = [a for a in range(ref.ndim) if ref.shape[a] != got.shape[a]] if ref.ndim == got.ndim else []
        if length_change is None or len(axes) != 1 or ref.shape[axes[0]] == 0:
            return m
        a = axes[0]
        n_ref, n_got = ref.shape[a], got.shape[a]
        change = abs(n_got - n_ref) / n_ref
        length = {
            "axis": a,
            "reference": n_ref,
            "got": n_got,
            "change": round(change, 6),
            "compared": min(n_ref, n_got),
        }
        if change > length_change:
            m["error"] += f" (length change {change:.1%} > max_length_change {length_change:.1%})"
            m["length"] = length
            return m
        cut = [slice(None)] * ref.ndim
        cut[a] = slice(0, length["compared"])
        return {**output_metrics(ref[tuple(cut)], got[tuple(cut)]), "shape": list(ref.shape), "length": length}
    if ref.dtype.kind in "OSU" or got.dtype.kind in "OSU":
        m["mismatches"] = int(np.sum(ref != got))
        return m
    r, g = ref.astype(np.float64), got.astype(np.float64)
    nan_r, nan_g = ~np.isfinite(r), ~np.isfinite(g)
    if not _same_nonfinite(r, g, nan_r, nan_g):
        m["error"] = f"non-finite values differ ({int(np.sum(nan_r != nan_g))} positions)"
        return m
    r, g = np.where(nan_r, 0.0, r), np.where(nan_g, 0.0, g)
    diff = np.abs(r - g)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r).max()) if r.size else 0.0
    m["max_abs"] = max_abs
    m["max_rel"] = max_abs / scale if scale > 0 else max_abs
    m["scale"] = scale
    m["mean_abs"] = float(diff.mean()) if diff.size else 0.0
    m["cosine"] = _cosine(r.ravel(), g.ravel())
    m["sqnr_db"] = sqnr_db(r, g)
    if ref.dtype.kind in "iub":
        m["mismatches"] = int(np.sum(ref != got))
    if ref.ndim == 2 and ref.shape[1] >= 2 and ref.dtype.kind == "f":
        m.update(_topk(r, g))
    return m


SQNR_FLOOR_DB = -300.0  # a reference of zeros with any noise (finite, so the record stays plain JSON)


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float | None:
    """10 log10(signal power / noise power) in dB; None when there is no noise (identical outputs)."""
    noise = float(np.sum((ref - got) ** 2))
    if noise == 0.0:
        return None
    signal = float(np.sum(ref**2))
    return round(max(SQNR_FLOOR_DB, 10.0 * float(np.log10(signal / noise))), 2) if signal > 0 else SQNR_FLOOR_DB


def _same_nonfinite(r: np.ndarray, g: np.ndarray, nan_r: np.ndarray, nan_g: np.ndarray) -> bool:
    if np.any(nan_r != nan_g):
        return False
    rv, gv = r[nan_r], g[nan_r]
    return bool(np.all((rv == gv) | (np.isnan(rv) & np.isnan(gv))))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Identical outputs score exactly 1; others are summed in float64. The dot product and the norms round
    differently per SIMD width (AVX-512 sums in another order than AVX2), so identical float32 outputs scored
    0.99999994 on one host and failed a bit-exact ``min_cosine: 1.0`` that passed on another."""
    if np.array_equal(a, b):  # identical outputs are cosine 1 exactly, whatever the rounding of the sums
        return 1.0
    a, b = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(min(1.0, max(-1.0, np.dot(a, b) / (na * nb))))


def _topk(r: np.ndarray, g: np.ndarray) -> dict[str, Any]:
    """Agreement over rows whose reference has a clear winner (rows with a tie at the top are ambiguous)."""
    top2 = np.sort(r, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-6 * max(float(np.abs(r).max()), 1e-30)
    out: dict[str, Any] = {"top1_rows": int(clear.sum())}
    if not clear.any():
        return out
    r, g = r[clear], g[clear]
    out["top1_agreement"] = float(np.mean(np.argmax(r, axis=1) == np.argmax(g, axis=1)))
    if r.shape[1] >= 5:
        tr, tg = np.argsort(-r, axis=1)[:, :5], np.argsort(-g, axis=1)[:, :5]
        out["top5_agreement"] = float(np.mean([len(set(a) & set(b)) / 5.0 for a, b in zip(tr, tg)]))
    return out


def compare(
    reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray], length_change: float | None = None
) -> dict[str, dict[str, Any]]:
    """Metrics for every reference output; a missing output is an error entry."""
    result = {}
    for name, ref in reference.items():
        if name not in outputs:
            result[name] = {"error": "output missing from the provider's results"}
        else:
            result[name] = output_metrics(ref, outputs[name], length_change)
    return result


def length_note(metrics: dict[str, dict[str, Any]]) -> str:
    """How a row says an output was compared on its overlap: 'audio: length 87600 vs 90000 (-2.7%), compared on
    the first 87600' (empty when every length matched)."""
    notes = []
    for name, m in metrics.items():
        n = m.get("length")
        if n and "error" not in m:
            sign = (n["got"] - n["reference"]) / n["reference"]
            notes.append(
                f"{name}: length {n['got']} vs {n['reference']} ({sign:+.1%}), compared on the first {n['compared']}"
            )
    return "; ".join(notes)


def violations(metrics: dict[str, dict[str, Any]], tol: Tolerance) -> list[str]:
    """Human-readable reasons an output is out of tolerance (empty list = pass).

    A float output passes when max |got - ref| <= max_abs + max_rel * scale (scale = max |ref|; the targets'
    definition), cosine >= min_cosine and top-1 agreement >= top1_agreement; integer, bool and string outputs
    must match exactly.
    """
    reasons = []
    for name, m in metrics.items():
        if "error" in m:
            reasons.append(f"{name}: {m['error']}")
            continue
        if m.get("mismatches"):
            reasons.append(f"{name}: {m['mismatches']} exact-match mismatches")
            continue
        if "max_abs" not in m or m.get("mismatches") == 0:
            continue
        reasons.extend(f"{name}: {r}" for r in _float_violations(m, tol))
    return reasons


def _float_violations(m: dict[str, Any], tol: Tolerance) -> list[str]:
    out = []
    if tol.max_abs is not None or tol.max_rel is not None:
        bound = (tol.max_abs or 0.0) + (tol.max_rel or 0.0) * m.get("scale", 0.0)
        if m["max_abs"] > bound:
            out.append(
                f"max_rel {_g(m['max_rel'])} > {_g(tol.max_rel or 0.0)} "
                f"(max error {_g(m['max_abs'])}, allowed {_g(bound)})"
            )
    if tol.min_cosine is not None and m["cosine"] < tol.min_cosine:
        out.append(f"cosine {m['cosine']:.6f} < {tol.min_cosine}")
    sq = m.get("sqnr_db")
    if tol.min_sqnr_db is not None and sq is not None and sq < tol.min_sqnr_db:
        out.append(f"sqnr {sq:.1f} dB < {tol.min_sqnr_db} dB")
    if tol.top1_agreement is not None and m.get("top1_agreement", 1.0) < tol.top1_agreement:
        out.append(f"top1_agreement {m['top1_agreement']:.3f} < {tol.top1_agreement}")
    return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def summarize(metrics: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Worst case over outputs: the headline numbers of a row."""
    vals = [m for m in metrics.values() if "max_abs" in m]
    summary: dict[str, Any] = {}
    if vals:
        summary["max_abs"] = max(m["max_abs"] for m in vals)
        summary["max_rel"] = max(m["max_rel"] for m in vals)
        summary["cosine"] = min(m["cosine"] for m in vals)
        noisy = [m["sqnr_db"] for m in vals if m.get("sqnr_db") is not None]
        summary["sqnr_db"] = min(noisy) if noisy else None  # None: every output identical to the reference
    for key in ("top1_agreement", "top5_agreement"):
        ks = [m[key] for m in vals if key in m]
        if ks:
            summary[key] = min(ks)
    return summary


_PRECISION_KEYS = (None, "f32", "bf16", "f16", "fp16", "int8")


def tolerances_for(target: Any, pkg: Any, provider: str) -> dict[str | None, dict[str, Any]]:
    """Tolerance per possible runtime precision: the target's, then its `tasks:` bounds for the package's task
    (model.yaml `task`), then model.yaml's own."""
    from agent.targets import normalize_precision, task_of

    getter = getattr(target, "tolerances", None) or getattr(target, "tolerance", None)
    by_task = (getattr(target, "tasks", None) or {}).get(task_of(pkg.task) or "") or {}
    out = {}
    for p in _PRECISION_KEYS:
        base = override(as_tolerance(getter(provider, p) if getter else None), by_task.get(normalize_precision(p)))
        out[p] = override(base, pkg.tolerance_override(provider, p)).to_dict()
    return out
