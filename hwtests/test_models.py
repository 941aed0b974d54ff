"""Real architectures (onnx's light_* models), generated samples and user packages through the same
qualification engine the daemon uses; plus feature-gated checks for specific runtimes."""

from __future__ import annotations

import pytest

from agent.qualify.harness import qualify
from agent.qualify.package import load_package


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
                latency_budget_s=budget,
                all_precisions=True,
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
    from agent import samples

    pkg = load_package(samples.sample_cnn_package(tmp_path / "cnn"))
    decision = qualify(
        pkg, dev.profile, dev.target, providers=["openvino"], latency_budget_s=budget, all_precisions=True
    )
    precisions = [r.precision for r in decision.results if r.status != "unavailable"]
    assert precisions and all(p in ("f32", "bf16", "f16") for p in precisions)
    assert (
        any(r.requested_precision == "f32" and r.precision == "f32" for r in decision.results) or len(precisions) == 1
    )


@pytest.mark.feature("tensorrt")
def test_tensorrt_builds_its_engine_cache(dev, tmp_path, budget):
    from agent import samples

    pkg = load_package(samples.sample_cnn_package(tmp_path / "cnn"))
    decision = qualify(
        pkg, dev.profile, dev.target, providers=["tensorrt"], cache_dir=tmp_path / "cache", latency_budget_s=budget
    )
    row = decision.row("tensorrt")
    assert row.status == "passed", row.reason
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*")), "no engine cache written"
