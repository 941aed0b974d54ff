"""The ONNX backend node suite: the test cases the installed onnx package generates, on one provider variant.

Cases come from onnx.backend.test.loader.load_model_tests(kind="node") (generated in-process, nothing read
from disk) and are judged with onnx's own Runner.assert_similar_outputs and per-case rtol/atol (default
rtol=1e-3, atol=1e-7). Every case runs in an isolated worker; a crash or hang errors that case, a fresh
worker continues with the next one.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agent.qualify.isolate import IsolatedWorker

CASE_TIMEOUT_S = 60.0


@dataclass
class NodeCase:
    name: str
    op: str
    model: Any  # ModelProto
    inputs: list[Any]
    outputs: list[Any]
    rtol: float
    atol: float

    def task(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model_bytes": self.model.SerializeToString(),
            "inputs": self.inputs,
            "outputs": self.outputs,
            "input_names": [i.name for i in self.model.graph.input],
            "output_names": [o.name for o in self.model.graph.output],
            "rtol": self.rtol,
            "atol": self.atol,
        }


def load_cases(patterns: Iterable[str] | None = None) -> list[NodeCase]:
    """All node cases (sorted by name), optionally filtered by shell-style name patterns."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = load_model_tests(kind="node")
    pats = list(patterns or [])
    picked = [c for c in raw if not pats or any(fnmatch.fnmatchcase(c.name, p) for p in pats)]
    base_ops = {c.name: c.model.graph.node[0].op_type for c in raw if c.model is not None and c.model.graph.node}
    return [_case(c, base_ops) for c in sorted(picked, key=lambda c: c.name)]


def _case(c: Any, base_ops: dict[str, str]) -> NodeCase:
    inputs, outputs = c.data_sets[0]
    return NodeCase(
        name=c.name,
        op=op_of(c.name, c.model, base_ops),
        model=c.model,
        inputs=[_norm(x) for x in inputs],
        outputs=[_norm(x) for x in outputs],
        rtol=float(c.rtol),
        atol=float(c.atol),
    )


def op_of(name: str, model: Any, base_ops: dict[str, str]) -> str:
    """The operator a case tests; an *_expanded case (function body) belongs to its base case's op."""
    base = re.sub(r"_expanded.*$", "", name)
    if base != name:
        for cand in (base, *(base.rsplit("_", k)[0] for k in range(1, 4))):
            if cand in base_ops:
                return base_ops[cand]
    nodes = model.graph.node
    return nodes[0].op_type if nodes else "?"


def _norm(x: Any) -> Any:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x


@dataclass
class CaseResult:
    case: str
    op: str
    provider: str  # variant key: "openvino" or "openvino:f32"
    status: str  # passed | failed | errored | skipped
    reason: str
    precision: str | None = None
    time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": "onnx-node",
            "case": self.case,
            "op": self.op,
            "provider": self.provider,
            "precision": self.precision,
            "status": self.status,
            "reason": self.reason,
            "time_s": round(self.time_s, 4),
        }


def run_variant(
    cases: list[NodeCase],
    provider: str,
    precision: str | None,
    options: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    timeout: float = CASE_TIMEOUT_S,
    progress: Callable[..., None] | None = None,
    worker: IsolatedWorker | None = None,
) -> list[CaseResult]:
    """Run every case on one (provider, precision); never raises for a case."""
    key = key or (f"{provider}:{precision}" if precision else provider)
    own = worker is None
    worker = worker or IsolatedWorker()
    results = []
    try:
        for i, case in enumerate(cases):
            results.append(run_one(worker, case, provider, precision, options or {}, key, timeout))
            if progress is not None:
                progress("case", provider=key, index=i + 1, total=len(cases), case=case.name, status=results[-1].status)
    finally:
        if own:
            worker.close()
    return results


def run_one(
    worker: IsolatedWorker,
    case: NodeCase,
    provider: str,
    precision: str | None,
    options: dict[str, Any],
    key: str,
    timeout: float = CASE_TIMEOUT_S,
) -> CaseResult:
    t0 = time.monotonic()
    kwargs = {"provider": provider, "precision": precision, "options": options, **case.task()}
    res = worker.call("agent.conformance.nodetask:run_case", kwargs, timeout=timeout, tag=f"{key}/{case.name}")
    if res.ok:
        status, reason, prec = res.value
    else:
        status, reason, prec = "errored", res.error, None
    return CaseResult(case.name, case.op, key, status, reason, prec, time.monotonic() - t0)
