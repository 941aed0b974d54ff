"""The qualification harness: one row per (provider, precision), each in a child process; then selection."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from agent.errors import ProviderError
from agent.hardware.emulation import detect_emulation
from agent.qualify import caches, coldstart, coverage_set, forkserver, latency, reference, select
from agent.qualify import optimize as opt
from agent.qualify import original as orig
from agent.qualify import outputs as io
from agent.qualify import variants as var
from agent.qualify.decision import Decision, Row
from agent.qualify.inputs import batch_size, package_plan
from agent.qualify.isolate import IsolatedResult, child_ask, run_isolated
from agent.qualify.package import ModelPackage, load_package

ROW_TIMEOUT_S = 600.0
LATENCY_BUDGET_S = 5.0
CLOSE_CALL = 0.25  # the two fastest rows within 25% of each other get a confirmation round
_PRECISION_KEYS = (None, "f32", "bf16", "f16", "fp16", "int8")


def qualify(
    package: ModelPackage | str | Path,
    profile: Any,
    target: Any = None,
    providers: list[str] | None = None,
    cache_dir: str | Path | None = None,
    progress: Callable[..., None] | None = None,
    isolate: bool = True,
    *,
    latency_budget_s: float = LATENCY_BUDGET_S,
    row_timeout_s: float = ROW_TIMEOUT_S,
    all_precisions: bool = False,
    memory_max: int | None = None,
    deadline_s: float | None = None,
    optimize: Any = None,
) -> Decision:
    """Measure the package on each candidate provider and select one. Rows never raise; bad arguments do.

    A provider's non-default precision (OpenVINO f32 on bf16 CPUs) is measured when the default fails
    accuracy, or always with all_precisions=True (the conformance report). When the two fastest passing
    rows are within CLOSE_CALL of each other, both are measured again in reverse order and their samples
    merged, so load drift during the first pass cannot decide alone. `memory_max` (bytes): what one model
    may use; each row's worker is killed over it and a row whose peak exceeds it fails.

    deadline_s bounds the whole qualification (the conformance models suite gives each model a budget): a
    row that would start after it is an error at stage "budget"; rows in flight are cut at it; there is no
    confirmation round. With a cache_dir, reference outputs computed for a model are kept and reused.

    optimize (True, or kinds from agent.qualify.optimize.KINDS; None: the target's `optimize`): each fp32 graph
    is also measured after those offline optimisations, as variants against the unoptimised graph."""
    if isolate:
        forkserver.prewarm()  # the row workers' server imports the runtimes while the package loads and probes run
    pkg = package if isinstance(package, ModelPackage) else load_package(package)
    target = target if target is not None else _match_target(profile)
    found = var.variants_of(pkg)
    for v in found:
        io.check_servable(v.model_path)  # outputs OIP cannot carry: refused with the remedy, never served wrong
    names = candidates(target, providers, pkg)
    deadline = time.monotonic() + deadline_s if deadline_s is not None else None
    kinds = opt.kinds_of(getattr(target, "optimize", ()) if optimize is None else optimize)
    built: list[dict[str, Any]] = []
    if kinds:
        more, built = opt.variants_for(found, kinds, cache_dir, _child_runner(isolate, row_timeout_s, memory_max))
        found = found + more
    rows: list[Row] = []
    reruns: dict[str, Callable[[], Row]] = {}
    refs: list[str] = []
    originals: dict[str, IsolatedResult] = {}
    for v in found:
        run = _Run(pkg, profile, target, cache_dir, progress, isolate, latency_budget_s, row_timeout_s, all_precisions)
        run.memory_max, run.deadline, run.originals = memory_max, deadline, originals
        run.asked = set(providers or select.preference_of(target) or ["cpu"])  # rows even when unavailable
        if not refs:
            run.warn_assumed()
        run.use_variant(v, reruns)  # its own file, input types, reference (golden, itself, or its fp32 original)
        refs.append(f"{v.name}: {run.ref_desc}" if v.name else run.ref_desc)
        for name in names:
            rows.extend(run.provider_rows(name))
    run.confirm_close_call(rows)
    reference.apply_rule(rows, target)  # the target decides whether an unchecked row may be selected
    winner, why, losers = select.choose(rows, select.preference_of(target))
    chosen = {"variant": winner.variant} if winner and winner.variant else {}
    run.say("selected", provider=winner.provider if winner else None, reason=why, **chosen)
    model = pkg.to_dict()
    if pkg.variants or built:
        model["variants"] = {v.name: v.to_dict() for v in found if v.name}
    return Decision(
        model=model,
        results=rows,
        selected=winner.provider if winner else None,
        selected_precision=winner.precision if winner else None,
        selected_key=winner.key if winner else None,
        reason=why,
        losers=losers,
        noise_rule=select.NOISE_RULE,
        target=getattr(target, "name", None),
        versions=run.versions,
        reference="; ".join(refs),
        inputs=run.inputs_desc,
        timestamp=time.time(),
        hardware=_hw(profile),
        selected_variant=winner.variant if winner else None,
        assumed_shapes=run.plan.assumed,
        memory_max=memory_max,
        emulated=run.emulated,
        optimizations=built,
        graph=opt.serving_graph(winner, built) if built else {},
        accuracy_checked=winner.accuracy_checked if winner else None,
    )


def _child_runner(isolate: bool, timeout: float, memory_max: int | None) -> Callable[..., Any]:
    return lambda func, kwargs, tag: run_isolated(
        func, kwargs, timeout=timeout, isolate=isolate, tag=tag, memory_max=memory_max
    )


def _match_target(profile: Any) -> Any:
    try:
        from agent.targets import match
    except ImportError:
        return None
    return match(profile)


def candidates(target: Any, providers: list[str] | None, pkg: ModelPackage) -> list[str]:
    """Requested providers, else the target's preference order then every other provider (each measured
    where available: agent.qualify.coverage_set); model.yaml required_providers restrict both."""
    from agent.providers import PROVIDER_NAMES

    names = list(providers) if providers else coverage_set.with_unlisted(select.preference_of(target) or ["cpu"])
    unknown = [n for n in names if n not in PROVIDER_NAMES]
    if unknown:
        raise ProviderError(f"unknown provider {unknown[0]!r}; known: {', '.join(PROVIDER_NAMES)}")
    if pkg.required_providers:
        names = [n for n in names if n in pkg.required_providers]
        if not names:
            raise ProviderError(f"model.yaml required_providers {pkg.required_providers} excludes every candidate")
    return list(dict.fromkeys(names))


def _reference(
    model_path,
    sha256: str,
    feeds,
    golden,
    isolate: bool,
    timeout: float,
    memory_max: int | None = None,
    cache_root=None,
) -> tuple[dict | None, str, str]:
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


def tolerances_for(target: Any, pkg: ModelPackage, provider: str) -> dict[str | None, dict[str, Any]]:
    """Tolerance per possible runtime precision: the target's, then its `tasks:` bounds for the package's task
    (model.yaml `task`), then model.yaml's own."""
    from agent.qualify.accuracy import as_tolerance, override
    from agent.targets import normalize_precision, task_of

    getter = getattr(target, "tolerances", None) or getattr(target, "tolerance", None)
    by_task = (getattr(target, "tasks", None) or {}).get(task_of(pkg.task) or "") or {}
    out = {}
    for p in _PRECISION_KEYS:
        base = override(as_tolerance(getter(provider, p) if getter else None), by_task.get(normalize_precision(p)))
        out[p] = override(base, pkg.tolerance_override(provider, p)).to_dict()
    return out


