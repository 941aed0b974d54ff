"""The close-call confirmation round's child task: the row's session again (kept by its worker, or reopened
the same way), warm-up and timed runs only (agent.qualify.rowrunner asks for it by name)."""

from __future__ import annotations

from typing import Any

from agent.errors import EdgeAgentError
from agent.isolate import forkserver
from agent.isolate.runner import child_progress as emit
from agent.package import cacheseal
from agent.qualify import conditions, keptsession, latency, points
from agent.qualify.rowspec import RowSpec
from agent.qualify.rowtask import fail


def confirm_latency(spec: RowSpec) -> dict[str, Any]:
    """Child task of a close call's confirmation round: the row's session (the one its kept worker still holds,
    else a new one with the same file, options, device and sealed cache), warm-up and timed runs only. Accuracy,
    coverage, memory, the latency at the max shape, session times and the original's speed-up were measured in
    the first round; only the samples are merged."""
    model_path, provider, options = spec.model_path, spec.provider, spec.options
    precision, device, cache_dir = spec.precision, spec.device, spec.cache_dir
    from agent.providers import get

    row: dict[str, Any] = {"provider": provider, "requested_precision": precision, "requested_device": device}
    sess = keptsession.take(spec.session_key)
    if sess is not None:
        forkserver.set_name(forkserver.WORKER_NAME)  # a kept worker at work again
    emit("session", provider=provider, precision=precision, kept=sess is not None)
    if sess is None:  # not a kept worker (or it was restarted): the row's session again
        cacheseal.verify_or_reset(cache_dir)  # a corrupt or foreign compiled cache is rebuilt, never loaded
        try:
            sess = get(provider).open_session(
                model_path, options=options, precision=precision, device=device, cache_dir=cache_dir
            )
        except EdgeAgentError as exc:
            return fail(row, "compatibility", f"session creation failed: {exc}")
    timed, budget_s = spec.timed, spec.budget_s
    said = {"provider": provider, "precision": sess.precision or precision}
    emit("latency", **said, inputs=points.shapes(timed), budget_s=budget_s)
    sampler = conditions.Sampler()
    try:
        lat = latency.measure(
            lambda: sess.run(timed), budget_s=budget_s, batch=spec.batch, progress=lambda e, **f: emit(e, **said, **f)
        )
    except EdgeAgentError as exc:
        return fail(row, "latency", f"inference at the latency shape failed: {exc}")
    finally:
        sess.close()
    row["conditions"] = sampler.stop()
    row.update(status="passed", latency_ms=lat, contended=conditions.contended(row["conditions"]))
    return row
