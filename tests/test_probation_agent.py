"""DeviceAgent in-process over real HTTP: a version with 2x the compute is rolled back naming the compute ratio;
one that changes the top-1 class on ~30% of inputs is stopped in shadow before any client gets its answer;
NaN inputs and client errors sent during probation do not stop a good version."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from cp_support import commit_flagged_targets
from probation_load import Load, body_for, send
from probation_models import (
    chain_depth,
    chain_model,
    classifier_inputs,
    classifier_model,
    classifier_weights,
    disagreement,
)
from support.agent import make_agent
from support.daemon import drop
from support.wait import wait_for

from agent.samples import write_package
from agent.trial.settings import ProbationConfig, ShadowConfig


def _agent(tmp_path, probation_s: float, shadow: ShadowConfig, probation: ProbationConfig | None = None):
    probation = probation or ProbationConfig()
    return make_agent(tmp_path, probation_s=probation_s, shadow=shadow, probation=probation, start=True)


def _push(a, version: str, model, feeds=None):
    drop(a.state_dir, version, writer=lambda d: write_package(d, model, name="tiny", version=version, feeds=feeds))

    def ended():
        done = [d for d in a.orchestrator.journal.all() if d.version == version and d.terminal]
        return done[-1] if done else None

    return wait_for(ended, 240, f"deployment of version {version}")


@pytest.mark.alone
def test_twice_the_compute_is_rolled_back_with_the_compute_ratio(tmp_path):
    shadow = ShadowConfig(requests=10, duration_s=20, min_requests=5, max_latency_ratio=100.0)
    # A run whose threads waited for the cores is not measured (rungate.py): beside a busy loop on one of 2 cores,
    # or 2 other pytest workers, most of the 2x version's runs are dropped so, and probation watches on for
    # enough (here up to 8x its window).
    a = _agent(tmp_path, 5.0, shadow, ProbationConfig(extend=8.0))
    load = None
    try:
        # 2x over 1.5x + 0.5 ms needs a gap well above the slack: about 2 ms of CPU time a run on this host
        depth = chain_depth(tmp_path, 2.0)
        assert _push(a, "1", chain_model(depth=depth, bias=1.0)).state.value == "committed"
        x = np.random.default_rng(1).standard_normal((1, 1024)).astype(np.float32)
        # one client: with two in this process, the second one's request handling took the cores from 63 % of
        # the measured runs (dropped as contended), against 15 % with one
        load = Load(a.url, "tiny", [body_for("x", x)], clients=1).start()
        load.wait_requests(300)
        stats = a.registry.model_stats("tiny", "1")  # a baseline: enough of the incumbent's runs measured
        try:  # a busy host may never measure enough of them: then compute cannot be judged, and must say so
            wait_for(lambda: len(stats.window(0.0, cpu=True)[0]) >= 128 or None, 120, "the incumbent's runs")
        except AssertionError:
            pass
        session_v1 = a.registry.entry("tiny").session
        dep = _push(a, "2", chain_model(depth=depth, redundant=True, bias=1.0))
        shadow_said = dep.data["shadow"]
        if shadow_said["verdict"] == "fail":  # the shadow's pairs were enough and said slower: stopped before the swap
            assert shadow_said.get("compute") == "paired" and "paired compute ratio" in dep.reason, dep.reason
            assert dep.state.value == "failed" and a.registry.entry("tiny").session is session_v1
            assert load.errors == []
            return
        assert shadow_said["verdict"] == "pass"  # same outputs: only the compute time gives it away
        probation = dep.data.get("probation") or {}
        # Only honest outcomes: judged and right (rolled back naming the ratio), or reported not judged
        if "not_judged" in probation:  # runs dropped as contended: said with the counts, never passed as judged
            n = probation["not_judged"]
            if n["signal"] == "paired":  # the pairs could not separate the versions (trial/pairjudge.py)
                assert probation["paired"]["verdict"] == "not judged", probation
            else:  # its own runs dropped, or the incumbent's before the swap (then no baseline to judge by)
                # or skipped for another reason, which says why (issue 36: never passed)
                contended = (n["measured"] < n["needed"] and n["contended"] > 0) or n["incumbent_contended"] > 0
                assert contended or n.get("why"), probation
            assert dep.state.value == "rolled_back", dep.reason  # the default policy, serving.unjudged: rollback
            assert "rolled back to the version judged before" in dep.reason, dep.reason
        elif not probation.get("compute"):  # no baseline at all (the incumbent's runs were never measured)
            assert probation["baseline"]["source"] is None and dep.state.value == "committed", probation
        else:
            assert dep.state.value == "rolled_back", (dep.reason, probation)
            assert a.registry.entry("tiny").session is session_v1  # rolled back to the referee: no rebuild
            assert "compute ratio" in dep.reason and "incumbent" in dep.reason, dep.reason
            wait_for(lambda: a.registry.models().get("tiny") == "1", 60, "version 1 back")
            load.wait_requests(20)
    finally:
        if load:
            load.stop()
        a.stop()
    assert load.errors == []


def test_a_third_of_top1_classes_changed_is_stopped_in_shadow_before_any_client_sees_it(tmp_path):
    inputs = classifier_inputs(200)
    assert 0.2 < disagreement(inputs) < 0.4
    expected = np.argmax(inputs[:, 0, :] @ classifier_weights(), axis=1)
    shadow = ShadowConfig(requests=60, duration_s=30, min_requests=20)
    a = _agent(tmp_path, 2.0, shadow)
    load = None
    try:
        assert _push(a, "1", classifier_model()).state.value == "committed"
        load = Load(a.url, "tiny", [body_for("x", x) for x in inputs], clients=4, keep=True).start()
        load.wait_requests(200)
        dep = _push(a, "2", classifier_model(swap=True))
        load.wait_requests(50)
    finally:
        if load:
            load.stop()
        status = a.status()
        a.stop()
    assert dep.state.value == "failed" and "shadow: top-1 agreement" in dep.reason, dep.reason
    shown = status["deployments"]["tiny"]["shadow"]
    assert {"requests", "agreement", "max_rel", "latency_ratio", "verdict"} <= set(shown)
    assert shown["verdict"] == "fail" and shown["requests"] >= 20 and shown["agreement"] < 0.9
    decision = json.loads((a.state_dir / "decisions" / f"{dep.id}.json").read_bytes())
    assert decision["shadow"]["verdict"] == "fail"
    assert load.errors == []
    assert {v for _, _, v, _ in load.log} == {"1"}  # no client ever got an answer from version 2
    assert all(int(np.argmax(out)) == expected[j] for j, _, _, out in load.log)


def _binary_nan() -> tuple[bytes, dict]:
    head = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    ).encode()
    raw = struct.pack("<4f", float("nan"), 1.0, float("inf"), 2.0)
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}


HOSTILE = {
    "json NaN": (b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[NaN,1,2,3]}]}', {}),
    "binary NaN/Inf": _binary_nan(),
    "lone surrogate": (b'{"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":["\\udcff"]}]}', {}),
    "wrong shape": (b'{"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}', {}),
    "malformed": (b'{"inputs":[{"name":"x",', {}),
}


def _ended(a, version: str):
    """The terminal journal record of `version`, or None while it is in flight."""
    return next((d for d in a.orchestrator.journal.all() if d.version == version and d.terminal), None)


def _wait_probation(a, version: str) -> None:
    """Until `version` is in probation; a deployment that ended before it fails the test at once with its reason."""

    def reached():
        if (a.status()["models"].get("tiny") or {}).get("state") == "probation":
            return True
        dep = _ended(a, version)
        assert dep is None, f"version {version} ended {dep.state.value} before probation: {dep.reason}"
        return False

    wait_for(reached, 240, "probation")


@pytest.mark.parametrize("referee", [True, False])
def test_hostile_inputs_during_probation_do_not_stop_a_good_version(tmp_path, referee, monkeypatch):
    from agent.samples import tiny_model

    # without a referee the request rate may not match the incumbent's (no baseline): compute is then not judged,
    # which this test is not about (test_unjudged.py); its targets keep such a version serving, flagged
    monkeypatch.setenv("EDGE_AGENT_TARGETS_DIR", str(commit_flagged_targets(tmp_path)))

    a = _agent(
        tmp_path, 3.0, ShadowConfig(requests=20, duration_s=10, min_requests=5), ProbationConfig(referee=referee)
    )
    load = None
    try:
        assert _push(a, "1", tiny_model(1.0)).state.value == "committed"
        load = Load(a.url, "tiny", [body_for("x", np.ones((1, 4), np.float32))], clients=2).start()
        load.wait_requests(100)
        drop(a.state_dir, "2", writer=lambda d: write_package(d, tiny_model(2.0), name="tiny", version="2"))
        _wait_probation(a, "2")
        codes = {}
        for what, (body, headers) in HOSTILE.items():
            for _ in range(3):
                codes[what] = send(a.url, "/v2/models/tiny/infer", body, headers)[0]
        ended = wait_for(lambda: _ended(a, "2"), 120, "version 2 decided")
    finally:
        if load:
            load.stop()
        a.stop()
    assert codes["binary NaN/Inf"] == 200, codes  # NaN in, NaN out: the request's doing, not the version's
    # a bare NaN token is not JSON (strict JSON in, docs/serving.md): refused before the model runs
    assert all(400 <= codes[w] < 500 for w in ("json NaN", "lone surrogate", "wrong shape", "malformed")), codes
    assert ended.state.value == "committed", ended.reason
    assert ended.data["probation"]["request_caused"] >= 3 and ended.data["probation"]["nonfinite"] == 0
    assert load.errors == []


def test_a_first_deployment_under_a_warm_up_burst_commits(tmp_path):
    """The issue's case: a burst of 2 clients against a fresh first deployment must not roll it back (there is
    nothing to roll back to); it is judged on its compute time against its qualified figures."""
    from agent.samples import tiny_model

    a = _agent(tmp_path, 3.0, ShadowConfig())
    load = None
    try:
        drop(a.state_dir, "1", writer=lambda d: write_package(d, tiny_model(1.0), name="tiny", version="1"))
        _wait_probation(a, "1")
        load = Load(a.url, "tiny", [body_for("x", np.ones((1, 4), np.float32))], clients=2).start()
        dep = wait_for(lambda: _ended(a, "1"), 120, "version 1 decided")
    finally:
        if load:
            load.stop()
        a.stop()
    assert dep.state.value == "committed", dep.reason
    fig = dep.data["probation"]
    assert fig["requests"] > 0, fig
    if (dep.data.get("selected") or {}).get("contended"):  # measured while this machine was busy: no baseline
        assert fig["baseline"]["source"] is None and "contended" in fig["baseline"]["why"], fig
    else:
        assert fig["baseline"]["source"] == "qualified", fig
    assert dep.data["shadow"]["verdict"] == "skipped" and "first deployment" in dep.data["shadow"]["reason"]
    assert load.errors == []


def test_stop_then_start_skips_the_shadow_with_the_reason(tmp_path):
    from agent.samples import tiny_model

    a = make_agent(tmp_path, probation_s=1.0, swap="stop-then-start", shadow=ShadowConfig(), start=True)
    try:
        assert _push(a, "1", tiny_model(1.0)).state.value == "committed"
        assert send(a.url, "/v2/models/tiny/infer", body_for("x", np.ones((1, 4), np.float32)))[0] == 200
        dep = _push(a, "2", tiny_model(2.0))
        status = a.status()
    finally:
        a.stop()
    assert dep.state.value == "committed", dep.reason
    shown = status["deployments"]["tiny"]["shadow"]
    assert shown["verdict"] == "skipped" and "stop-then-start" in shown["reason"], shown
