"""Probation blames only the model (NaN/Inf inputs, invalid text and failures the incumbent shares are the
request's), and judges compute time like with like: against the incumbent's runs before the swap."""

from __future__ import annotations

import numpy as np
import pytest
from probation_models import chain_model, nan_guard_model, string_model
from support.serving import SINGLE_THREAD, log_model, open_session, reshape_model, x4
from test_serving_probation import Clock

from agent.serving.errors import InferenceFailed, InvalidInput
from agent.serving.registry import ModelRegistry
from agent.serving.rungate import RunGate
from agent.trial.probation import PASSED, TROUBLE, WATCHING, Probation, Thresholds, incumbent_baseline
from agent.trial.unjudged import NOT_JUDGED

NAN = {"x": np.array([[np.nan, 1.0, 2.0, 3.0]], np.float32)}


def test_nan_input_is_the_requests_fault_a_finite_one_is_the_models(tmp_path):
    r = ModelRegistry()
    r.activate("m", "2", open_session(log_model(), tmp_path))
    p = Probation(r, "m", "2", None, window=3600, clock=Clock())
    _, out = r.infer("m", NAN)
    assert np.isnan(out["y"]).any()
    v = p.evaluate()
    assert v.state == WATCHING and v.figures["nonfinite"] == 0 and v.figures["request_caused"] == 1
    r.infer("m", x4(-1.0))  # log(-1): NaN from a finite input
    v = p.evaluate()
    assert v.state == TROUBLE and v.figures["nonfinite"] == 1, v.reason
    r.close()


def test_nan_input_counts_when_the_incumbent_answers_it_with_finite_values(tmp_path):
    r = ModelRegistry()
    r.activate("m", "1", open_session(nan_guard_model(), tmp_path, "guard.onnx"))
    r.activate("m", "2", open_session(log_model(), tmp_path, "log.onnx"), keep_previous=True)
    assert r.referee("m") == "1"
    p = Probation(r, "m", "2", None, window=3600, clock=Clock())
    r.infer("m", {"x": np.array([[np.nan, 1.0, 2.0, 3.0]], np.float32)})
    v = p.evaluate()
    assert v.state == TROUBLE and v.figures["nonfinite"] == 1 and v.figures["request_caused"] == 0
    assert r.drop_referee("m") and r.referee("m") is None
    r.close()


def test_a_failure_the_incumbent_shares_is_not_blamed_one_it_does_not_share_is(tmp_path):
    bad = {"x": np.ones((1, 4), np.float32), "shape": np.array([5, 5], np.int64)}
    r = ModelRegistry()
    r.activate("m", "1", open_session(reshape_model(), tmp_path, "a.onnx"))
    r.activate("m", "2", open_session(reshape_model(), tmp_path, "b.onnx"), keep_previous=True)
    p = Probation(r, "m", "2", None, window=3600, clock=Clock())
    with pytest.raises(InferenceFailed, match="version 1 fails on the same input"):
        r.infer("m", bad)
    v = p.evaluate()
    assert v.state == WATCHING and v.figures["errors"] == 0 and v.figures["request_caused"] == 1
    r.drop_referee("m")  # no referee: a runtime failure on a finite input is the version's
    with pytest.raises(InferenceFailed):
        r.infer("m", bad)
    assert p.evaluate().state == TROUBLE
    r.close()


def test_invalid_text_is_a_400_and_not_counted(tmp_path):
    r = ModelRegistry()
    r.activate("m", "1", open_session(string_model(), tmp_path))
    p = Probation(r, "m", "1", None, window=3600, clock=Clock())
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        r.infer("m", {"s": np.array(["\udcff"], dtype=object)})
    assert r.infer("m", {"s": np.array(["ok"], dtype=object)})[1]["t"].tolist() == ["ok"]
    v = p.evaluate()
    assert v.state == WATCHING and v.figures["errors"] == 0 and v.figures["request_caused"] == 1
    r.close()


def _run(r, n):
    x = {"x": np.random.default_rng(0).standard_normal((1, 1024)).astype(np.float32)}
    for _ in range(n):
        r.infer("m", x)


@pytest.mark.alone
@pytest.mark.parametrize("redundant", [True, False])
def test_compute_time_is_judged_against_the_incumbent_before_the_swap(tmp_path, redundant):
    r = ModelRegistry(gate=RunGate(mark_share=1.0))  # every run measured: this counts the judge's samples
    r.activate("m", "1", open_session(chain_model(), tmp_path, "v1.onnx", SINGLE_THREAD))
    _run(r, 200)
    base = incumbent_baseline(r, "m", "1", 60.0, None)
    assert base is not None and len(base.samples_s) >= 64 and base.rate
    r.activate("m", "2", open_session(chain_model(redundant=redundant), tmp_path, "v2.onnx", SINGLE_THREAD))
    clock = Clock()
    p = Probation(r, "m", "2", {"p50": 1e-6}, window=10, thresholds=Thresholds(), incumbent=base, clock=clock)
    _run(r, 200)
    clock.now = 10.0
    v = p.evaluate()
    if v.state == WATCHING and v.figures.get("extended"):  # runs dropped as contended: watched on, to its bound
        clock.now = 10.0 * Thresholds().extend
        v = p.evaluate()
    assert v.figures["baseline"]["source"] == "incumbent", v.figures
    # Only honest outcomes: judged and right, or reported not judged (a busy host took the cores), never a guess
    if v.state == NOT_JUDGED:
        n = v.figures["not_judged"]
        assert n["measured"] < n["needed"] and (n["contended"] > 0 or n.get("why")), v.figures
        assert "compute time not judged" in v.reason, v.reason
    elif redundant:  # 2x the compute: rolled back, the reason names the compute ratio
        assert v.state == TROUBLE and "compute ratio" in v.reason and "incumbent" in v.reason, v.reason
        assert max(c["ratio"] for c in v.figures["compute"]) > 1.5
    else:  # the same compute: passes although the qualified figure (1e-6 ms) would fail it
        assert v.state == PASSED and v.figures["compute"], v.reason
    r.close()


def test_the_referee_serves_again_on_rollback_without_a_build(tmp_path):
    r = ModelRegistry()
    r.activate("m", "1", open_session(nan_guard_model(), tmp_path, "a.onnx"))
    first = r.entry("m").session
    r.activate("m", "2", open_session(log_model(), tmp_path, "b.onnx"), keep_previous=True)
    assert r.reinstate_referee("m", "3") is None  # not the referee's version: nothing happens
    done = r.reinstate_referee("m", "1")
    assert done is not None and done["previous"] == "2" and done["drained"]
    assert r.entry("m").session is first and r.referee("m") is None
    assert r.infer("m", NAN)[0] == "1"
    r.close()
