"""Real architectures (onnx's light_* models), generated samples and user packages through the same
qualification engine the daemon uses; plus feature-gated checks for specific runtimes."""

from __future__ import annotations

import pytest

from agent.package.load import load_package
from agent.qualify.harness import qualify
from agent.qualify.options import QualifyOptions


@pytest.fixture(scope="session")
def decisions(dev):
    """One qualification per model over every available variant (all precisions), shared by its tests."""
    cache = {}

    def get(path, budget):
        if path not in cache:
            names = list(dict.fromkeys(v.provider for v in dev.variants if v.available))
            cache[path] = qualify(
                load_package(path),
                dev.profile,
                dev.target,
                providers=names,
                options=QualifyOptions(latency_budget_s=budget, all_precisions=True),
            )
        return cache[path]

    return get


def test_model_qualifies(variant, model_package, decisions, budget):
    if not variant.available:
        pytest.skip(variant.reason)
    row = decisions(model_package, budget).row_by_key(variant.key)
    assert row is not None, f"no row for {variant.key}"
    if row.status == "unavailable":
        pytest.skip(row.reason)
    if row.status != "passed":
        pytest.fail(f"{row.status}: {row.reason}", pytrace=False)
    assert row.latency_ms["p50"] > 0 and row.accuracy


@pytest.mark.feature("openvino")
def test_openvino_reports_the_precision_it_really_uses(dev, tmp_path, budget):
    """The default row's precision is what the runtime itself reports for a model compiled without a hint, the
    profile's claim (bf16 / f16 / f32 default) agrees with it, and a reduced default brings an f32 row."""
    from agent import samples
    from agent.providers._common import has_arm_fp16, has_bf16
    from agent.providers.openvino import _core, precision_name

    pkg = load_package(samples.sample_cnn_package(tmp_path / "cnn"))
    reported = precision_name(
        _core().compile_model(str(pkg.model_path), "CPU").get_property("INFERENCE_PRECISION_HINT")
    )
    claimed = "bf16" if has_bf16(dev.profile) else "f16" if has_arm_fp16(dev.profile) else "f32"
    assert reported == claimed, f"the runtime defaults to {reported}, the profile says {claimed}"
    decision = qualify(
        pkg,
        dev.profile,
        dev.target,
        providers=["openvino"],
        options=QualifyOptions(latency_budget_s=budget, all_precisions=True),
    )
    default = next(r for r in decision.results if r.requested_precision is None and r.requested_device in (None, "CPU"))
    assert default.status != "unavailable" and default.precision == reported, default
    forced = [r for r in decision.results if r.requested_precision == "f32"]
    if reported == "f32":
        assert not forced  # nothing to fall back to
    else:
        assert forced and all(r.precision == "f32" for r in forced), forced


@pytest.mark.feature("tensorrt")
def test_tensorrt_builds_its_engine_cache(dev, tmp_path, budget):
    from agent import samples

    pkg = load_package(samples.sample_cnn_package(tmp_path / "cnn"))
    decision = qualify(
        pkg,
        dev.profile,
        dev.target,
        providers=["tensorrt"],
        options=QualifyOptions(cache_dir=tmp_path / "cache", latency_budget_s=budget),
    )
    row = decision.row("tensorrt")
    assert row.status == "passed", row.reason
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*")), "no engine cache written"
