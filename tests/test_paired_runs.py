"""What a pair's runs cost (agent/trial/paired.py): a half measured alone but contended runs again on the same
inputs while the mirrored CPU is within its share (RETRIES at most); a half that is not measured drops the pair
before its other half runs. Real ONNX Runtime sessions, the real run gate, real contention: a busy loop on the one
core this test's threads may use."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from probation_models import WIDTH, chain_model
from support.serving import SINGLE_THREAD, open_session
from support.wait import wait_for

from agent import schedstat
from agent.serving.registry import ModelRegistry
from agent.serving.rungate import RunGate
from agent.trial.paired import RETRIES, Pairing
from agent.trial.twin import CANDIDATE, Twin

POOL = {"intra_op_num_threads": 2}  # a pool thread beside the calling one: preempted, it makes the run contended


def test_a_half_not_measured_drops_the_pair_before_its_other_half(tmp_path):
    """A build holds the gate (busy): the first timed half is not measured, so the pair is dropped without running
    the second half, and without running the first again (it was not contended: running it again gains nothing)."""
    inc, cand = (open_session(chain_model(depth=4), tmp_path, f"{n}.onnx", SINGLE_THREAD) for n in ("inc", "cand"))
    gate = RunGate()
    pairing = Pairing(inc, cand, gate, share=1.0, aa_share=0.0, seed=1)
    feeds = {"x": np.ones((1, WIDTH), np.float32)}
    try:
        gate.busy(True)
        pairing.pair(feeds)
        # two warm-ups (neither session ran yet), then the first timed half only
        assert (pairing.runs, pairing.dropped, pairing.retried) == (3, 1, 0), pairing.counts()
        assert pairing.pairs == [] and pairing.aa == []
        gate.busy(False)
        pairing.pair(feeds)  # two timed halves, each after an untimed run of its own session in the same window
        assert (pairing.runs, pairing.dropped, pairing.retried, pairing.warmed) == (7, 1, 0, 2), pairing.counts()
        assert len(pairing.pairs) == 1
        assert "0 of 7 mirrored runs ran again after contention, 2 were untimed runs" in pairing.counts_said()
    finally:
        inc.close()
        cand.close()


@pytest.fixture
def one_core_beside_a_busy_loop():
    """This thread (and the threads it starts: the sessions' pools, the pair thread) and a busy loop on one core."""
    if not schedstat.AVAILABLE:
        pytest.skip("no /proc/<tid>/schedstat: contention is not seen here")
    mask = os.sched_getaffinity(0)
    core = min(mask)
    loop = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while 1: pass"])
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mask)
        loop.kill()
        loop.wait()


def _paired_beside_a_client(tmp_path, share: float, until) -> Pairing:
    """Pairs of two pooled sessions on copies of a client's requests (the registry serving the incumbent), until
    `until(pairing)`; the pairing, stopped."""
    r = ModelRegistry()
    r.activate("m", "1", open_session(chain_model(depth=16), tmp_path, "inc.onnx", POOL))
    cand = open_session(chain_model(depth=16, bias=1.0), tmp_path, "cand.onnx", POOL)
    pairing = Pairing(r.entry("m").session, cand, r.gate, share=share, seed=2).start()
    r.observe("m", pairing)
    stop, x = threading.Event(), {"x": np.ones((1, WIDTH), np.float32)}
    client = threading.Thread(target=lambda: [r.infer("m", x) for _ in iter(stop.is_set, True)])
    client.start()
    try:
        wait_for(lambda: until(pairing), 120, "pairs beside the busy loop")
    finally:
        stop.set()
        client.join(60)
        pairing.stop()
        cand.close()
    return pairing


def test_a_contended_half_runs_again_on_the_same_inputs(tmp_path, one_core_beside_a_busy_loop):
    """Beside a busy loop on the same core the pool thread waits on the run queue: contended halves run again,
    at most RETRIES times each, and a pair is kept only from halves measured clean."""
    p = _paired_beside_a_client(tmp_path, 1.0, lambda p: p.retried >= 3)
    c = p.counts()
    assert c["retried"] >= 3 and c["runs"] >= c["retried"], c
    attempts = len(p.pairs) + len(p.aa) + p.dropped  # pairs begun
    # two halves of 1 + RETRIES timed runs, each after an untimed one in its window; two warm-ups
    assert c["runs"] <= attempts * (2 * 2 * (1 + RETRIES) + 2), c
    assert c["warmed"] >= 1, c


