"""The accuracy reference when a package has no golden data, and whether each row's accuracy was checked.

First choice: `onnx.reference.ReferenceEvaluator` (pure numpy, no kernel shared with any runtime), bounded in
time and memory in its own worker. When it cannot run the graph, is too slow or too large, ONNX Runtime's CPU
fp32 outputs stand in: every other provider is still compared with a different implementation, but the
`cpu` row would compare ORT's CPU with itself, so its accuracy is "not checked". The target decides whether a
row whose accuracy was not checked may be selected (`serving.unchecked_accuracy: allow | refuse`).
"""

from __future__ import annotations

from typing import Any

INDEPENDENT = "onnx-reference-evaluator"
ORT_CPU = "onnxruntime-cpu-fp32"
MAX_S = 60.0  # the evaluator is pure numpy: far slower than a runtime on big graphs
MAX_BYTES = 2 * 2**30  # its worker's memory cap when the model has none of its own
RULES = ("allow", "refuse")


def independent_outputs(*, model_path: str, feeds: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Worker task: the graph's outputs from onnx's reference evaluator."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(model_path)
    values = ReferenceEvaluator(model).run(None, feeds)
    return dict(zip([o.name for o in model.graph.output], values)), INDEPENDENT


def ort_cpu_outputs(*, model_path: str, feeds: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Worker task: ONNX Runtime CPU fp32 outputs (a stand-in: not independent of the cpu row)."""
    from agent.providers import get

    sess = get("cpu").open_session(model_path)
    try:
        return sess.run(feeds), ORT_CPU
    finally:
        sess.close()


def compute(
    model_path: str, feeds: dict[str, Any], *, timeout: float, isolate: bool, memory_max: int | None
) -> tuple[Any, str, str]:
    """(outputs or None, description, error). The description says which reference, and why not the
    independent one when it fell back."""
    from agent.isolate.runner import run_isolated

    args = {"model_path": str(model_path), "feeds": feeds}
    values, why = independent(model_path, feeds, timeout=timeout, isolate=isolate, memory_max=memory_max)
    if values is not None:
        return values, INDEPENDENT, ""
    res = run_isolated(
        "agent.qualify.reference:ort_cpu_outputs",
        args,
        timeout=timeout,
        isolate=isolate,
        tag="reference",
        memory_max=memory_max,
    )
    if res.ok:
        return res.value[0], f"{ORT_CPU} ({why}: accuracy of the cpu row not checked)", ""
    return None, "none", f"no reference outputs: {why}; onnxruntime cpu: {res.error}"


def independent(
    model_path: Any, feeds: dict[str, Any], *, timeout: float, isolate: bool, memory_max: int | None
) -> tuple[dict[str, Any] | None, str]:
    """(outputs, "") from onnx's reference evaluator, bounded in its own worker, or (None, why not)."""
    from agent.isolate.runner import run_isolated

    limit = min(timeout, MAX_S)
    res = run_isolated(
        "agent.qualify.reference:independent_outputs",
        {"model_path": str(model_path), "feeds": feeds},
        timeout=limit,
        isolate=isolate,
        tag="reference",
        memory_max=min(memory_max or MAX_BYTES, MAX_BYTES),
    )
    return (res.value[0], "") if res.ok else (None, _why(res, limit))


def _why(res: Any, limit: float) -> str:
    if getattr(res, "kind", "") in ("timeout", "memory"):
        return f"reference too slow or too large ({res.error}; bounds {limit:.0f} s, {MAX_BYTES // 2**30} GiB)"
    return f"reference cannot run the graph ({' '.join(str(res.error).split())[:200]})"


def checked(provider: str, ref_desc: str) -> bool:
    """Was this row's accuracy checked by something that shares no kernels with it?"""
    return not (ref_desc.startswith(ORT_CPU) and provider == "cpu")


def mark(row: Any, ref_desc: str) -> None:
    """Sets row.accuracy_checked and, when not, says so in the row's reason."""
    row.accuracy_checked = checked(row.provider, ref_desc)
    if not row.accuracy_checked and row.status == "passed":
        row.reason = f"{row.reason}; accuracy not checked (reference is {ORT_CPU} itself)"


def rule_of(target: Any) -> str:
    return str((getattr(target, "serving", None) or {}).get("unchecked_accuracy", "allow"))


def apply_rule(rows: list[Any], target: Any) -> None:
    """A target that refuses unchecked accuracy fails those rows at stage accuracy, with the rule named."""
    if rule_of(target) != "refuse":
        return
    for row in rows:
        if row.status == "passed" and row.accuracy_checked is False:
            row.status, row.stage = "failed", "accuracy"
            what = "only against its own golden data" if getattr(row, "accuracy_basis", None) else "no golden data"
            row.reason = (
                f"accuracy not checked ({what} and no independent reference); target "
                f"{getattr(target, 'name', '?')} has serving.unchecked_accuracy: refuse"
            )
