"""Probation: NaN outputs, runtime errors and slow compute trip it; a clean window passes (real sessions)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support.serving import log_model, open_session, reshape_model, x4

from agent.samples import tiny_model
from agent.serving.errors import InferenceFailed
from agent.serving.registry import ModelRegistry
from agent.serving.rungate import RunGate
from agent.trial.probation import PASSED, STOPPED, SUPERSEDED, TROUBLE, WATCHING, Probation, Thresholds
from agent.trial.unjudged import NOT_JUDGED


class Clock:
    """A hand-driven clock for the window (the judgement itself never depends on wall time)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _registry(tmp_path, model, version="2"):
    # Every sampled run measured (by default reading the clocks takes at most 2 % of the time: on a model of
    # microseconds, one run in ~30): these tests count the judge's samples, not the gate's.
    r = ModelRegistry(gate=RunGate(mark_share=1.0))
    r.activate("m", version, open_session(model, tmp_path))
    return r


def test_nan_outputs_trip_probation_with_a_reason(tmp_path):
    r = _registry(tmp_path, log_model())
    r.infer("m", x4(-1.0))  # before probation: not counted
    troubles = []
    p = Probation(r, "m", "2", {"p50": 1.0}, window=3600, on_trouble=troubles.append, interval=0.01).start()
    r.infer("m", x4(1.0))
    assert p.evaluate().state == WATCHING
    r.infer("m", x4(-1.0))
    verdict = p.wait(30)
    assert verdict.state == TROUBLE and "NaN/Inf" in verdict.reason
    assert troubles == [verdict.reason] and verdict.figures["nonfinite"] == 1


def test_runtime_errors_trip_probation(tmp_path):
    r = _registry(tmp_path, reshape_model())
    clock = Clock()
    p = Probation(r, "m", "2", None, window=10, thresholds=Thresholds(max_errors=1), clock=clock)
    bad = {"x": np.ones((1, 4), np.float32), "shape": np.array([5, 5], np.int64)}
    with pytest.raises(InferenceFailed):
        r.infer("m", bad)
    assert p.evaluate().state == WATCHING  # one error tolerated
    with pytest.raises(InferenceFailed):
        r.infer("m", bad)
    v = p.evaluate()
    assert v.state == TROUBLE and "2 failed requests of 2" in v.reason


def test_clean_window_passes_and_calls_on_pass(tmp_path):
    r = _registry(tmp_path, tiny_model(2.0))
    passed = threading.Event()
    clock = Clock()
    p = Probation(
        r,
        "m",
        "2",
        {"p50": 1000.0},
        window=5,
        on_pass=lambda v: passed.set(),
        on_trouble=lambda reason: pytest.fail(reason),
        interval=0.01,
        clock=clock,
    ).start()
    for _ in range(100):
        r.infer("m", x4())
    clock.now = 5.0
    assert passed.wait(30)
    assert p.verdict.state == PASSED and p.verdict.figures["requests"] == 100


def _measure(r, since: float, n: int) -> None:
    """Requests until n runs since `since` were measured (a run whose threads waited for the cores is dropped)."""
    stats = r.model_stats("m", "2")
    while len(stats.window(since, cpu=True)[0]) < n:
        r.infer("m", x4())


def test_first_deployment_compute_time_against_the_qualified_figures(tmp_path):
    r = _registry(tmp_path, tiny_model(2.0))
    strict = Thresholds(qualified_factor=1.0, slack_ms=0.0, p90_samples=64, extend=1.0)
    clock = Clock()
    since = time.perf_counter()
    p = Probation(r, "m", "2", {"p50": 1e-6}, window=10, thresholds=strict, clock=clock)
    _measure(r, since, 63)
    clock.now = 10.0
    v = p.evaluate()
    # too few samples to judge compute time: a pass that says so, or (runs dropped as contended) not judged
    assert (v.state == PASSED and "not judged" in v.reason) or v.state == NOT_JUDGED, (v.state, v.reason)
    _measure(r, since, 64)
    v = p.evaluate()
    assert v.state == TROUBLE and "compute ratio" in v.reason and "qualified figure" in v.reason, v.reason
    assert v.figures["baseline"]["source"] == "qualified"
    clock2 = Clock()
    since = time.perf_counter()
    lenient = Probation(r, "m", "2", {"p50": 1000.0}, window=10, thresholds=strict, clock=clock2)
    _measure(r, since, 64)
    clock2.now = 10.0
    assert lenient.evaluate().state == PASSED
    since = time.perf_counter()
    contended = Probation(r, "m", "2", None, window=10, thresholds=strict, clock=clock2)  # no baseline at all
    _measure(r, since, 64)
    clock2.now = 20.0
    v = contended.evaluate()
    # runs came, nothing to judge them against: not judged (with why), never passed (issue 36)
    assert v.state == NOT_JUDGED and v.figures["baseline"]["source"] is None, (v.state, v.reason)
    assert "no baseline" in v.figures["not_judged"]["why"] and "compute time not judged" in v.reason, v.reason