def test_no_half_runs_again_beyond_the_share(tmp_path, one_core_beside_a_busy_loop):
    """With a share so small that one run fills it, no pair is begun from a live request (the budget counts the
    next pair as PAIR_RUNS runs of the request at least), and pairs begun anyway run no half again: a contended
    half drops its pair."""
    p = _paired_beside_a_client(tmp_path, 1e-6, lambda p: p.over_budget >= 3)
    assert p.runs == 0 and p.pairs == [] and p.mirrored_s == 0.0, p.counts()
    inc, cand = (open_session(chain_model(depth=16), tmp_path, f"{n}2.onnx", POOL) for n in ("inc", "cand"))
    pairing = Pairing(inc, cand, RunGate(), share=1e-6, aa_share=0.0, seed=5)
    feeds = {"x": np.ones((1, WIDTH), np.float32)}
    try:
        for _ in range(5):
            pairing.pair(feeds)
    finally:
        inc.close()
        cand.close()
    c = pairing.counts()
    # two warm-ups, then each pair's two halves of one timed run after an untimed one in its window
    assert c["retried"] == 0 and c["runs"] <= 2 + 5 * 4, c


def test_the_served_side_is_timed_on_a_twin_built_on_the_pair_thread_and_closed_at_stop(tmp_path):
    """serving.probation.paired_twin: the serving (candidate) session is never timed; a twin opened from the
    same model file is, built on the pair thread before the first pair (the gate measures nothing meanwhile),
    reported in paired_runs.twin, and closed when the pairs stop."""
    r = ModelRegistry()
    r.activate("m", "1", open_session(chain_model(depth=4), tmp_path, "inc.onnx", SINGLE_THREAD))
    served = open_session(chain_model(depth=4, bias=1.0), tmp_path, "cand.onnx", SINGLE_THREAD)
    r.activate("m", "2", served, keep_previous=True)
    referee = r.referee_session("m")
    assert referee is not None
    built: list = []

    def build():
        built.append(open_session(chain_model(depth=4, bias=1.0), tmp_path, "twin.onnx", SINGLE_THREAD))
        assert r.gate.due() is False  # busy while the twin builds: no run is measured
        return built[-1]

    pairing = Pairing(referee[1], served, r.gate, share=1.0, aa_share=0.0, seed=3)
    pairing.twin = Twin(CANDIDATE, build, r.gate)
    pairing.start()
    r.observe("m", pairing)
    x = {"x": np.ones((1, WIDTH), np.float32)}
    try:
        wait_for(lambda: r.infer("m", x) is not None and len(pairing.pairs) >= 3, 60, "three pairs on the twin")
    finally:
        r.observe("m", pairing, on=False)
        pairing.stop()
    assert len(built) == 1 and pairing.candidate is built[0] and pairing.candidate is not served
    twin = pairing.counts()["twin"]
    assert twin["side"] == "candidate" and twin["built"] is True and twin["error"] is None, twin
    assert pairing.twin.session is None  # closed at stop
    assert r.infer("m", x) is not None  # the served session itself is untouched
    r.close()


def test_a_twin_that_cannot_be_built_leaves_the_serving_session_and_says_why(tmp_path):
    inc, cand = (open_session(chain_model(depth=4), tmp_path, f"{n}.onnx", SINGLE_THREAD) for n in ("inc", "cand"))
    gate = RunGate()

    def build():
        raise MemoryError("no room for a third copy")

    pairing = Pairing(inc, cand, gate, share=1.0, aa_share=0.0, seed=4)
    pairing.twin = Twin(CANDIDATE, build, gate)
    try:
        pairing.start()
        wait_for(lambda: pairing.twin is not None and pairing.twin.build_s is not None, 60, "the twin's build")
        pairing.pair({"x": np.ones((1, WIDTH), np.float32)})
    finally:
        pairing.stop()
        inc.close()
        cand.close()
    twin = pairing.counts()["twin"]
    assert pairing.candidate is cand and twin["built"] is False, twin
    assert twin["error"] == "MemoryError: no room for a third copy", twin
    assert len(pairing.pairs) == 1  # measured: the failed build left the gate not busy
