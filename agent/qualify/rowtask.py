"""The work done inside the child for one (provider, precision) row: compatibility, accuracy, latency."""

from __future__ import annotations

import re
import resource
import sys
from typing import Any

from agent.errors import EdgeAgentError
from agent.qualify import accuracy, latency
from agent.qualify.isolate import child_progress as emit


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def measure_row(
    *,
    model_path: str,
    provider: str,
    options: dict[str, Any],
    precision: str | None,
    device: str | None,
    cache_dir: str | None,
    feeds: dict[str, Any],
    reference: dict[str, Any],
    tolerances: dict[str | None, dict[str, Any]],
    budget_s: float,
    batch: int = 1,
    model_precision: str | None = None,
    declared: dict[str, Any] | None = None,
    original: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Returns the Row fields as a dict; expected failures are statuses, not exceptions.

    model_precision: the graph's own precision (agent.qualify.precision); declared: the graph's inputs and
    outputs, which the session must match; original: {path, sets, outputs} of an fp32 original to compare
    with (agent.qualify.original) instead of `reference`."""
    from agent.providers import get
    from agent.qualify import original as orig
    from agent.qualify import outputs as io
    from agent.qualify.precision import effective

    row: dict[str, Any] = {
        "provider": provider,
        "requested_precision": precision,
        "requested_device": device,
        "options": options,
        "cache_dir": cache_dir,
    }
    rss0 = _rss_mb()
    emit("session", provider=provider, precision=precision)
    try:
        sess = get(provider).open_session(
            model_path, options=options, precision=precision, device=device, cache_dir=cache_dir
        )
    except EdgeAgentError as exc:
        row["unsupported_ops"] = unsupported_ops(str(exc))
        return _fail(row, "compatibility", f"session creation failed: {exc}")
    row.update(precision=effective(model_precision, sess.precision or precision), device=sess.device)
    row.update(compile_s=sess.compile_s, model_precision=model_precision)
    _record_assignment(row, sess)
    mismatch = io.contract_problems(declared or {}, sess)
    if mismatch:
        sess.close()
        return _fail(row, "compatibility", f"datatypes disagree with the model: {'; '.join(mismatch)}")
    try:
        outputs = sess.run(feeds)
    except EdgeAgentError as exc:
        return _fail(row, "compatibility", f"inference failed: {exc}")
    mismatch = io.result_problems(declared or {}, outputs)
    if mismatch:
        sess.close()
        return _fail(row, "compatibility", f"datatypes disagree with the model: {'; '.join(mismatch)}")
    tol = accuracy.as_tolerance(tolerances.get(row["precision"], tolerances.get(None)))
    try:
        if original:
            row["accuracy"], problems = orig.compare(
                sess, original["sets"], original["outputs"], tol, original.get("classifier")
            )
        else:
            metrics = accuracy.compare(reference, outputs)
            problems = accuracy.violations(metrics, tol)
            row["accuracy"] = {"outputs": metrics, "tolerance": tol.to_dict(), **accuracy.summarize(metrics)}
    except EdgeAgentError as exc:
        return _fail(row, "compatibility", f"inference failed: {exc}")
    emit("latency", provider=provider, precision=row["precision"])
    lat = latency.measure(lambda: sess.run(feeds), budget_s=budget_s if not problems else budget_s / 4, batch=batch)
    row["latency_ms"] = lat
    row["throughput_ips"] = lat.get("throughput_ips")
    row["rss_growth_mb"] = round(max(_peak_rss_mb(), _rss_mb()) - rss0, 1)
    sess.close()
    if original and not problems:
        emit("original", provider=provider, precision=row["precision"])
        reopen = lambda: get(provider).open_session(  # noqa: E731
            original["path"], options=options, precision=precision, device=device
        )
        row["original"] = {
            "file": original["file"],
            **orig.speedup(reopen, original.get("feeds", feeds), lat.get("p50"), budget_s / 2, batch),
        }
    if problems:
        return _fail(
            row,
            "accuracy",
            f"accuracy: {'; '.join(problems)} on {provider}"
            + (f" ({row['precision']})" if row.get("precision") else ""),
        )
    row.update(status="passed", reason=_passed_reason(row))
    return row


def unsupported_ops(message: str) -> list[str]:
    """Op names a provider's error names: 'unsupported operator(s) A, B:' (openvino) or ORT's
    'Could not find an implementation for Op(ver) node'."""
    ops = []
    m = re.search(r"unsupported operator\(s\) ([^:]+):", message)
    if m:
        ops += [o.strip() for o in m.group(1).split(",") if o.strip()]
    ops += re.findall(r"Could not find an implementation for (\w+)\(\d+\)", message)
    return list(dict.fromkeys(ops))


def _record_assignment(row: dict[str, Any], sess) -> None:
    try:
        a = sess.assignment()
    except Exception as exc:  # noqa: BLE001 - assignment is evidence, not a gate
        row["assignment"] = {"error": f"{type(exc).__name__}: {exc}"}
        return
    row["assignment"] = a.to_dict()
    row["coverage"] = a.coverage
    if hasattr(sess, "runtime_precisions"):
        try:
            row["assignment"]["runtime_precisions"] = sess.runtime_precisions()
        except Exception:  # noqa: BLE001
            pass


def _fail(row: dict[str, Any], stage: str, reason: str) -> dict[str, Any]:
    row.update(status="failed", stage=stage, reason=reason)
    return row


def _passed_reason(row: dict[str, Any]) -> str:
    acc = row.get("accuracy", {})
    lat = row.get("latency_ms", {})
    cov = row.get("coverage")
    parts = [f"coverage {cov:.0%}" if cov is not None else "coverage unknown"]
    if "max_rel" in acc:
        parts.append(f"max_rel {acc['max_rel']:.2g}")
    if lat.get("p50") is not None:
        parts.append(f"p50 {lat['p50']:.3g} ms over {lat['runs']} runs")
    return ", ".join(parts)


def reference_outputs(*, model_path: str, feeds: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """ORT CPU fp32 outputs (the reference when a package has no golden data); onnx's evaluator as fallback."""
    from agent.providers import get

    try:
        sess = get("cpu").open_session(model_path)
        try:
            return sess.run(feeds), "onnxruntime-cpu-fp32"
        finally:
            sess.close()
    except EdgeAgentError as exc:
        first_error = str(exc)
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(model_path)
    try:
        values = ReferenceEvaluator(model).run(None, feeds)
    except Exception as exc:  # noqa: BLE001
        raise EdgeAgentError(f"no reference: ORT CPU failed ({first_error}); onnx reference failed ({exc})") from exc
    return dict(zip([o.name for o in model.graph.output], values)), "onnx-reference-evaluator"
