"""Pure parts of qualification: accuracy metrics and tolerances, latency statistics, selection, cache keys."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.package.caches import cache_dir_for, runtime_key, runtime_versions
from agent.qualify import accuracy, latency, select
from agent.qualify.decision import Decision, Row
from agent.targets import Tolerance

TOL = Tolerance(max_abs=1e-4, max_rel=1e-3, min_cosine=0.999, top1_agreement=0.99)


def test_max_rel_is_scale_robust_near_zero():
    ref = np.array([1e-9, 0.5, -2.0], np.float32)
    got = ref + np.array([1e-6, 0, 0], np.float32)  # huge elementwise relative error at 1e-9, tiny vs scale
    m = accuracy.output_metrics(ref, got)
    assert m["scale"] == pytest.approx(2.0)
    assert m["max_rel"] == pytest.approx(5e-7, rel=1e-2)
    assert accuracy.violations({"y": m}, TOL) == []


def test_out_of_tolerance_reason_names_metric():
    ref = np.linspace(-1, 1, 50, dtype=np.float32)
    m = accuracy.output_metrics(ref, ref * 1.1)
    reasons = accuracy.violations({"y": m}, TOL)
    assert reasons and reasons[0].startswith("y: max_rel 0.1 > 0.001")


def test_top1_top5_and_ties():
    rng = np.random.default_rng(1)
    ref = rng.random((8, 20)).astype(np.float32)
    got = ref.copy()
    got[0] = got[0][::-1]
    m = accuracy.output_metrics(ref, got)
    assert m["top1_agreement"] == pytest.approx(7 / 8) and 0 < m["top5_agreement"] < 1
    assert any("top1_agreement" in r for r in accuracy.violations({"y": m}, TOL))
    flat = np.full((2, 10), 0.1, np.float32)  # uniform softmax: no clear winner, no top-1 claim
    assert "top1_agreement" not in accuracy.output_metrics(flat, flat + np.eye(2, 10, dtype=np.float32) * 1e-3)


def test_exact_match_for_integers_and_shape_errors():
    ref = np.arange(6, dtype=np.int64)
    assert accuracy.violations({"i": accuracy.output_metrics(ref, ref)}, TOL) == []
    bad = ref.copy()
    bad[2] = 9
    assert "exact-match" in accuracy.violations({"i": accuracy.output_metrics(ref, bad)}, TOL)[0]
    shape = accuracy.output_metrics(ref, ref.reshape(2, 3))
    assert "shape" in accuracy.violations({"i": shape}, TOL)[0]
    assert "missing" in accuracy.violations(accuracy.compare({"z": ref}, {}), TOL)[0]


def test_nonfinite_positions_must_match():
    ref = np.array([np.inf, np.nan, 1.0], np.float32)
    assert accuracy.violations({"y": accuracy.output_metrics(ref, ref.copy())}, TOL) == []
    assert "non-finite" in accuracy.violations({"y": accuracy.output_metrics(ref, np.array([np.inf, 0, 1.0]))}, TOL)[0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=40),
    st.floats(0, 1e-2, allow_nan=False),
)
def test_metrics_properties(values, noise):
    ref = np.array(values, np.float32)
    got = ref + np.float32(noise)
    m = accuracy.output_metrics(ref, got)
    assert m["max_abs"] >= 0 and -1.0 <= m["cosine"] <= 1.0
    assert m["max_abs"] <= m["max_rel"] * max(m["scale"], 1.0) + 1e-12
    assert accuracy.output_metrics(ref, ref)["max_abs"] == 0.0


def test_override_from_model_yaml():
    t = accuracy.override(TOL, {"max_rel": 0.5})
    assert t.max_rel == 0.5 and t.max_abs == TOL.max_abs
    assert accuracy.as_tolerance({"max_abs": 1.0}).max_abs == 1.0


def test_latency_support_flags_follow_sample_counts():
    few = latency.summarize([1.0] * 10)
    assert few["supported"] == {"p50": True, "p90": False, "p99": False}
    mid = latency.summarize(list(np.linspace(1, 2, 100)))
    assert mid["supported"] == {"p50": True, "p90": True, "p99": False}
    full = latency.summarize(list(np.linspace(1, 2, 700)))
    assert full["supported"]["p99"] and full["p50"] == pytest.approx(1.5, rel=1e-3)
    lo, hi = full["p50_ci95"]
    assert lo <= full["p50"] <= hi


def test_measure_reaches_the_p99_sample_count_for_a_fast_function():
    calls = []
    res = latency.measure(lambda: calls.append(1), budget_s=30.0, warmup_s=0.0)
    assert res["runs"] == latency.P99_MIN_RUNS and res["supported"]["p99"]
    assert len(calls) == res["runs"] + res["warmup_runs"] and res["warmup_runs"] >= 3


def test_measure_keeps_min_runs_even_past_a_tiny_budget():
    res = latency.measure(lambda: None, budget_s=1e-6, warmup_s=0.0)
    assert res["runs"] >= latency.P90_MIN_RUNS and res["supported"]["p90"]


def _row(provider, p50, p99=None, status="passed", ci=None, precision=None):
    lat = {"p50": p50, "p99": p99 if p99 is not None else p50 * 1.5, "p50_ci95": ci or [p50 * 0.99, p50 * 1.01]}
    return Row(provider=provider, status=status, reason="r", latency_ms=lat, requested_precision=precision)


def test_select_fastest_and_reasons():
    rows = [_row("openvino", 2.0), _row("cpu", 1.0), _row("qnn", 0.1, status="failed")]
    win, why, losers = select.choose(rows, ["qnn", "openvino", "cpu"])
    assert win.provider == "cpu" and "fastest" in why
    assert losers["openvino"].startswith("slower") and losers["qnn"].startswith("failed")


def test_select_near_tie_goes_to_preference_order():
    rows = [_row("cpu", 1.00), _row("openvino", 1.03)]  # within 5%
    win, why, losers = select.choose(rows, ["openvino", "cpu"])
    assert win.provider == "openvino" and "preference" in why
    assert "later in the target's preference order" in losers["cpu"]


def test_select_overlapping_ci_is_a_tie_and_p99_breaks_equal_p50():
    rows = [_row("cpu", 1.0, ci=[0.8, 1.3]), _row("openvino", 1.2, ci=[1.1, 1.4])]
    assert select.choose(rows, ["openvino", "cpu"])[0].provider == "openvino"
    rows = [_row("cpu", 1.0, p99=3.0), _row("openvino", 1.0, p99=2.0)]
    assert select.choose(rows, ["x"])[0].provider == "openvino"


def test_select_nothing_passes():
    win, why, losers = select.choose([_row("cpu", 1, status="error")], ["cpu"])
    assert win is None and "no provider passed" in why and losers["cpu"].startswith("error")


def test_decision_roundtrip_and_row_lookup():
    rows = [_row("openvino", 1.0), _row("openvino", 0.5, precision="f32"), _row("cpu", 2.0)]
    d = Decision(model={"sha256": "ab"}, results=rows, selected="openvino", selected_key="openvino:f32")
    assert d.row("openvino").requested_precision == "f32"
    again = Decision.from_dict(d.to_dict())
    assert again.row("openvino:f32").latency_ms["p50"] == 0.5 and again.row("cpu").provider == "cpu"
    assert {"model", "results", "selected"} <= set(d.to_dict())


def test_cache_dir_changes_with_runtime_versions(tmp_path):
    sha = "a" * 64
    a = cache_dir_for(tmp_path, sha, "openvino", {"openvino": "2026.4.1"})
    b = cache_dir_for(tmp_path, sha, "openvino", {"openvino": "2026.5.0"})
    assert a != b and a.parent == b.parent == tmp_path / sha and a.is_dir()
    assert a == cache_dir_for(tmp_path, sha, "openvino", {"openvino": "2026.4.1"})
    assert runtime_key("tensorrt", {"l4t": "36.4.3"}) != runtime_key("tensorrt", {"l4t": "36.4.4"})
    with pytest.raises(ValueError):
        cache_dir_for(tmp_path, "../etc", "cpu", {})


def test_runtime_versions_include_profile_software():
    from agent.hardware.profile import HardwareProfile

    v = runtime_versions(HardwareProfile(software={"l4t": "36.4.3", "jetpack": "6.2"}))
    assert v["l4t"] == "36.4.3" and v["jetpack"] == "6.2" and v["onnxruntime"]


def test_identical_outputs_have_cosine_one_exactly_on_any_simd_width():
    # float32 sums round with the SIMD width: before the fix an output equal to its golden scored 0.99999994 on an
    # AVX-512 host and failed a bit-exact min_cosine of 1.0 (it passed on AVX2 hosts)
    from agent.qualify.accuracy import _cosine

    rng = np.random.default_rng(0)
    for n in (3, 1000, 4097, 100_000):
        a = rng.standard_normal(n).astype(np.float32)
        assert _cosine(a, a.copy()) == 1.0
    assert _cosine(np.zeros(4, np.float32), np.zeros(4, np.float32)) == 1.0
    b = np.ones(8, np.float32)
    assert 0.0 < _cosine(b, b + np.float32(1e-3) * np.arange(8, dtype=np.float32)) < 1.0