def _quiet_verdict(tmp_path, p50: float, window: float, thresholds: Thresholds, at: float):
    """The verdict on a probation window (baseline p50 `p50`) in which no request came, evaluated at `at` s."""
    r = _registry(tmp_path, tiny_model(2.0))
    clock = Clock()
    p = Probation(r, "m", "2", {"p50": p50}, window=window, thresholds=thresholds, clock=clock)
    clock.now = at
    return p.evaluate()


def test_quiet_window_needs_min_requests_when_asked(tmp_path):
    v = _quiet_verdict(tmp_path, 1.0, 1, Thresholds(min_requests=10), at=2.0)
    assert v.state == TROUBLE and "only 0 requests" in v.reason


def test_superseded_and_stopped_do_not_call_back(tmp_path):
    r = _registry(tmp_path, tiny_model(2.0))
    calls = []
    p = Probation(r, "m", "2", None, window=3600, on_trouble=calls.append, on_pass=calls.append, interval=0.01).start()
    r.activate("m", "3", open_session(tiny_model(3.0), tmp_path, "v3.onnx"))
    assert p.wait(30).state == SUPERSEDED
    q = Probation(r, "m", "3", None, window=3600, on_trouble=calls.append, interval=0.01).start()
    q.stop()
    assert q.verdict.state == STOPPED and q.done
    assert calls == []


def test_too_few_runs_measured_because_they_were_contended_extends_the_window_then_says_why(tmp_path):
    r = _registry(tmp_path, tiny_model(2.0))
    clock = Clock()
    t = Thresholds(p90_samples=64, extend=3.0)
    p = Probation(r, "m", "2", {"p50": 1000.0}, window=10, thresholds=t, clock=clock)
    for _ in range(10):
        r.infer("m", x4())  # measured (the gate has the host to itself, or a few are dropped as contended)
    stats = r.model_stats("m", "2")
    for _ in range(5):  # runs measured and dropped: their threads waited for the cores (CpuMark.contended)
        stats.record(0.001, nonfinite=False, end=time.perf_counter(), contended=True)
    measured = len(stats.window(0.0, cpu=True)[0])
    assert measured <= 10
    clock.now = 10.0
    v = p.evaluate()
    assert v.state == WATCHING and v.figures["extended"] is True, v
    assert f"needs {64 - measured} more measured runs" in v.reason and "watching up to 30 s" in v.reason, v.reason
    assert v.figures["compute_contended"] >= 5
    clock.now = 30.0
    v = p.evaluate()
    # its own outcome, with the counts: never a pass
    assert v.state == NOT_JUDGED and "compute time not judged" in v.reason, v.reason
    assert v.figures["not_judged"]["measured"] == measured and v.figures["not_judged"]["contended"] >= 5
    assert f"{measured} runs measured of the 64 needed" in v.reason and "dropped" in v.reason, v.reason


def test_a_window_short_of_requests_not_of_measurements_ends_on_time(tmp_path):
    r = _registry(tmp_path, tiny_model(2.0))
    clock = Clock()
    p = Probation(r, "m", "2", {"p50": 1000.0}, window=10, thresholds=Thresholds(extend=3.0), clock=clock)
    stats = r.model_stats("m", "2")
    for _ in range(10):
        stats.record(0.001, nonfinite=False, end=time.perf_counter(), cpu=0.001)  # measured, none dropped
    clock.now = 10.0
    v = p.evaluate()
    # too few runs measured for a reason other than contention: not judged with the counts, never passed
    assert v.state == NOT_JUDGED and "10 runs measured of the 64 needed" in v.reason, v.reason
    assert "dropped" not in v.reason
    assert v.figures["not_judged"]["measured"] == 10 and v.figures["not_judged"]["contended"] == 0
    assert v.figures["not_judged"]["why"] == "10 runs measured of the 64 needed"


def test_a_quiet_window_is_not_a_skip(tmp_path):
    """No request at all: nothing was skipped; serving.probation.min_requests (0: a quiet window passes) decides."""
    v = _quiet_verdict(tmp_path, 1000.0, 10, Thresholds(extend=1.0), at=10.0)
    assert v.state == PASSED and v.figures["requests"] == 0 and "not_judged" not in v.figures, v
    assert "compute time not judged" in v.reason, v.reason
