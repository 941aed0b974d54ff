"""Paired timing during the trial (issue 36), DeviceAgent in-process (the daemon's own code) over real HTTP with
real ONNX Runtime sessions (tests/paired_trial.py), under each of: nothing else running, two busy loops, and a
memory-bandwidth hog pinned to another core. A version with twice the compute is stopped naming the paired ratio
(the incumbent and it timed back to back on copies of live requests, with A/A pairs for the noise floor): in the
shadow phase where its pairs were enough, else rolled back after probation; only beside the busy loops may the
pairs say "not judged", and then it is not committed (serving.unjudged: rollback). A version of equal compute
commits in all three. The paired block is in the journal, the decision record and the status, with the host's
conditions."""

from __future__ import annotations

import json

import pytest
from paired_trial import LOADS, corunners, daemon_trial, hog_core, paired_of

from agent.lifecycle.status_doc import figures_brief

KEYS = {"ratio", "ci", "pairs", "aa", "conditions", "verdict", "reason"}
CONDITIONS = {"psi_cpu_some_avg10", "psi_memory_some_avg10", "cpu_mhz", "note"}


@pytest.fixture(params=LOADS)
def load(request):
    if request.param == "hog" and hog_core()[0] is None:
        pytest.skip(hog_core()[1])
    with corunners(request.param):
        yield request.param


def _paired_block(a, dep, status) -> dict:
    paired = paired_of(dep)
    shadow = dep.data["shadow"]  # the shadow phase's pairs: reported there, carried into probation
    assert shadow["verdict"] == "skipped" or set(shadow["paired"]) == KEYS, shadow
    assert set(paired) == KEYS and set(paired["conditions"]) == CONDITIONS, paired
    assert set(paired["aa"]) == {"ratio", "ci", "pairs"} and len(paired["ci"]) == 2
    decision = json.loads((a.state_dir / "decisions" / f"{dep.id}.json").read_bytes())
    recorded = decision["probation"] if "probation" in dep.data else decision["shadow"]
    assert recorded["paired"]["verdict"] == paired["verdict"]
    shown = status["deployments"]["tiny"]
    assert paired_of_shown(shown)["verdict"] == paired["verdict"]
    assert "paired x" in figures_brief(shown) and "A/A" in figures_brief(shown)
    return paired


def paired_of_shown(shown: dict) -> dict:
    return (shown.get("probation") or {}).get("paired") or shown["shadow"]["paired"]


@pytest.mark.alone
def test_twice_the_compute_is_stopped_naming_the_paired_ratio(tmp_path, load):
    a, dep, status, errors = daemon_trial(tmp_path, redundant=True)
    paired = _paired_block(a, dep, status)
    assert errors == []
    assert dep.state.value in ("rolled_back", "failed"), (dep.state, dep.reason)  # never committed
    if paired["verdict"] == "not judged" and load == "busy":  # the loops never let the pairs separate: said
        assert "probation" in dep.data and dep.data["probation"]["not_judged"]["signal"] == "paired"
        assert "not judged" in (dep.reason or ""), dep.reason
        return
    assert paired["verdict"] == "slower", (load, paired)
    assert "paired compute ratio" in dep.reason, dep.reason
    if dep.state.value == "failed":  # the shadow's pairs ended the trial before the swap
        assert dep.data["shadow"]["verdict"] == "fail" and dep.data["shadow"]["compute"] == "paired"
    assert paired["ci"][0] > 1.5 and paired["ratio"] > 1.6 and paired["pairs"] >= 16
    assert paired["aa"]["pairs"] >= 8 and paired["ci"][0] > paired["aa"]["ci"][1]


@pytest.mark.alone
def test_equal_compute_commits_with_the_paired_ratio(tmp_path, load):
    a, dep, status, errors = daemon_trial(tmp_path, redundant=False)
    paired = _paired_block(a, dep, status)
    assert errors == []
    assert dep.state.value == "committed", (load, dep.reason)
    assert paired["verdict"] == "not slower", (load, paired)
    assert paired["ratio"] < 1.5 and "below the line" in paired["reason"], paired
    if "probation" in dep.data:  # the served candidate was timed on a twin (serving.probation.paired_twin)
        twin = dep.data["probation"]["paired_runs"]["twin"]
        assert twin["side"] == "candidate" and twin["built"] is True, twin
