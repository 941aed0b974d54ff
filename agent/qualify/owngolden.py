"""A row compared with golden data made by itself (issue 36): a package made by `edge-agent package` carries
golden outputs computed by onnxruntime's CPU provider (agent.package.golden says which runtime and provider made
them), so the cpu row's accuracy against them is that runtime compared with itself (max_rel 0). Such a row says
"accuracy vs own golden (not independent)" (`accuracy_basis`), and is also compared with onnx's reference
evaluator where it can run (agent.qualify.reference, as rows without golden data are): its figures land in
`accuracy.independent`. Within the row's tolerance, the accuracy is checked. Where the evaluator disagrees, or
cannot run, the row's accuracy is not checked (`accuracy_checked: false`, the reason says which) and the
target's serving.unchecked_accuracy decides, as for a cpu row compared with ONNX Runtime's own outputs: the
golden data being the runtime itself, a disagreement cannot say which of the two is wrong (onnx's evaluator
computes the first BatchNormalization of PP-OCR's v2.0 classifier 0.74 off the inference formula, which ONNX
Runtime matches within 1e-6), so it never fails the row by itself."""

from __future__ import annotations

from typing import Any

from agent.qualify import accuracy

OWN = "own golden (not independent)"
WORDS = f"accuracy vs {OWN}"
EVALUATOR = "onnx-reference-evaluator"


def engine(provider: str) -> tuple[str, str]:
    """(runtime, provider as that runtime names it) of one of our providers: ("onnxruntime",
    "CPUExecutionProvider") for cpu, ("openvino", "openvino") for native OpenVINO."""
    from agent.providers import get

    try:
        prov = get(provider)
    except KeyError:
        return "", provider
    return str(getattr(prov, "runtime", "") or ""), str(getattr(prov, "ep_name", "") or provider)


def own(made_by: dict[str, str], provider: str) -> bool:
    """Did this provider (same runtime and provider) make the golden outputs it is compared with?"""
    runtime, ep = engine(provider)
    said_runtime, said = made_by.get("runtime", "").lower(), made_by.get("provider", "").lower()
    return bool(runtime) and said_runtime == runtime.lower() and said in (ep.lower(), provider.lower())


def check(row: dict[str, Any], independent: dict[str, Any], outputs: dict[str, Any], tol: Any) -> None:
    """In the row's child: the outputs against onnx's reference evaluator as well (the row's tolerance); its
    figures under row["accuracy"]["independent"], with `disagrees` (the tolerance's words) when outside it."""
    metrics = accuracy.compare(independent, outputs, tol.max_length_change)
    ind = {"reference": EVALUATOR, **accuracy.summarize(metrics), "outputs": metrics}
    ind["disagrees"] = accuracy.violations(metrics, tol)
    row["accuracy"]["independent"] = ind


def mark(row: Any, evaluator_error: str) -> None:
    """In the parent, for a row compared with its own golden data: `accuracy_basis`, `accuracy_checked` (by the
    evaluator, or not at all) and the words in its reason (nothing for a row that never got to accuracy)."""
    if not row.accuracy:
        return
    row.accuracy_basis = OWN
    ind = (row.accuracy or {}).get("independent") if isinstance(row.accuracy, dict) else None
    if isinstance(ind, dict) and not ind.get("disagrees"):
        rel = ind.get("max_rel")
        said = f"; {WORDS}; vs {EVALUATOR} max_rel {rel:.2g}" if isinstance(rel, float) else f"; {WORDS}"
    elif isinstance(ind, dict):
        row.accuracy_checked = False
        said = f"; {WORDS}, not confirmed: {EVALUATOR} disagrees ({'; '.join(ind['disagrees'][:3])})"
    else:
        row.accuracy_checked = False
        said = f"; {WORDS}, accuracy not checked otherwise ({evaluator_error or 'the evaluator did not run'})"
    if row.status == "passed" or row.stage == "accuracy":
        row.reason = f"{row.reason}{said}"


class Evaluator:
    """One qualification's side of it: which golden data is in use (and who made it), and the evaluator's
    outputs for the current variant, computed once, only when a row needs them."""

    def __init__(self, made_by: dict[str, str]):
        self.made_by = made_by
        self.golden: Any = None  # the golden outputs the rows are compared with (None: another reference)
        self._done, self.error = False, ""
        self.values: dict[str, Any] | None = None

    def use(self, reference: Any, golden: Any, desc: str) -> str:
        """A new variant's reference: golden data or not; returns its description, naming who made the golden."""
        from agent.package.golden import describe

        self.golden = reference if golden is not None and reference is golden else None
        self._done, self.values, self.error = False, None, ""
        return f"{desc} (made by {describe(self.made_by)})" if self.golden is not None else desc

    def applies(self, provider: str) -> bool:
        return self.golden is not None and own(self.made_by, provider)

    def outputs(self, provider: str, run: Any) -> dict[str, Any] | None:
        """The evaluator's outputs when this row's reference is golden data its provider made (else None)."""
        if not self.applies(provider):
            return None
        if not self._done:
            from agent.qualify import reference

            self._done = True
            self.values, self.error = reference.independent(
                run.variant.model_path, run.feeds, timeout=run.timeout, isolate=run.isolate, memory_max=run.memory_max
            )
        return self.values

    def mark(self, row: Any) -> None:
        if self.applies(row.provider):
            mark(row, self.error)
