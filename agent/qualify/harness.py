"""The qualification harness: one row per (provider, precision), each in a child process; then selection."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from agent.errors import ProviderError
from agent.qualify import caches, latency, select
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
) -> Decision:
    """Measure the package on each candidate provider and select one. Rows never raise; bad arguments do.

    A provider's non-default precision (OpenVINO f32 on bf16 CPUs) is measured when the default fails
    accuracy, or always with all_precisions=True (the conformance report). When the two fastest passing
    rows are within CLOSE_CALL of each other, both are measured again in reverse order and their samples
    merged, so load drift during the first pass cannot decide alone. `memory_max` (bytes): what one model
    may use; each row's worker is killed over it and a row whose peak exceeds it fails."""
    pkg = package if isinstance(package, ModelPackage) else load_package(package)
    target = target if target is not None else _match_target(profile)
    run = _Run(pkg, profile, target, cache_dir, progress, isolate, latency_budget_s, row_timeout_s, all_precisions)
    run.memory_max = memory_max
    run.start()
    rows: list[Row] = []
    for name in candidates(target, providers, pkg):
        rows.extend(run.provider_rows(name))
    run.confirm_close_call(rows)
    winner, why, losers = select.choose(rows, select.preference_of(target))
    run.say("selected", provider=winner.provider if winner else None, reason=why)
    return Decision(
        model=pkg.to_dict(),
        results=rows,
        selected=winner.provider if winner else None,
        selected_precision=winner.precision if winner else None,
        selected_key=winner.key if winner else None,
        reason=why,
        losers=losers,
        noise_rule=select.NOISE_RULE,
        target=getattr(target, "name", None),
        versions=run.versions,
        reference=run.ref_desc,
        inputs=run.inputs_desc,
        timestamp=time.time(),
        hardware=_hw(profile),
        assumed_shapes=run.plan.assumed,
        memory_max=memory_max,
    )


def _match_target(profile: Any) -> Any:
    try:
        from agent.targets import match
    except ImportError:
        return None
    return match(profile)


def candidates(target: Any, providers: list[str] | None, pkg: ModelPackage) -> list[str]:
    """Requested providers, else the target's preference order; model.yaml required_providers restrict both."""
    from agent.providers import PROVIDER_NAMES

    names = list(providers) if providers else (select.preference_of(target) or ["cpu"])
    unknown = [n for n in names if n not in PROVIDER_NAMES]
    if unknown:
        raise ProviderError(f"unknown provider {unknown[0]!r}; known: {', '.join(PROVIDER_NAMES)}")
    if pkg.required_providers:
        names = [n for n in names if n in pkg.required_providers]
        if not names:
            raise ProviderError(f"model.yaml required_providers {pkg.required_providers} excludes every candidate")
    return list(dict.fromkeys(names))


def _reference(pkg, feeds, golden, isolate: bool, timeout: float, memory_max=None) -> tuple[dict | None, str, str]:
    if golden:
        return golden, "golden outputs", ""
    res = run_isolated(
        "agent.qualify.rowtask:reference_outputs",
        {"model_path": str(pkg.model_path), "feeds": feeds},
        timeout=timeout,
        isolate=isolate,
        tag="reference",
        memory_max=memory_max,
    )
    if res.ok:
        return res.value[0], res.value[1], ""
    return None, "none", f"no reference outputs: {res.error}"


def _options(target: Any, name: str, probe: Any) -> dict[str, Any]:
    for pref in getattr(target, "providers", None) or []:
        if getattr(pref, "name", None) == name:
            return dict(getattr(pref, "options", None) or {})
    return dict(getattr(probe, "options", None) or {})


def tolerances_for(target: Any, pkg: ModelPackage, provider: str) -> dict[str | None, dict[str, Any]]:
    """Tolerance per possible runtime precision: the target's, overridden by model.yaml."""
    from agent.qualify.accuracy import as_tolerance, override

    getter = getattr(target, "tolerances", None) or getattr(target, "tolerance", None)
    out = {}
    for p in _PRECISION_KEYS:
        base = as_tolerance(getter(provider, p) if getter else None)
        out[p] = override(base, pkg.tolerance_override(provider, p)).to_dict()
    return out


