"""One qualification's measuring context: the inputs, the reference (golden outputs, computed, or the fp32
original's), the runtime versions, and how each provider row is (re)measured in a child process."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from agent.hardware.emulation import detect_emulation
from agent.isolate.runner import IsolatedResult, IsolatedWorker, child_ask, run_isolated
from agent.package import caches
from agent.package import variants as var
from agent.package.golden import made_by as golden_made_by
from agent.package.inputs import batch_size, package_plan
from agent.package.load import ModelPackage
from agent.qualify import accuracy, coldstart, coverage_set, owngolden, points, reference
from agent.qualify import optimize as opt
from agent.qualify import original as orig
from agent.qualify.decision import Row
from agent.qualify.keptrows import KeptRows
from agent.qualify.options import QualifyOptions
from agent.qualify.rowspec import RowSpec


def _reference(
    model_path: Any,
    sha256: str,
    feeds: dict[str, Any],
    golden: Any,
    isolate: bool,
    timeout: float,
    memory_max: int | None = None,
    cache_root: Any = None,
) -> tuple[dict[str, Any] | None, str, str]:
    if golden:
        return golden, "golden outputs", ""
    cached = caches.load_reference(cache_root, sha256, feeds) if cache_root else None
    if cached is not None:
        return cached[0], f"{cached[1]} (reused)", ""
    values, desc, error = reference.compute(
        str(model_path), feeds, timeout=timeout, isolate=isolate, memory_max=memory_max
    )
    if values is not None and cache_root:
        caches.save_reference(cache_root, sha256, feeds, values, desc)
    return values, desc, error


def _options(target: Any, name: str, probe: Any) -> dict[str, Any]:
    for pref in getattr(target, "providers", None) or []:
        if getattr(pref, "name", None) == name:
            return dict(getattr(pref, "options", None) or {})
    return dict(getattr(probe, "options", None) or {})


class RowRunner:
    """The context of one qualification: inputs, reference, versions, and how to (re)measure a row (each row's
    rerun is kept by key in the shared `reruns`, for the harness's close-call round)."""

    def __init__(
        self,
        pkg: ModelPackage,
        profile: Any,
        target: Any,
        options: QualifyOptions,
        progress: Callable[..., None] | None,
    ) -> None:
        self.pkg, self.profile, self.target, self.cache_root = pkg, profile, target, options.cache_dir
        self.say = progress or (lambda event, **f: None)
        self.isolate, self.budget, self.timeout = options.isolate, options.latency_budget_s, options.row_timeout_s
        self.all_precisions = options.all_precisions
        self.plan = package_plan(pkg)
        self.feeds, self.golden, self.inputs_desc = self.plan.accuracy, self.plan.expected, self.plan.desc
        self.latency_feeds, self.max_feeds, self.min_feeds = self.plan.latency, self.plan.at_max, self.plan.at_min
        self.memory_max = options.memory_max
        self.asked: set[str] = set()
        self.deadline: float | None = None
        self.originals: dict[str, IsolatedResult] = {}  # fp32 original's outputs by file, shared by variants
        self.kept: KeptRows | None = None  # passing rows' workers, kept for the confirmation round (shared)
        self.probes: dict[str, Any] = {}  # probe results answered by a worker (agent.qualify.probes), by name
        self._held: IsolatedWorker | None = None  # the last row's worker, until kept or closed
        self.versions = caches.runtime_versions(profile)
        self.emulated = detect_emulation()
        self._rerun: dict[str, Callable[..., Row]] = {}
        self.variant = var.Variant(None, pkg.model_path, pkg.sha256, pkg.precision)
        self.original: dict[str, Any] | None = None
        self.reference: dict[str, Any] | None = None
        self.ref_desc, self.ref_error = "none", "no reference outputs"
        self.own = owngolden.Evaluator(golden_made_by(pkg.meta))  # rows compared with golden data they made

    def use_variant(self, v: var.Variant, reruns: dict[str, Callable[..., Row]]) -> None:
        """Measure this variant (its own file, cache and input types) against the golden outputs or its own
        ORT CPU outputs, or its fp32 original when it has one (`reruns`, shared: close calls across variants)."""
        self.variant, self._rerun = v, reruns
        self.own.use(None, None, "")  # no golden data in use until the reference is known
        raw = self.feeds
        if v.declared:  # the one input plan, in this variant's input types
            self.feeds = var.adapt_feeds(raw, v.declared)
            lat, top = self.plan.latency, self.plan.at_max
            self.latency_feeds = self.feeds if lat is raw else var.adapt_feeds(lat, v.declared)
            self.max_feeds = var.adapt_feeds(top, v.declared) if top is not None else None
            low = self.plan.at_min
            self.min_feeds = var.adapt_feeds(low, v.declared) if low is not None else None
        if v.reference is None:
            self.reference, self.ref_desc, self.ref_error = _reference(
                v.model_path,
                v.sha256,
                self.feeds,
                self.golden,
                self.isolate,
                self.timeout,
                self.memory_max,
                self.cache_root,
            )
            self.ref_desc = self.own.use(self.reference, self.golden, self.ref_desc)
            return
        raw_sets = orig.input_sets(self.pkg, raw)  # each model gets the same values in its own input types
        sets = [var.adapt_feeds(f, v.declared) for f in raw_sets]
        ref_declared = var.describe(v.reference)[1]
        ref_sets = [var.adapt_feeds(f, ref_declared) for f in raw_sets]
        res = self.originals.get(str(v.reference))  # optimised graphs share their original's outputs
        if res is None:
            res = self.originals[str(v.reference)] = run_isolated(
                "agent.qualify.original:original_outputs",
                {"model_path": str(v.reference), "sets": ref_sets},
                timeout=self.timeout,
                isolate=self.isolate,
                tag="original",
                memory_max=self.memory_max,
            )
        if not res.ok:
            self.reference, self.ref_desc = None, "none"
            self.ref_error = f"the fp32 original {v.reference.name} does not run on onnxruntime-cpu: {res.error}"
            return
        outputs, self.ref_desc = res.value
        self.reference = outputs[0]
        self.original = {
            "path": str(v.reference),
            "file": v.reference.name,
            "sets": sets,
            "outputs": outputs,
            # the original's own input types, at the shape the variant's latency is measured on
            "feeds": ref_sets[0] if self.plan.latency is raw else var.adapt_feeds(self.plan.latency, ref_declared),
            "classifier": orig.is_classifier(self.pkg.task),
        }

    def probe_options(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """{name: the options it is probed with} for each candidate the target does not exclude."""
        return {n: _options(self.target, n, None) for n in names if not coverage_set.exclusion(self.target, n)}

    def warn_assumed(self) -> None:
        """Say which shapes were guessed (once per qualification)."""
        if self.plan.assumed:
            self.say("warning", reason=assumed_warning(self.plan.assumed))

    def provider_rows(self, name: str) -> list[Row]:
        from agent.providers import get

        prov = get(name)
        options = _options(self.target, name, None)
        excluded = coverage_set.exclusion(self.target, name)
        if excluded:
            return [coverage_set.excluded_row(self.target, name, excluded)]
        probe = self.probes.get(name) or prov.probe(self.profile, options)
        if not probe.available and name not in self.asked:
            return []  # not in the target's list and not here: no row
        if not probe.available:
            remedy = f" (fix: {probe.remedy})" if probe.remedy else ""
            self.say("row", provider=name, status="unavailable", reason=probe.reason)
            return [
                Row(
                    provider=name,
                    status="unavailable",
                    reason=f"{probe.reason}{remedy}",
                    stage="probe",
                    options=options,
                    versions=dict(probe.versions),
                )
            ]
        options = _options(self.target, name, probe)
        row_versions = {**self.versions, **probe.versions}
        sha = self.variant.sha256
        cdir = caches.cache_dir_for(self.cache_root, sha, name, row_versions) if self.cache_root else None
        rows: list[Row] = []
        for device in list(probe.devices) if len(probe.devices) > 1 else [None]:
            rows.extend(self._precision_rows(prov, name, device, options, cdir, row_versions))
        return rows

    def _precision_rows(
        self, prov: Any, name: str, device: Any, options: Any, cdir: Any, row_versions: Any
    ) -> list[Row]:
        rows: list[Row] = []
        for precision in prov.precisions(self.profile):
            if precision is not None and not self.all_precisions and not (rows and rows[-1].stage == "accuracy"):
                continue  # a non-default precision is tried only when the default fails accuracy
            self.say("row", provider=name, device=device, precision=precision, status="running", **self._tag())
            rerun = partial(self._run_row, name, precision, device, options, cdir, row_versions)
            row = rerun()
            self._rerun[row.key] = rerun
            self.say(
                "row",
                provider=name,
                device=device,
                precision=row.precision or precision,
                status=row.status,
                reason=row.reason,
                **self._tag(),
            )
            rows.append(row)
        return rows

    def _tag(self) -> dict[str, Any]:
        return {"variant": self.variant.name} if self.variant.name else {}

    def _run_row(
        self,
        name: str,
        precision: Any,
        device: Any,
        options: Any,
        cdir: Any,
        row_versions: Any,
        confirm: bool = False,
        worker: Any = None,
    ) -> Row:
        """Measure one row (confirm: re-time it, in `worker` when its worker was kept)."""
        try:
            row = self._measure_row(name, precision, device, options, cdir, row_versions, confirm, worker)
        except BaseException:
            self._release()
            raise
        finally:
            if worker is not None:
                worker.close()  # a kept worker serves its row's one confirmation
        v = self.variant
        row.variant, row.model_path, row.model_sha256 = v.name, str(v.model_path), v.sha256
        row.model_precision = row.model_precision or v.precision
        reference.mark(row, self.ref_desc)
        self.own.mark(row)  # compared with golden data it made itself: said, and the evaluator's check
        budget = (getattr(self.target, "qualify", None) or {}).get("cold_start_budget_s")
        late = coldstart.over_budget(row.session_s, budget) if row.status == "passed" else ""
        if late:
            row.status, row.stage, row.reason = "failed", "cold_start", late
        row.optimization = opt.kind_of(v.name)
        if row.optimization and row.stage == "accuracy":
            row.reason = opt.refusal(row.optimization, row.reason)
        if self._held is not None and self.kept is not None:
            self.kept.offer(row, self._held)  # kept while among the fastest passing rows, else closed
            self._held = None
        return row

    def _release(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def _call(
        self,
        task: str,
        spec: RowSpec,
        timeout: float,
        tag: str,
        worker: Any,
        partial: dict[str, Any] | None = None,
    ) -> IsolatedResult:
        """The row's child: a worker kept for it (confirmation), a new one kept after (when rows are kept for
        the confirmation round), else a one-shot child. The row so far (`row_partial`) lands in `partial`."""
        keep = worker is None and self.kept is not None and self.isolate and task.endswith(":measure_row")
        say = points.catching(self.say, partial if partial is not None else {})
        if worker is None and not keep:
            return run_isolated(
                task, {"spec": spec}, timeout=timeout, isolate=self.isolate, tag=tag, progress=say,
                memory_max=self.memory_max,
            )  # fmt: skip
        w = worker if worker is not None else IsolatedWorker(memory_max=self.memory_max)
        try:
            res = w.call(task, {"spec": spec.kept() if keep else spec}, timeout=timeout, tag=tag, progress=say)
        except BaseException:
            w.close()
            raise
        if keep and res.ok:
            self._held = w
        else:
            w.close()
        if worker is not None and res.kind == "crashed":  # the kept worker died idle: a new one, a new session
            return self._call(task, spec, timeout, tag, None, partial)
        return res

    def _measure_row(
        self,
        name: str,
        precision: Any,
        device: Any,
        options: Any,
        cdir: Any,
        row_versions: Any,
        confirm: bool = False,
        worker: Any = None,
    ) -> Row:
        left = self.deadline - time.monotonic() if self.deadline is not None else None
        asked = {"provider": name, "status": "error", "requested_precision": precision, "requested_device": device}
        if left is not None and left <= 0:
            spent = "the model's time budget was spent before this row (raise the budget)"
            return Row(**asked, reason=spent, stage="budget", options=options)
        if self.reference is None:
            return Row(**asked, reason=self.ref_error, stage="accuracy")
        timeout = min(self.timeout, left) if left is not None else self.timeout
        spec = self._spec(name, precision, device, options, cdir, timeout)
        served0, t0 = child_ask("serving_requests"), time.monotonic()
        partial: dict[str, Any] = {}
        res = self._call(
            "agent.qualify.confirm:confirm_latency" if confirm else "agent.qualify.rowtask:measure_row",
            spec,
            timeout,
            (f"{self.variant.name}/" if self.variant.name else "") + (f"{name}:{precision}" if precision else name),
            worker,
            partial,
        )
        served1, wall = child_ask("serving_requests"), time.monotonic() - t0
        if not res.ok and res.kind == "timeout" and partial.get("row"):
            row = Row.from_dict(points.kept_partial(partial["row"], res.error, self.plan))
        else:
            row = Row.from_dict(res.value) if res.ok else _broken_row(name, precision, device, options, res)
        row.wall_s = round(res.wall_s, 3)
        row.versions = row_versions
        if isinstance(served0, int) and isinstance(served1, int):
            row.conditions["serving_rps"] = round(max(0, served1 - served0) / max(wall, 1e-6), 2)
        return self._annotated(row)

    def _annotated(self, row: Row) -> Row:
        """The row with what this qualification knows of it: generated and assumed inputs, emulation."""
        row.generated_inputs = dict(self.plan.generated)
        row.assumed_shapes = self.plan.assumed
        if self.plan.assumed and row.status != "passed":
            dims = _dims(self.plan.assumed)
            row.reason += f" (measured on assumed shapes {dims}: declare input_shapes in model.yaml)"
        if self.emulated:
            row.emulated = self.emulated
            if row.latency_ms:
                row.latency_ms["emulated"] = True
        return row

    def _spec(self, name: str, precision: Any, device: Any, options: Any, cdir: Any, timeout: float) -> RowSpec:
        """What the row's child measures: this variant on `name`, the inputs, the reference and the budgets."""
        return RowSpec(
            model_path=str(self.variant.model_path),
            provider=name,
            options=options,
            precision=precision,
            device=device,
            cache_dir=str(cdir) if cdir else None,
            feeds=self.feeds,
            reference=self.reference or {},
            tolerances=accuracy.tolerances_for(self.target, self.pkg, name),
            budget_s=self.budget,
            batch=batch_size(self.latency_feeds),
            latency_feeds=self.latency_feeds if self.latency_feeds is not self.feeds else None,
            max_feeds=self.max_feeds,
            min_feeds=self.min_feeds,
            memory_max=self.memory_max,
            model_precision=self.variant.precision,
            declared=self.variant.declared,
            original=self.original,
            sources=self.plan.sources,
            row_timeout_s=timeout,
            independent=self.own.outputs(name, self),
        )


def _broken_row(name: str, precision: Any, device: Any, options: Any, res: IsolatedResult) -> Row:
    """A row whose worker did not return one: killed over the memory limit, crashed, hung or raised."""
    memory = res.kind == "memory"
    return Row(
        provider=name,
        status="failed" if memory else "error",
        reason=f"{res.error} on {name}" if memory else f"{name}: {res.error}",
        stage="memory" if memory else "isolation",
        requested_precision=precision,
        requested_device=device,
        options=options,
        memory_peak_bytes=res.peak_rss_bytes if memory else None,
    )


def assumed_warning(assumed: dict[str, dict[str, int]]) -> str:
    """One line naming every guessed dim and the value it got, and what to add to the package."""
    return (
        f"shapes assumed ({_dims(assumed)}): declare input_shapes or dynamic_dims in model.yaml, or ship a test_data_set_0; "
        "the daemon refuses models measured on assumed shapes"
    )


def _dims(assumed: dict[str, dict[str, int]]) -> str:
    """Each guessed dim of each input and the value it got: "x: batch=1, len=8; y: batch=1"."""
    return "; ".join(f"{name}: {', '.join(f'{d}={v}' for d, v in ds.items())}" for name, ds in assumed.items())