class _Run:
    """The context of one qualification: inputs, reference, versions, and how to (re)measure a row."""

    def __init__(self, pkg, profile, target, cache_root, progress, isolate, budget, timeout, all_precisions):
        self.pkg, self.profile, self.target, self.cache_root = pkg, profile, target, cache_root
        self.say = progress or (lambda event, **f: None)
        self.isolate, self.budget, self.timeout, self.all_precisions = isolate, budget, timeout, all_precisions
        self.plan = package_plan(pkg)
        self.feeds, self.golden, self.inputs_desc = self.plan.accuracy, self.plan.expected, self.plan.desc
        self.latency_feeds, self.max_feeds = self.plan.latency, self.plan.at_max
        self.memory_max: int | None = None
        self.asked: set[str] = set()
        self.deadline: float | None = None
        self.originals: dict[str, IsolatedResult] = {}  # fp32 original's outputs by file, shared by variants
        self.versions = caches.runtime_versions(profile)
        self.emulated = detect_emulation()
        self._rerun: dict[str, Callable[..., Row]] = {}
        self.variant = var.Variant(None, pkg.model_path, pkg.sha256, pkg.precision)
        self.original: dict[str, Any] | None = None
        self.reference: dict | None = None
        self.ref_desc, self.ref_error = "none", "no reference outputs"

    def use_variant(self, v: var.Variant, reruns: dict[str, Callable[[], Row]]) -> None:
        """Measure this variant (its own file, cache and input types) against the golden outputs or its own
        ORT CPU outputs, or its fp32 original when it has one. `reruns` is shared by all variants, so a close
        call is confirmed across them."""
        self.variant, self._rerun = v, reruns
        raw = self.feeds
        if v.declared:  # the one input plan, in this variant's input types
            self.feeds = var.adapt_feeds(raw, v.declared)
            lat, top = self.plan.latency, self.plan.at_max
            self.latency_feeds = self.feeds if lat is raw else var.adapt_feeds(lat, v.declared)
            self.max_feeds = var.adapt_feeds(top, v.declared) if top is not None else None
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
        probe = prov.probe(self.profile, options)
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

    def _precision_rows(self, prov, name, device, options, cdir, row_versions) -> list[Row]:
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

    def _run_row(self, name, precision, device, options, cdir, row_versions, confirm: bool = False) -> Row:
        row = self._measure_row(name, precision, device, options, cdir, row_versions, confirm)
        v = self.variant
        row.variant, row.model_path, row.model_sha256 = v.name, str(v.model_path), v.sha256
        row.model_precision = row.model_precision or v.precision
        reference.mark(row, self.ref_desc)
        budget = (getattr(self.target, "qualify", None) or {}).get("cold_start_budget_s")
        late = coldstart.over_budget(row.session_s, budget) if row.status == "passed" else ""
        if late:
            row.status, row.stage, row.reason = "failed", "cold_start", late
        row.optimization = opt.kind_of(v.name)
        if row.optimization and row.stage == "accuracy":
            row.reason = opt.refusal(row.optimization, row.reason)
        return row

    def _measure_row(self, name, precision, device, options, cdir, row_versions, confirm: bool = False) -> Row:
        left = self.deadline - time.monotonic() if self.deadline is not None else None
        if left is not None and left <= 0:
            return Row(
                provider=name,
                status="error",
                reason="the model's time budget was spent before this row (raise the budget)",
                stage="budget",
                requested_precision=precision,
                requested_device=device,
                options=options,
            )
        if self.reference is None:
            return Row(
                provider=name,
                status="error",
                reason=self.ref_error,
                stage="accuracy",
                requested_precision=precision,
                requested_device=device,
            )
        kwargs = {
            "model_path": str(self.variant.model_path),
            "provider": name,
            "options": options,
            "precision": precision,
            "device": device,
            "cache_dir": str(cdir) if cdir else None,
            "feeds": self.feeds,
            "reference": self.reference,
            "tolerances": tolerances_for(self.target, self.pkg, name),
            "budget_s": self.budget,
            "batch": batch_size(self.latency_feeds),
            "latency_feeds": self.latency_feeds if self.latency_feeds is not self.feeds else None,
            "max_feeds": self.max_feeds,
            "memory_max": self.memory_max,
            "model_precision": self.variant.precision,
            "declared": self.variant.declared,
            "original": self.original,
        }
        served0, t0 = child_ask("serving_requests"), time.monotonic()
        res = run_isolated(
            "agent.qualify.rowtask:" + ("confirm_latency" if confirm else "measure_row"),
            kwargs,
            timeout=min(self.timeout, left) if left is not None else self.timeout,
            isolate=self.isolate,
            tag=(f"{self.variant.name}/" if self.variant.name else "") + (f"{name}:{precision}" if precision else name),
            progress=self.say,
            memory_max=self.memory_max,
        )
        served1, wall = child_ask("serving_requests"), time.monotonic() - t0
        row = Row.from_dict(res.value) if res.ok else _broken_row(name, precision, device, options, res)
        row.wall_s = round(res.wall_s, 3)
        row.versions = row_versions
        row.assumed_shapes = self.plan.assumed
        if self.plan.assumed and row.status != "passed":
            dims = "; ".join(
                f"{n}: {', '.join(f'{d}={v}' for d, v in ds.items())}" for n, ds in self.plan.assumed.items()
            )
            row.reason += f" (measured on assumed shapes {dims}: declare input_shapes in model.yaml)"
        if isinstance(served0, int) and isinstance(served1, int):
            row.conditions["serving_rps"] = round(max(0, served1 - served0) / max(wall, 1e-6), 2)
        if self.emulated:
            row.emulated = self.emulated
            if row.latency_ms:
                row.latency_ms["emulated"] = True
        return row

    def confirm_close_call(self, rows: list[Row]) -> None:
        """Re-measure the two fastest passing rows (reverse order) when within CLOSE_CALL; merge samples."""
        passing = sorted(
            (r for r in rows if r.status == "passed" and (r.latency_ms or {}).get("samples_ms")),
            key=lambda r: r.latency_ms["p50"],
        )
        if (
            self.emulated
            or self.deadline is not None
            or len(passing) < 2
            or passing[1].latency_ms["p50"] > passing[0].latency_ms["p50"] * (1 + CLOSE_CALL)
        ):
            return
        for row in (passing[1], passing[0]):
            self.say("confirm", provider=row.provider, precision=row.precision)
            again = self._rerun[row.key](confirm=True)  # timed runs only: the rest holds from round one
            if again.status != "passed":
                continue
            stale = latency.phrase(row.latency_ms)
            merged = row.latency_ms["samples_ms"] + again.latency_ms["samples_ms"]
            warm = row.latency_ms.get("warmup_runs", 0) + again.latency_ms.get("warmup_runs", 0)
            row.latency_ms = {
                **latency.summarize(merged, warmup_runs=warm, batch=row.latency_ms.get("batch", 1)),
                "rounds": 2,
            }
            row.throughput_ips = row.latency_ms.get("throughput_ips")
            if row.reason and stale in row.reason:  # the reason states the merged figures, not round one's
                row.reason = row.reason.replace(stale, latency.phrase(row.latency_ms))
            orig_p50 = (row.original or {}).get("p50_ms")
            if orig_p50 and row.latency_ms.get("p50"):  # the speed-up follows the merged samples
                row.original = {**(row.original or {}), "speedup": round(orig_p50 / row.latency_ms["p50"], 3)}


def _broken_row(name: str, precision, device, options, res: IsolatedResult) -> Row:
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
    dims = "; ".join(f"{name}: {', '.join(f'{d}={v}' for d, v in ds.items())}" for name, ds in assumed.items())
    return (
        f"shapes assumed ({dims}): declare input_shapes or dynamic_dims in model.yaml, or ship a test_data_set_0; "
        "the daemon refuses models measured on assumed shapes"
    )


def _hw(profile: Any) -> dict[str, Any]:
    cpu = getattr(profile, "cpu", None)
    board = getattr(profile, "board", None)
    return {
        "arch": getattr(profile, "arch", None),
        "cpu": getattr(cpu, "model", None),
        "board": getattr(board, "model", None) if board else None,
        "software": dict(getattr(profile, "software", None) or {}),
    }
