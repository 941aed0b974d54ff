"""Child-side work for one ONNX node test case on one provider (runs inside agent.isolate.worker)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from agent.errors import EdgeAgentError

_TMP: list[str] = []
_SESSIONS_DIR = "edge-agent-node-"


def _tmpdir() -> str:
    if not _TMP:
        _TMP.append(tempfile.mkdtemp(prefix=_SESSIONS_DIR))
    return _TMP[0]


def run_case(
    *,
    provider: str,
    precision: str | None,
    options: dict[str, Any],
    name: str,
    model_bytes: bytes,
    inputs: list[Any],
    outputs: list[Any],
    input_names: list[str],
    output_names: list[str],
    rtol: float,
    atol: float,
) -> tuple[str, str, str | None]:
    """(status, reason, runtime precision): passed | failed (outputs differ) | errored (could not run)."""
    from agent.providers import get

    path = os.path.join(_tmpdir(), f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(model_bytes)
    try:
        sess = get(provider).open_session(path, options=options, precision=precision)
    except EdgeAgentError as exc:
        return "errored", f"session: {exc}", None
    finally:
        os.unlink(path)
    try:
        feeds = declared_feeds(sess, {n: v for n, v in zip(input_names, inputs) if v is not None})
        got = sess.run(feeds, output_names)
    except EdgeAgentError as exc:
        return "errored", f"run: {exc}", sess.precision
    finally:
        sess.close()
    return (*compare([got[n] for n in output_names], outputs, rtol, atol), sess.precision)


def declared_feeds(sess: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """Drop feeds for graph inputs the compiled model no longer has (OpenVINO folds CastLike's `like` and an
    empty `axes` away: they cannot change the outputs), but only when every input it does declare is fed,
    so a genuine name mismatch still errors the case."""
    declared = {s.name for s in getattr(sess, "inputs", None) or []}
    if not declared or not declared <= set(feeds):
        return feeds
    return {k: v for k, v in feeds.items() if k in declared}


def compare(outputs: list[Any], expected: list[Any], rtol: float, atol: float) -> tuple[str, str]:
    """onnx's own check (Runner.assert_similar_outputs), so tolerances mean exactly what onnx means."""
    from onnx.backend.test.runner import Runner

    try:
        Runner.assert_similar_outputs(expected, outputs, rtol=rtol, atol=atol)
    except AssertionError as exc:
        return "failed", "mismatch: " + _summary(str(exc))
    except (TypeError, ValueError) as exc:
        return "failed", f"mismatch: {type(exc).__name__}: {_summary(str(exc))}"
    return "passed", ""


def _summary(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [
        ln
        for ln in lines
        if ln.startswith(("Mismatched", "Max absolute", "Max relative", "Output", "(shapes", "x and y"))
    ]
    return "; ".join(keep or lines[:2])[:300]
