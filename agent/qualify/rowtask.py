"""The work done inside the child for one (provider, precision) row: compatibility, accuracy, latency."""

from __future__ import annotations

import re
import resource
import sys
import time
from typing import Any

from agent.errors import EdgeAgentError, without_source_locations
from agent.isolate import forkserver
from agent.isolate.runner import child_progress as emit
from agent.isolate.runner import size_text
from agent.package import cacheseal
from agent.qualify import accuracy, coldstart, conditions, keptsession, latency, owngolden, points

# what the runtimes say when an allocation is refused (under RLIMIT_DATA): a memory failure, not an op problem
_ALLOC_FAILED = ("failed to allocate", "bad_alloc", "out of memory", "cannot allocate memory", "memoryerror")


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


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
    latency_feeds: dict[str, Any] | None = None,
    max_feeds: dict[str, Any] | None = None,
    min_feeds: dict[str, Any] | None = None,
    memory_max: int | None = None,
    model_precision: str | None = None,
    declared: dict[str, Any] | None = None,
    original: dict[str, Any] | None = None,
    keep: bool = False,
    sources: dict[str, str] | None = None,
    row_timeout_s: float | None = None,
    independent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Returns the Row fields as a dict; expected failures are statuses, not exceptions. Accuracy on `feeds`,
    latency on `latency_feeds` (the declared opt shape; default `feeds`) and on `max_feeds` when declared.
    memory_peak_bytes: the peak RSS growth of the session (create, warm-up, timed runs).

    model_precision: the graph's own precision (agent.package.precision); declared: the graph's inputs and
    outputs, which the session must match; original: {path, sets, outputs} of an fp32 original to compare
    with (agent.qualify.original) instead of `reference`. sources: where each point's inputs come from (golden,
    opt, max: agent.package.inputs.InputPlan.sources); row_timeout_s: the parent's deadline for this call, which
    a run at max must fit (agent.qualify.points); independent: onnx's reference evaluator's outputs, compared as
    well when `reference` is golden data this provider made itself (agent.qualify.owngolden). Before the max
    point the row so far goes to the parent as a `row_partial` event, the row it keeps if the max point outlasts
    the deadline."""
    from agent.package.precision import effective
    from agent.providers import get
    from agent.qualify import original as orig
    from agent.qualify import outputs as io

    row: dict[str, Any] = {
        "provider": provider,
        "requested_precision": precision,
        "requested_device": device,
        "options": options,
        "cache_dir": cache_dir,
    }
    rss0, deadline = _rss(), (time.monotonic() + row_timeout_s) if row_timeout_s else None
    emit("session", provider=provider, precision=precision)
    cache_note = cacheseal.verify_or_reset(cache_dir)  # a corrupt or foreign compiled cache is rebuilt, never loaded

    def opener(d: str | None) -> Any:
        return get(provider).open_session(model_path, options=options, precision=precision, device=device, cache_dir=d)

    first_cold = coldstart.cache_empty(cache_dir)
    try:
        sess = opener(cache_dir)
    except EdgeAgentError as exc:
        row["unsupported_ops"] = unsupported_ops(str(exc))
        if getattr(exc, "assignment", None) is not None:  # measured on the part the runtime converts
            row["assignment"], row["coverage"] = exc.assignment.to_dict(), exc.assignment.coverage  # type: ignore[attr-defined]
        return _fail_run(row, rss0, memory_max, "session creation failed", exc)
    cacheseal.seal(cache_dir)
    opened = max(0, _rss() - rss0)  # the session as built: what a bigger input does not scale
    row.update(precision=effective(model_precision, sess.precision or precision), device=sess.device)
    row.update(compile_s=sess.compile_s, model_precision=model_precision)
    _record_assignment(row, sess)
    mismatch = io.contract_problems(declared or {}, sess)
    if mismatch:
        sess.close()
        return fail(row, "compatibility", f"datatypes disagree with the model: {'; '.join(mismatch)}")
    try:
        outputs = sess.run(feeds)
    except EdgeAgentError as exc:
        return _fail_run(row, rss0, memory_max, "inference failed", exc)
    mismatch = io.result_problems(declared or {}, outputs)
    if mismatch:
        sess.close()
        return fail(row, "compatibility", f"datatypes disagree with the model: {'; '.join(mismatch)}")
    tol = accuracy.as_tolerance(tolerances.get(row["precision"], tolerances.get(None)))
    try:
        if original:
            row["accuracy"], problems = orig.compare(
                sess, original["sets"], original["outputs"], tol, original.get("classifier")
            )
        else:
            metrics = accuracy.compare(reference, outputs, tol.max_length_change)
            problems = accuracy.violations(metrics, tol)
            row["accuracy"] = {"outputs": metrics, "tolerance": tol.to_dict(), **accuracy.summarize(metrics)}
            if independent is not None:  # golden data this provider made: the evaluator confirms it or not
                owngolden.check(row, independent, outputs, tol)
            if accuracy.length_note(metrics):
                row["accuracy"]["length_note"] = accuracy.length_note(metrics)
    except EdgeAgentError as exc:
        sess.close()
        return _fail_run(row, rss0, memory_max, "inference failed", exc)
    timed = latency_feeds if latency_feeds is not None else feeds
    said = {"provider": provider, "precision": row["precision"]}
    emit("latency", **said, inputs=points.shapes(timed), budget_s=budget_s)
    sampler = conditions.Sampler()
    src = sources or {}
    try:
        lat = latency.measure(
            lambda: sess.run(timed),
            budget_s=budget_s if not problems else budget_s / 4,
            batch=batch,
            progress=lambda event, **f: emit(event, **said, **f),
        )
        row["latency_points"] = [
            points.entry("opt" if timed is not feeds else "golden+opt", timed, lat, src.get("opt"))
        ]
        measured = [(timed, float(lat["p50"]))]
        if timed is not feeds and not problems:  # the golden inputs are a point of their own
            emit(
                "latency", **said, shape="golden", inputs=points.shapes(feeds), budget_s=budget_s * points.GOLDEN_BUDGET
            )
            gold = latency.measure(lambda: sess.run(feeds), budget_s=budget_s * points.GOLDEN_BUDGET, batch=batch)
            row["latency_points"].insert(0, points.entry("golden", feeds, gold, src.get("golden")))
            measured.insert(0, (feeds, float(gold["p50"])))
    except EdgeAgentError as exc:
        sess.close()
        return _fail_run(row, rss0, memory_max, "inference at the latency shape failed", exc)
    row["conditions"] = sampler.stop()
    row["contended"] = conditions.contended(row["conditions"])
    row["latency_ms"] = lat
    row["throughput_ips"] = lat.get("throughput_ips")
    _record_memory(row, rss0)
    if memory_max and row["memory_peak_bytes"] > memory_max:
        sess.close()
        return fail(row, "memory", memory_reason(row["memory_peak_bytes"], memory_max, provider))
    emit("session_times", provider=provider, precision=row["precision"])
    try:
        held = keptsession.keeper((model_path, provider, precision, device, cache_dir)) if keep else None
        row["session_s"] = coldstart.session_times(opener, cache_dir, sess.compile_s, first_cold, held)
    except EdgeAgentError as exc:
        row["session_s"] = {"error": f"not measured: {exc}"}
    if cache_note:
        row["session_s"]["cache_rebuilt"] = cache_note
    if original and not problems:
        emit("original", provider=provider, precision=row["precision"])
        reopen = lambda: get(provider).open_session(  # noqa: E731
            original["path"], options=options, precision=precision, device=device
        )
        row["original"] = {
            "file": original["file"],
            **orig.speedup(reopen, original.get("feeds", timed), lat.get("p50"), budget_s / 2, batch),
        }
    if keep and keptsession.holds():
        forkserver.set_name(forkserver.KEPT_NAME)  # idle from here on, holding the session: named as such
    if problems:
        sess.close()
        return fail(
            row,
            "accuracy",
            f"accuracy: {'; '.join(problems)} on {provider}"
            + (f" ({row['precision']})" if row.get("precision") else "")
            + (f"; {row['accuracy']['length_note']}" if (row.get("accuracy") or {}).get("length_note") else ""),
        )
    row.update(status="passed", reason=_passed_reason(row))
    if max_feeds is not None:
        feeds_at = (min_feeds, max_feeds)
        _at_max(row, sess, feeds_at, measured, budget_s, batch, deadline, (rss0, opened), memory_max, src, said)
    sess.close()
    return row


def _at_max(
    row: dict[str, Any],
    sess: Any,
    feeds_at: tuple[Any, Any],
    measured: list[tuple[dict[str, Any], float]],
    budget_s: float,
    batch: int,
    deadline: float | None,
    rss: tuple[int, int],
    memory_max: int | None,
    src: dict[str, Any],
    said: dict[str, Any],
) -> None:
    """The declared max point, last: the row so far goes to the parent first (kept if this outlasts the
    deadline); the declared min (when it differs from opt: a second size for the estimate); the max checked
    against the time left and the memory budget, then timed; a run over memory_max there fails the row."""
    from agent.package.declared import default_budget

    rss0, opened = rss
    min_feeds, max_feeds = feeds_at
    emit("row_partial", row=dict(row))
    if min_feeds is not None:  # cheap: the smallest inputs
        _at_min(row, sess, min_feeds, measured, budget_s * points.MIN_BUDGET, batch, src, said)
    budget = (memory_max, "serving.memory_max") if memory_max else default_budget()
    peak0 = _peak_rss()
    try:
        limits = points.MaxBudget(
            measured=measured,
            budget_s=budget_s * points.MAX_SHAPE_BUDGET,
            batch=batch,
            deadline=deadline,
            peak_bytes=int(row.get("memory_peak_bytes") or 0),
            base_bytes=opened,
            memory_budget=budget,
        )
        lat_max, point = points.at_max(
            sess.run,
            max_feeds,
            limits,
            source=src.get("max"),
            progress=lambda event, **f: emit(event, **said, **f),
        )
    except EdgeAgentError as exc:
        lat_max, point = None, points.skipped("max", max_feeds, src.get("max"), f"failed: {exc}")
    row["latency_max_ms"] = lat_max
    row["latency_points"].append(point)
    if _peak_rss() > peak0:
        grown = _peak_rss() - rss0
        row["memory_peak_bytes"] = max(int(row.get("memory_peak_bytes") or 0), grown)
        row["rss_growth_mb"] = round(row["memory_peak_bytes"] / 2**20, 1)
    if memory_max and row["memory_peak_bytes"] > memory_max:
        fail(row, "memory", memory_reason(row["memory_peak_bytes"], memory_max, row["provider"]) + " (at max)")
        return
    row["reason"] = _passed_reason(row)


def _at_min(
    row: dict[str, Any],
    sess: Any,
    min_feeds: dict[str, Any],
    measured: list[tuple[dict[str, Any], float]],
    budget_s: float,
    batch: int,
    src: dict[str, Any],
    said: dict[str, Any],
) -> None:
    """The declared min point (a second size for the max point's estimate), then the row so far to the parent."""
    emit("latency", **said, shape="min", inputs=points.shapes(min_feeds), budget_s=budget_s)
    try:
        low = latency.measure(lambda: sess.run(min_feeds), budget_s=budget_s, batch=batch)
        row["latency_points"].insert(0, points.entry("min", min_feeds, low, src.get("min")))
        measured.insert(0, (min_feeds, float(low["p50"])))
    except EdgeAgentError as exc:
        row["latency_points"].insert(0, points.skipped("min", min_feeds, src.get("min"), f"failed: {exc}"))
    emit("row_partial", row=dict(row))  # with the min point


def _record_memory(row: dict[str, Any], rss0: int) -> None:
    grown = max(0, max(_peak_rss(), _rss()) - rss0)
    row["memory_peak_bytes"] = grown
    row["rss_growth_mb"] = round(grown / 2**20, 1)


def memory_reason(peak: int, cap: int, provider: str) -> str:
    """The one wording of a row over serving.memory_max: both figures."""
    return f"memory: peak RSS growth {size_text(peak)} > serving.memory_max {size_text(cap)} on {provider}"


def _fail_run(row: dict[str, Any], rss0: int, memory_max: int | None, what: str, exc: Exception) -> dict[str, Any]:
    """A session or a run that failed: a memory failure when the runtime could not allocate under the limit."""
    _record_memory(row, rss0)
    text = str(exc)
    if memory_max and any(m in text.lower() for m in _ALLOC_FAILED):
        said = re.search(r"(failed to allocate[^\n]*?)(?:\.|$|\n)", text, re.IGNORECASE)
        detail = said.group(1) if said else "an allocation was refused"
        return fail(
            row,
            "memory",
            f"memory: the model needs more than serving.memory_max {size_text(memory_max)} allows on "
            f"{row['provider']} ({what}: {detail})",
        )
    own = f"{row['provider']}: {what}: "  # providers already say "<provider>: inference failed: ..."
    return fail(row, "compatibility", f"{what}: {text[len(own) :] if text.startswith(own) else text}")


def unsupported_ops(message: str) -> list[str]:
    """Op names a provider's error names: 'unsupported operator(s) A, B:' (openvino) or ORT's
    'Could not find an implementation for Op(ver) node'."""
    ops = []
    m = re.search(r"unsupported operator\(s\) ([^:]+):", message)
    if m:
        ops += [o.strip() for o in m.group(1).split(",") if o.strip()]
    ops += re.findall(r"Could not find an implementation for (\w+)\(\d+\)", message)
    return list(dict.fromkeys(ops))


def _record_assignment(row: dict[str, Any], sess: Any) -> None:
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


def fail(row: dict[str, Any], stage: str, reason: str) -> dict[str, Any]:
    row.update(status="failed", stage=stage, reason=without_source_locations(reason))
    return row


def _passed_reason(row: dict[str, Any]) -> str:
    acc = row.get("accuracy", {})
    lat = row.get("latency_ms", {})
    cov = row.get("coverage")
    parts = [f"coverage {cov:.0%}" if cov is not None else "coverage not measured"]
    if "max_rel" in acc:
        parts.append(f"max_rel {acc['max_rel']:.2g}")
    if acc.get("length_note"):
        parts.append(acc["length_note"])
    if lat.get("p50") is not None:
        parts.append(latency.phrase(lat))
    top = next((p for p in row.get("latency_points") or [] if p["point"] == "max"), None)
    if top is not None:
        parts.append(f"at max {top['p50']:.3g} ms over {top['runs']} runs" if top.get("runs") else "at max not run")
    return ", ".join(parts)
