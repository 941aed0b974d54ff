"""Conformance orchestration: pick provider variants, run the node and models suites, build the Report."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.conformance import models as models_suite
from agent.conformance import node
from agent.conformance.report import Report
from agent.errors import ProviderError

SUITES = ("onnx-node", "models", "all")


@dataclass
class Variant:
    key: str  # "cpu", "openvino", "openvino:f32"
    provider: str
    precision: str | None
    options: dict[str, Any] = field(default_factory=dict)
    available: bool = True
    reason: str = ""

    def info(self, runtime_precision: str | None = None) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "precision": runtime_precision or self.precision,
            "requested_precision": self.precision,
            "available": self.available,
            "reason": self.reason,
        }


def variants_for(providers: list[str] | None, profile: Any, target: Any) -> tuple[list[Variant], dict[str, str]]:
    """Variants to run (explicit names are kept even when unavailable, so they show as skipped) and the
    reasons for available-by-default providers left out."""
    from agent.providers import PROVIDER_NAMES, get
    from agent.qualify.select import preference_of

    explicit = bool(providers)
    names = list(providers) if providers else list(dict.fromkeys([*preference_of(target), *PROVIDER_NAMES]))
    unknown = [n for n in names if n not in PROVIDER_NAMES]
    if unknown:
        raise ProviderError(f"unknown provider {unknown[0]!r}; known: {', '.join(PROVIDER_NAMES)}")
    out, left_out = [], {}
    for name in names:
        prov = get(name)
        options = target.provider_options(name) if hasattr(target, "provider_options") else {}
        probe = prov.probe(profile, options)
        if not probe.available:
            if explicit:
                out.append(Variant(name, name, None, options, False, f"unavailable: {probe.reason}"))
            else:
                left_out[name] = probe.reason
            continue
        for precision in prov.precisions(profile):
            key = f"{name}:{precision}" if precision else name
            out.append(Variant(key, name, precision, options, True, probe.reason))
    return out, left_out


def run_conformance(
    suite: str = "all",
    providers: list[str] | None = None,
    *,
    profile: Any = None,
    target: Any = None,
    models_dir: Path | None = None,
    patterns: list[str] | None = None,
    budget_s: float = 2.0,
    case_timeout: float = node.CASE_TIMEOUT_S,
    light: list[str] | None = None,
    progress: Callable[..., None] | None = None,
    model_budget_s: float = models_suite.MODEL_BUDGET_S,
    cache_dir: Path | None = None,
) -> Report:
    """Run the chosen suite(s); the report lists every case. Raises only for bad arguments."""
    if suite not in SUITES:
        raise ProviderError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    profile, target = _context(profile, target)
    variants, left_out = variants_for(providers, profile, target)
    report = Report(suite=suite, meta=_meta(profile, target, left_out))
    for v in variants:
        report.variants[v.key] = v.info()
    if suite in ("onnx-node", "all"):
        _node_suite(report, variants, patterns, case_timeout, progress)
    if suite in ("models", "all"):
        budgets = (budget_s, model_budget_s)
        _models_suite(report, variants, profile, target, models_dir, budgets, light, progress, cache_dir)
    report.meta["finished"] = time.time()
    return report


def _context(profile: Any, target: Any) -> tuple[Any, Any]:
    if profile is None:
        from agent.targets import detect_device as detect

        profile = detect("/")
    if target is None:
        from agent.targets import match

        target = match(profile)
    return profile, target


def _meta(profile: Any, target: Any, left_out: dict[str, str]) -> dict[str, Any]:
    from agent.hardware.emulation import detect_emulation
    from agent.package.caches import runtime_versions

    now = time.time()
    return {
        "created": now,
        "created_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "target": getattr(target, "name", None),
        "versions": runtime_versions(profile),
        "hardware": {
            "arch": profile.arch,
            "cpu": profile.cpu.model,
            "board": profile.board.model if profile.board else None,
        },
        "unavailable_providers": left_out,
        "emulated": detect_emulation(),
        "node_rtol": 1e-3,
        "node_atol": 1e-7,
    }


def _node_suite(report: Report, variants: list[Variant], patterns, case_timeout, progress) -> None:
    if progress:
        progress("suite", suite="onnx-node", stage="generating cases")
    cases = node.load_cases(patterns)
    report.meta["node_cases"] = len(cases)
    for v in variants:
        if progress:
            progress("variant", suite="onnx-node", provider=v.key, total=len(cases))
        if not v.available:
            report.cases += [node.CaseResult(c.name, c.op, v.key, "skipped", v.reason).to_dict() for c in cases]
            continue
        results = node.run_variant(
            cases, v.provider, v.precision, v.options, key=v.key, timeout=case_timeout, progress=progress
        )
        precs = {r.precision for r in results if r.precision}
        if len(precs) == 1:
            report.variants[v.key]["precision"] = precs.pop()
        report.cases += [r.to_dict() for r in results]


def _models_suite(report, variants, profile, target, models_dir, budgets, light, progress, cache_dir) -> None:
    with tempfile.TemporaryDirectory(prefix="edge-agent-models-") as tmp:
        work = Path(tmp)
        packages = models_suite.light_packages(work / "light", light) + models_suite.sample_packages(work / "samples")
        if models_dir is not None:
            packages += models_suite.user_packages(Path(models_dir))
        names = list(dict.fromkeys(v.provider for v in variants))
        if progress:
            progress("suite", suite="models", stage=f"{len(packages)} models on {', '.join(names)}")
        cases, records = models_suite.run_models(
            packages,
            profile,
            target,
            names,
            budget_s=budgets[0],
            model_budget_s=budgets[1],
            progress=progress,
            workdir=work / "extracted",
            cache_dir=cache_dir,
        )
    report.cases += cases
    report.models += records
    for c in cases:  # f32 rows exist only where the default precision failed accuracy; name them anyway
        report.variants.setdefault(
            c["provider"],
            {
                "provider": c["provider"].split(":")[0],
                "precision": c.get("precision"),
                "requested_precision": None,
                "available": True,
                "reason": "",
            },
        )