class _Run:
    """The context of one qualification: inputs, reference, versions, and how to (re)measure a row."""

    def __init__(self, pkg, profile, target, cache_root, progress, isolate, budget, timeout, all_precisions):
        self.pkg, self.profile, self.target, self.cache_root = pkg, profile, target, cache_root
        self.say = progress or (lambda event, **f: None)
        self.isolate, self.budget, self.timeout, self.all_precisions = isolate, budget, timeout, all_precisions
        self.plan = package_plan(pkg)
        self.feeds, self.inputs_desc = self.plan.accuracy, self.plan.desc
        self.memory_max: int | None = None
        self.versions = caches.runtime_versions(profile)
        self._rerun: dict[str, Callable[[], Row]] = {}

    def start(self) -> None:
        """Say which shapes were guessed, then get the reference outputs (golden, else ORT CPU fp32)."""
        if self.plan.assumed:
            self.say("warning", reason=assumed_warning(self.plan.assumed))
        self.reference, self.ref_desc, self.ref_error = _reference(
            self.pkg, self.feeds, self.plan.expected, self.isolate, self.timeout, self.memory_max
        )

    def provider_rows(self, name: str) -> list[Row]:
        from agent.providers import get

        prov = get(name)
        options = _options(self.target, name, None)
        probe = prov.probe(self.profile, options)
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
        cdir = caches.cache_dir_for(self.cache_root, self.pkg.sha256, name, row_versions) if self.cache_root else None
        rows: list[Row] = []
        for device in list(probe.devices) if len(probe.devices) > 1 else [None]:
            rows.extend(self._precision_rows(prov, name, device, options, cdir, row_versions))
        return rows

    def _precision_rows(self, prov, name, device, options, cdir, row_versions) -> list[Row]:
        rows: list[Row] = []
        for precision in prov.precisions(self.profile):
            if precision is not None and not self.all_precisions and not (rows and rows[-1].stage == "accuracy"):
                continue  # a non-default precision is tried only when the default fails accuracy
            self.say("row", provider=name, device=device, precision=precision, status="running")
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
            )
            rows.append(row)
        return rows

    def _run_row(self, name, precision, device, options, cdir, row_versions) -> Row:
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
            "model_path": str(self.pkg.model_path),
            "provider": name,
            "options": options,
            "precision": precision,
            "device": device,
            "cache_dir": str(cdir) if cdir else None,
            "feeds": self.feeds,
            "reference": self.reference,
            "tolerances": tolerances_for(self.target, self.pkg, name),
            "budget_s": self.budget,
            "batch": batch_size(self.plan.latency),
            "latency_feeds": self.plan.latency if self.plan.latency is not self.feeds else None,
            "max_feeds": self.plan.at_max,
            "memory_max": self.memory_max,
        }
        served0, t0 = child_ask("serving_requests"), time.monotonic()
        res = run_isolated(
            "agent.qualify.rowtask:measure_row",
            kwargs,
            timeout=self.timeout,
            isolate=self.isolate,
            tag=f"{name}:{precision}" if precision else name,
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
        return row

    def confirm_close_call(self, rows: list[Row]) -> None:
        """Re-measure the two fastest passing rows (reverse order) when within CLOSE_CALL; merge samples."""
        passing = sorted(
            (r for r in rows if r.status == "passed" and (r.latency_ms or {}).get("samples_ms")),
            key=lambda r: r.latency_ms["p50"],
        )
        if len(passing) < 2 or passing[1].latency_ms["p50"] > passing[0].latency_ms["p50"] * (1 + CLOSE_CALL):
            return
        for row in (passing[1], passing[0]):
            self.say("confirm", provider=row.provider, precision=row.precision)
            again = self._rerun[row.key]()
            if again.status != "passed":
                continue
            merged = row.latency_ms["samples_ms"] + again.latency_ms["samples_ms"]
            warm = row.latency_ms.get("warmup_runs", 0) + again.latency_ms.get("warmup_runs", 0)
            row.latency_ms = {
                **latency.summarize(merged, warmup_runs=warm, batch=row.latency_ms.get("batch", 1)),
                "rounds": 2,
            }
            row.throughput_ips = row.latency_ms.get("throughput_ips")


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
