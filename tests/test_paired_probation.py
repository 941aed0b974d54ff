"""Paired timing during probation (issue 36), DeviceAgent in-process over real HTTP with real ONNX Runtime
sessions: a version with twice the compute is rolled back naming the paired ratio (the incumbent and it timed back
to back on copies of live requests, with A/A pairs for the noise floor); a version of equal compute commits. The
paired block is in the journal, the decision record and the status, with the host's conditions."""

from __future__ import annotations

import json

import numpy as np
import pytest
from probation_load import Load, body_for
from probation_models import chain_depth, chain_model
from support.agent import make_agent
from support.daemon import drop
from support.wait import wait_for

from agent.lifecycle.status_doc import figures_brief
from agent.samples import write_package
from agent.trial.settings import ProbationConfig, ShadowConfig

KEYS = {"ratio", "ci", "pairs", "aa", "conditions", "verdict", "reason"}
CONDITIONS = {"psi_cpu_some_avg10", "psi_memory_some_avg10", "cpu_mhz", "note"}


def _push(a, version: str, model):
    drop(a.state_dir, version, writer=lambda d: write_package(d, model, name="tiny", version=version))

    def ended():
        done = [d for d in a.orchestrator.journal.all() if d.version == version and d.terminal]
        return done[-1] if done else None

    return wait_for(ended, 240, f"deployment of version {version}")


def _trial(tmp_path, redundant: bool):
    """Version 1, one client, then version 2 (twice the compute when `redundant`): (deployment, status, errors)."""
    shadow = ShadowConfig(requests=10, duration_s=10, min_requests=5, max_latency_ratio=100.0)
    # paired_share 0.5: enough pairs within the short window on a shared CI host (the default is 0.1)
    probation = ProbationConfig(extend=6.0, paired_share=0.5)
    a = make_agent(tmp_path, probation_s=3.0, shadow=shadow, probation=probation, start=True)
    load = None
    try:
        depth = chain_depth(tmp_path, 1.0)
        assert _push(a, "1", chain_model(depth=depth, bias=1.0)).state.value == "committed"
        x = np.random.default_rng(1).standard_normal((1, 1024)).astype(np.float32)
        load = Load(a.url, "tiny", [body_for("x", x)], clients=1).start()
        load.wait_requests(50)
        dep = _push(a, "2", chain_model(depth=depth, redundant=redundant, bias=1.0))
        load.wait_requests(10)
        status = a.status()
    finally:
        if load:
            load.stop()
        a.stop()
    return a, dep, status, load.errors


def _paired_block(a, dep, status) -> dict:
    paired = dep.data["probation"]["paired"]
    shadow = dep.data["shadow"]  # the shadow phase's pairs: reported there, carried into probation
    assert shadow["verdict"] == "skipped" or set(shadow["paired"]) == KEYS, shadow
    assert set(paired) == KEYS and set(paired["conditions"]) == CONDITIONS, paired
    assert set(paired["aa"]) == {"ratio", "ci", "pairs"} and len(paired["ci"]) == 2
    decision = json.loads((a.state_dir / "decisions" / f"{dep.id}.json").read_bytes())
    assert decision["probation"]["paired"]["verdict"] == paired["verdict"]
    shown = status["deployments"]["tiny"]["probation"]["paired"]
    assert shown["verdict"] == paired["verdict"]
    assert "paired x" in figures_brief(status["deployments"]["tiny"]) and "A/A" in figures_brief(
        status["deployments"]["tiny"]
    )
    return paired


@pytest.mark.alone
def test_twice_the_compute_is_rolled_back_naming_the_paired_ratio(tmp_path):
    a, dep, status, errors = _trial(tmp_path, redundant=True)
    paired = _paired_block(a, dep, status)
    assert errors == []
    if paired["verdict"] == "not judged":  # the host never let the pairs separate: said with the counts
        assert dep.data["probation"]["not_judged"]["signal"] == "paired", dep.data["probation"]
        assert dep.state.value != "rolled_back" or "not judged" in (dep.reason or ""), dep.reason
        return
    assert paired["verdict"] == "slower", paired
    assert dep.state.value == "rolled_back" and "paired compute ratio" in dep.reason, dep.reason
    assert paired["ci"][0] > 1.5 and paired["ratio"] > 1.6 and paired["pairs"] >= 16
    assert paired["aa"]["pairs"] >= 8 and paired["ci"][0] > paired["aa"]["ci"][1]


@pytest.mark.alone
def test_equal_compute_commits_with_the_paired_ratio(tmp_path):
    a, dep, status, errors = _trial(tmp_path, redundant=False)
    paired = _paired_block(a, dep, status)
    assert errors == []
    assert dep.state.value == "committed", dep.reason
    assert paired["verdict"] in ("not slower", "not judged"), paired
    if paired["verdict"] == "not slower":
        assert paired["ratio"] < 1.5 and "below the line" in paired["reason"], paired
