"""DeviceAgent in-process, local inbox mode: bad packages fail and the old model keeps serving; probation
trouble rolls back; newer versions supersede; cancel and rollback; several agents in one process."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
from support.agent import make_agent
from support.daemon import deploy, drop, infer, running_agent, wait_for, write_config

from agent.config import load_config
from agent.errors import LifecycleError
from agent.lifecycle.fsck import check_state_dir
from agent.samples import write_package


@pytest.fixture
def agent(tmp_path):
    yield from running_agent(tmp_path)


def _rewrite(pb_name: str, array: np.ndarray, version: str):
    from onnx import numpy_helper

    from agent.samples import sample_tiny_package

    def writer(d):
        sample_tiny_package(d, version=version)
        (d / "test_data_set_0" / pb_name).write_bytes(
            numpy_helper.from_array(array, "x" if pb_name.startswith("input") else "y").SerializeToString()
        )

    return writer


BAD = {
    "broken-onnx": (lambda d: (d.mkdir(parents=True), (d / "model.onnx").write_bytes(b"\x08garbage")), "verifying"),
    "golden-shape": (_rewrite("input_0.pb", np.zeros((1, 3), np.float32), "2"), "qualifying"),
    "accuracy": (_rewrite("output_0.pb", np.full((1, 4), 42.0, np.float32), "2"), "qualifying"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_package_fails_and_the_old_model_keeps_serving(agent, case):
    assert deploy(agent, "1").state.value == "committed"
    writer, where = BAD[case]
    dep = deploy(agent, "2", writer)
    assert dep.state.value == "failed", dep.reason
    assert dep.reason.startswith(where)
    assert infer(agent.url) == ("1", [1.0] * 4)
    assert agent.status()["models"]["tiny"]["version"] == "1"
    assert agent.steps.slots.committed("tiny").version == "1"
    assert check_state_dir(agent.state_dir) == []


def test_probation_trouble_rolls_back_with_the_reason(tmp_path):
    from onnx import TensorProto, helper

    a = make_agent(tmp_path, start=True)
    try:
        drop(a.state_dir, "1")
        wait_for(lambda: a.registry.models().get("tiny") == "1" and not a.orchestrator.in_flight(), 120, "v1")
        a.steps.config = replace(a.steps.config, probation_s=120)  # long enough that only trouble can end it
        graph = helper.make_graph(
            [helper.make_node("Sqrt", ["x"], ["y"])],
            "sqrt",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        drop(
            a.state_dir,
            "2",
            writer=lambda d: write_package(
                d, model, name="tiny", version="2", feeds={"x": np.full((1, 4), 4.0, np.float32)}
            ),
        )
        wait_for(lambda: a.status()["models"]["tiny"]["state"] == "probation", 120, "v2 in probation")
        assert a.status()["models"]["tiny"]["version"] == "2"
        assert infer(a.url, 4.0) == ("2", [2.0] * 4)
        infer(a.url, -1.0)  # sqrt(-1): NaN in the response -> probation trouble
        dep = wait_for(
            lambda: next((d for d in a.orchestrator.journal.all() if d.version == "2" and d.terminal), None),
            60,
            "rollback",
        )
        assert dep.state.value == "rolled_back" and "NaN" in dep.reason
        wait_for(lambda: a.registry.models().get("tiny") == "1", 60, "v1 back")  # journaled first, then swapped
        assert infer(a.url) == ("1", [1.0] * 4)
        assert a.steps.slots.get("tiny")["previous"] is None  # the failed version never became a slot
    finally:
        a.stop()


def test_newer_version_supersedes_and_rollback_is_instant(agent):
    assert deploy(agent, "1").state.value == "committed"
    drop(agent.state_dir, "2")
    drop(agent.state_dir, "3")  # same scan: 3 supersedes 2, whatever state 2 reached
    dep3 = wait_for(
        lambda: next((d for d in agent.orchestrator.journal.all() if d.version == "3" and d.terminal), None), 120, "v3"
    )
    dep2 = next(d for d in agent.orchestrator.journal.all() if d.version == "2")
    assert dep3.state.value == "committed", dep3.reason
    assert dep2.state.value in ("failed", "rolled_back") and "superseded by version 3" in dep2.reason
    assert infer(agent.url) == ("3", [3.0] * 4)
    rb = agent.orchestrator.rollback("tiny", wait=60)
    assert rb.state.value == "committed" and rb.version == "1" and rb.source["kind"] == "rollback"
    assert infer(agent.url) == ("1", [1.0] * 4)
    slots = agent.steps.slots.get("tiny")
    assert (slots["committed"].version, slots["previous"].version) == ("1", "3")
    assert check_state_dir(agent.state_dir) == []


def test_cancel_in_flight_and_rollback_without_previous(agent):
    with pytest.raises(LifecycleError, match="no previous version"):
        agent.orchestrator.rollback("tiny")
    seen = threading.Event()

    def cancel_when_qualifying(rec):
        if rec.get("state") == "qualifying" and "progress" not in rec and not seen.is_set():
            seen.set()
            agent.orchestrator.cancel("tiny", "cancelled by test")

    agent.orchestrator.listeners.append(cancel_when_qualifying)
    dep = deploy(agent, "1")
    assert dep.state.value == "failed" and dep.reason == "cancelled by test"
    assert agent.registry.models() == {}
    assert check_state_dir(agent.state_dir) == []


def test_two_agents_in_one_process(tmp_path):
    agents = [make_agent(tmp_path / f"d{i}", extra={"device_id": f"dev-{i}"}, start=True) for i in range(2)]
    try:
        assert agents[0].url != agents[1].url
        for i, a in enumerate(agents):
            drop(a.state_dir, str(i + 1))
        for i, a in enumerate(agents):
            wait_for(
                lambda a=a, v=str(i + 1): a.registry.models().get("tiny") == v and not a.orchestrator.in_flight(),
                120,
                "both agents",
            )
            assert infer(a.url) == (str(i + 1), [float(i + 1)] * 4)
        with pytest.raises(LifecycleError, match="in use by another edge-agent"):
            make_agent(None, config=agents[0].config, start=True)
    finally:
        for a in agents:
            a.stop()


def test_a_state_past_its_deadline_fails_and_nothing_changes(tmp_path):
    a = make_agent(tmp_path, deadlines={"qualifying": 0.01}, start=True)
    try:
        drop(a.state_dir, "1")
        dep = wait_for(lambda: next((d for d in a.orchestrator.journal.all() if d.terminal), None), 120, "end")
        assert dep.state.value == "failed" and "qualifying exceeded its deadline" in dep.reason
        assert a.registry.models() == {} and a.steps.slots.names() == []
        assert not list((a.state_dir / "tmp").iterdir())
    finally:
        a.stop()


def test_restart_serves_committed_and_degrades_to_cpu_when_its_provider_is_gone(tmp_path):
    from agent.util.atomic import atomic_write_json, read_json

    cfg = load_config(write_config(tmp_path))
    a = make_agent(None, config=cfg, start=True)
    try:
        drop(a.state_dir, "1")
        wait_for(lambda: a.registry.models().get("tiny") == "1" and not a.orchestrator.in_flight(), 120, "v1")
    finally:
        a.stop()
    slots_file = a.state_dir / "models" / "tiny" / "slots.json"
    slots = read_json(slots_file)
    slots["committed"]["provider"] = "tensorrt"  # e.g. the driver went away after an OS update
    atomic_write_json(slots_file, slots)
    b = make_agent(None, config=cfg, start=True)
    try:
        assert infer(b.url) == ("1", [1.0] * 4)
        info = b.status()["models"]["tiny"]
        assert info["provider"] == "cpu" and info["reason"].startswith("degraded: ")
        assert "tensorrt" in info["reason"]
    finally:
        b.stop()


def test_stop_then_start_swap(tmp_path):
    a = make_agent(tmp_path, swap="stop-then-start", start=True)
    try:
        for v in ("1", "2"):
            drop(a.state_dir, v)
            wait_for(lambda v=v: a.registry.models().get("tiny") == v and not a.orchestrator.in_flight(), 120, v)
        assert infer(a.url) == ("2", [2.0] * 4)
        assert a.orchestrator.rollback("tiny", wait=60).state.value == "committed"
        assert infer(a.url) == ("1", [1.0] * 4)
    finally:
        a.stop()


def test_rollbacks_under_concurrent_load_fail_no_request(agent):
    for v in ("1", "2"):
        assert deploy(agent, v).state.value == "committed"
    stop, failures, seen = threading.Event(), [], []

    def client():
        while not stop.is_set():
            try:
                version, data = infer(agent.url)
                if data != [float(version)] * 4:  # the answer must come from the version it names
                    failures.append(f"version {version} answered {data}")
                seen.append(version)
            except Exception as exc:  # noqa: BLE001 - every failure counts
                failures.append(repr(exc))

    clients = [threading.Thread(target=client) for _ in range(4)]
    for t in clients:
        t.start()
    try:
        for _ in range(6):
            before = len(seen)
            dep = agent.orchestrator.rollback("tiny", wait=60)
            assert dep.state.value == "committed"
            wait_for(lambda b=before: len(seen) > b + 20, 60, "requests after a swap")
    finally:
        stop.set()
        for t in clients:
            t.join(60)
    assert failures == []
    assert {"1", "2"} <= set(seen)


def test_control_requests_malformed_or_stale_are_answered_not_executed(agent):
    from agent.util.atomic import atomic_write_json, read_json

    ctl = agent.state_dir / "control"
    atomic_write_json(ctl / "1-old.req.json", {"op": "rollback", "model": "tiny", "ts": 1.0})
    (ctl / "2-bad.req.json").write_text("{not json")
    atomic_write_json(ctl / "3-op.req.json", {"op": "format-disk", "model": "tiny", "ts": 9e9})
    answers = wait_for(
        lambda: (
            all((ctl / f"{i}.done.json").exists() for i in ("1-old", "2-bad", "3-op"))
            and [read_json(ctl / f"{i}.done.json") for i in ("1-old", "2-bad", "3-op")]
        ),
        30,
        "answers",
    )
    assert [a["ok"] for a in answers] == [False, False, False]
    assert "not executed" in answers[0]["error"] and "malformed" in answers[1]["error"]
    assert agent.orchestrator.journal.all() == []
