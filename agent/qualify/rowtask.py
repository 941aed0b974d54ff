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
from agent.qualify.rowspec import RowSpec

# what the runtimes say when an allocation is refused (under RLIMIT_DATA): a memory failure, not an op problem
_ALLOC_FAILED = ("failed to allocate", "bad_alloc", "out of memory", "cannot allocate memory", "memoryerror")


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def measure_row(spec: RowSpec) -> dict[str, Any]:
    """Returns the Row fields as a dict; expected failures are statuses, not exceptions. Accuracy on the spec's
    `feeds`, latency on its opt inputs and at min and max when declared (agent.qualify.rowspec.RowSpec).
    memory_peak_bytes: the peak RSS growth of the session (create, warm-up, timed runs). Before the max point
    the row so far goes to the parent as a `row_partial` event, the row it keeps if the max point outlasts the
    deadline."""
    m = _Measure(spec)
    failed = m.open()
    if failed is not None:
        return failed
    try:
        return m.measure()
    finally:
        m.sess.close()


class _Measure:
    """One row being measured: its spec, the row so far, the session, and what the later points need."""

    def __init__(self, spec: RowSpec) -> None:
        self.spec = spec
        self.row: dict[str, Any] = {
            "provider": spec.provider,
            "requested_precision": spec.precision,
            "requested_device": spec.device,
            "options": spec.options,
            "cache_dir": spec.cache_dir,
        }
        self.rss0 = _rss()
        self.deadline = (time.monotonic() + spec.row_timeout_s) if spec.row_timeout_s else None
        self.sess: Any = None
        self.opened = 0  # the session as built: what a bigger input does not scale
        self.first_cold = False
        self.cache_note: str | None = None
        self.measured: list[tuple[dict[str, Any], float]] = []  # (inputs, p50) of each point timed
        self.said: dict[str, Any] = {"provider": spec.provider, "precision": spec.precision}

    def opener(self, cache_dir: str | None) -> Any:
        from agent.providers import get

        s = self.spec
        return get(s.provider).open_session(
            s.model_path, options=s.options, precision=s.precision, device=s.device, cache_dir=cache_dir
        )

    def fail_run(self, what: str, exc: Exception) -> dict[str, Any]:
        return _fail_run(self.row, self.rss0, self.spec.memory_max, what, exc)

    def open(self) -> dict[str, Any] | None:
        """The session on the row's sealed cache, checked against the graph's declared types; the failed row when
        it cannot be (then there is no session to close)."""
        from agent.package.precision import effective
        from agent.qualify import outputs as io

        s, row = self.spec, self.row
        emit("session", provider=s.provider, precision=s.precision)
        self.cache_note = cacheseal.verify_or_reset(s.cache_dir)  # a corrupt or foreign cache is rebuilt, never loaded
        self.first_cold = coldstart.cache_empty(s.cache_dir)
        try:
            self.sess = self.opener(s.cache_dir)
        except EdgeAgentError as exc:
            row["unsupported_ops"] = unsupported_ops(str(exc))
            if getattr(exc, "assignment", None) is not None:  # measured on the part the runtime converts
                row["assignment"], row["coverage"] = exc.assignment.to_dict(), exc.assignment.coverage  # type: ignore[attr-defined]
            return self.fail_run("session creation failed", exc)
        cacheseal.seal(s.cache_dir)
        self.opened = max(0, _rss() - self.rss0)
        sess = self.sess
        row.update(precision=effective(s.model_precision, sess.precision or s.precision), device=sess.device)
        row.update(compile_s=sess.compile_s, model_precision=s.model_precision)
        self.said["precision"] = row["precision"]
        _record_assignment(row, sess)
        mismatch = io.contract_problems(s.declared or {}, sess)
        if mismatch:
            sess.close()
            return fail(row, "compatibility", f"datatypes disagree with the model: {'; '.join(mismatch)}")
        return None

    def measure(self) -> dict[str, Any]:
        """Accuracy, latency, memory, session times and the original's speed-up; then the min and max points."""
        s, row = self.spec, self.row
        checked = self.accuracy()
        if isinstance(checked, dict):
            return checked
        problems = checked
        failed = self.latency(problems)
        if failed is not None:
            return failed
        self.session_times()
        if s.original and not problems:
            self.original_speedup()
        if s.keep and keptsession.holds():
            forkserver.set_name(forkserver.KEPT_NAME)  # idle from here on, holding the session: named as such
        if problems:
            length = (row.get("accuracy") or {}).get("length_note")
            return fail(
                row,
                "accuracy",
                f"accuracy: {'; '.join(problems)} on {s.provider}"
                + (f" ({row['precision']})" if row.get("precision") else "")
                + (f"; {length}" if length else ""),
            )
        row.update(status="passed", reason=_passed_reason(row))
        if s.max_feeds is not None:
            self.at_max(s.max_feeds)
        return row

    def accuracy(self) -> list[str] | dict[str, Any]:
        """The outputs on the accuracy inputs against the reference (or the fp32 original): the problems found,
        or the failed row when the outputs cannot be compared at all."""
        from agent.qualify import original as orig
        from agent.qualify import outputs as io

        s, row, sess = self.spec, self.row, self.sess
        try:
            outputs = sess.run(s.feeds)
        except EdgeAgentError as exc:
            return self.fail_run("inference failed", exc)
        mismatch = io.result_problems(s.declared or {}, outputs)
        if mismatch:
            return fail(row, "compatibility", f"datatypes disagree with the model: {'; '.join(mismatch)}")
        tol = accuracy.as_tolerance(s.tolerances.get(row["precision"], s.tolerances.get(None)))
        try:
            if s.original:
                row["accuracy"], problems = orig.compare(
                    sess, s.original["sets"], s.original["outputs"], tol, s.original.get("classifier")
                )
                return list(problems)
            metrics = accuracy.compare(s.reference, outputs, tol.max_length_change)
            row["accuracy"] = {"outputs": metrics, "tolerance": tol.to_dict(), **accuracy.summarize(metrics)}
            if s.independent is not None:  # golden data this provider made: the evaluator confirms it or not
                owngolden.check(row, s.independent, outputs, tol)
            if accuracy.length_note(metrics):
                row["accuracy"]["length_note"] = accuracy.length_note(metrics)
            return list(accuracy.violations(metrics, tol))
        except EdgeAgentError as exc:
            return self.fail_run("inference failed", exc)

    def latency(self, problems: list[str]) -> dict[str, Any] | None:
        """Timed runs at the opt inputs (and at the golden inputs when they differ), the conditions meanwhile and
        the memory the session grew to; the failed row when a run fails or the memory is over the limit."""
        s, row, sess, said = self.spec, self.row, self.sess, self.said
        timed, src = s.timed, s.sources or {}
        emit("latency", **said, inputs=points.shapes(timed), budget_s=s.budget_s)
        sampler = conditions.Sampler()
        try:
            lat = latency.measure(
                lambda: sess.run(timed),
                budget_s=s.budget_s if not problems else s.budget_s / 4,
                batch=s.batch,
                progress=lambda event, **f: emit(event, **said, **f),
            )
            row["latency_points"] = [
                points.entry("opt" if timed is not s.feeds else "golden+opt", timed, lat, src.get("opt"))
            ]
            self.measured = [(timed, float(lat["p50"]))]
            if timed is not s.feeds and not problems:  # the golden inputs are a point of their own
                self.at_golden()
        except EdgeAgentError as exc:
            return self.fail_run("inference at the latency shape failed", exc)
        row["conditions"] = sampler.stop()
        row["contended"] = conditions.contended(row["conditions"])
        row["latency_ms"] = lat
        row["throughput_ips"] = lat.get("throughput_ips")
        _record_memory(row, self.rss0)
        if s.memory_max and row["memory_peak_bytes"] > s.memory_max:
            return fail(row, "memory", memory_reason(row["memory_peak_bytes"], s.memory_max, s.provider))
        return None

    def at_golden(self) -> None:
        s, sess = self.spec, self.sess
        budget = s.budget_s * points.GOLDEN_BUDGET
        emit("latency", **self.said, shape="golden", inputs=points.shapes(s.feeds), budget_s=budget)
        gold = latency.measure(lambda: sess.run(s.feeds), budget_s=budget, batch=s.batch)
        self.row["latency_points"].insert(0, points.entry("golden", s.feeds, gold, (s.sources or {}).get("golden")))
        self.measured.insert(0, (s.feeds, float(gold["p50"])))

    def session_times(self) -> None:
        """Cold and warm session creation (the warm session kept by the worker when the spec says so)."""
        s, row = self.spec, self.row
        emit("session_times", provider=s.provider, precision=row["precision"])
        try:
            held = keptsession.keeper(s.session_key) if s.keep else None
            row["session_s"] = coldstart.session_times(
                self.opener, s.cache_dir, self.sess.compile_s, self.first_cold, held
            )
        except EdgeAgentError as exc:
            row["session_s"] = {"error": f"not measured: {exc}"}
        if self.cache_note:
            row["session_s"]["cache_rebuilt"] = self.cache_note

    def original_speedup(self) -> None:
        """The fp32 original timed the same way: the speed-up this variant gives."""
        from agent.providers import get
        from agent.qualify import original as orig

        s, row, original = self.spec, self.row, self.spec.original or {}
        emit("original", provider=s.provider, precision=row["precision"])
        reopen = lambda: get(s.provider).open_session(  # noqa: E731
            original["path"], options=s.options, precision=s.precision, device=s.device
        )
        lat = row["latency_ms"]
        row["original"] = {
            "file": original["file"],
            **orig.speedup(reopen, original.get("feeds", s.timed), lat.get("p50"), s.budget_s / 2, s.batch),
        }

    def at_max(self, max_feeds: dict[str, Any]) -> None:
        """The declared max point, last: the row so far goes to the parent first (kept if this outlasts the
        deadline); the declared min (when it differs from opt: a second size for the estimate); the max checked
        against the time left and the memory budget, then timed; a run over memory_max there fails the row."""
        from agent.package.declared import default_budget

        s, row, src = self.spec, self.row, self.spec.sources or {}
        emit("row_partial", row=dict(row))
        if s.min_feeds is not None:  # cheap: the smallest inputs
            self.at_min(s.min_feeds)
        budget = (s.memory_max, "serving.memory_max") if s.memory_max else default_budget()
        peak0 = _peak_rss()
        try:
            limits = points.MaxBudget(
                measured=self.measured,
                budget_s=s.budget_s * points.MAX_SHAPE_BUDGET,
                batch=s.batch,
                deadline=self.deadline,
                peak_bytes=int(row.get("memory_peak_bytes") or 0),
                base_bytes=self.opened,
                memory_budget=budget,
            )
            lat_max, point = points.at_max(
                self.sess.run,
                max_feeds,
                limits,
                source=src.get("max"),
                progress=lambda event, **f: emit(event, **self.said, **f),
            )
        except EdgeAgentError as exc:
            lat_max, point = None, points.skipped("max", max_feeds, src.get("max"), f"failed: {exc}")
        row["latency_max_ms"] = lat_max
        row["latency_points"].append(point)
        if _peak_rss() > peak0:
            grown = _peak_rss() - self.rss0
            row["memory_peak_bytes"] = max(int(row.get("memory_peak_bytes") or 0), grown)
            row["rss_growth_mb"] = round(row["memory_peak_bytes"] / 2**20, 1)
        if s.memory_max and row["memory_peak_bytes"] > s.memory_max:
            reason = memory_reason(row["memory_peak_bytes"], s.memory_max, row["provider"])
            fail(row, "memory", reason + " (at max)")
            return
        row["reason"] = _passed_reason(row)

    def at_min(self, min_feeds: dict[str, Any]) -> None:
        """The declared min point (a second size for the max point's estimate), then the row so far to the parent."""
        s, row, src = self.spec, self.row, self.spec.sources or {}
        budget = s.budget_s * points.MIN_BUDGET
        emit("latency", **self.said, shape="min", inputs=points.shapes(min_feeds), budget_s=budget)
        try:
            low = latency.measure(lambda: self.sess.run(min_feeds), budget_s=budget, batch=s.batch)
            row["latency_points"].insert(0, points.entry("min", min_feeds, low, src.get("min")))
            self.measured.insert(0, (min_feeds, float(low["p50"])))
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
