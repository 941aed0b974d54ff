"""Runtime drift: a committed model decided under other runtime versions keeps serving, shows as `stale`, is
re-qualified in the background, and falls back to the next passing provider when its own fails now."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.agent import make_agent
from support.daemon import deploy, wait_for

from agent.isolate.runner import FAULT_ENV
from agent.lifecycle.slots import ModelSlots
from agent.package.caches import drift_text, runtime_versions, version_drift


def _agent(tmp_path, providers, events, qualifier=None, isolate=False):
    options = {"latency_budget_s": 0.1, "isolate": isolate}
    return make_agent(
        tmp_path, providers=providers, qualify_options=options, on_event=events.append, qualifier=qualifier
    )


def _age(state_dir, name="tiny", key="onnxruntime", old="0.0.1"):
    """Pretend the committed decision was made under another runtime version."""
    import json

    path = state_dir / "models" / name / "slots.json"
    doc = json.loads(path.read_text())
    doc["committed"]["versions"][key] = old
    path.write_text(json.dumps(doc))


def _requalify(agent):
    deps = [d for d in agent.orchestrator.journal.all() if d.source.get("kind") == "requalify"]
    return deps[-1] if deps and deps[-1].terminal else None


def test_version_drift_names_what_changed():
    now = runtime_versions()
    assert version_drift(dict(now), now) == {}
    drift = version_drift({**now, "onnxruntime": "0.0.1", "something-else": "x"}, now)
    assert drift == {"onnxruntime": ["0.0.1", now["onnxruntime"]]}
    assert drift_text({"openvino": ["2025.1", None]}) == "openvino 2025.1 -> (none)"


def test_a_drifted_model_serves_stale_then_is_requalified(tmp_path):
    events: list[dict] = []
    a = _agent(tmp_path, ["cpu"], events).start()
    try:
        assert deploy(a, "1").state.value == "committed"
    finally:
        a.stop()
    _age(tmp_path / "state")
    gate = threading.Event()

    def held(dep, ctx, measure):
        gate.wait(120)
        return measure()

    b = _agent(tmp_path, ["cpu"], events, qualifier=held).start()
    try:
        doc = b.status()
        tiny = doc["models"]["tiny"]
        assert tiny["state"] == "stale" and "onnxruntime 0.0.1 ->" in tiny["stale"], tiny
        version, out = b.registry.infer("tiny", {"x": np.ones((1, 4), np.float32)})
        assert version == "1" and out  # keeps serving meanwhile
        gate.set()
        dep = wait_for(lambda: _requalify(b), 120, "re-qualification")
        assert dep.state.value == "committed", dep.reason
        tiny = b.status()["models"]["tiny"]
        assert tiny["state"] == "committed" and "stale" not in tiny
        assert tiny["requalified"].startswith("re-qualified after onnxruntime 0.0.1 ->")
        slots = ModelSlots(tmp_path / "state").get("tiny")
        assert slots["committed"].versions["onnxruntime"] == runtime_versions()["onnxruntime"]
    finally:
        gate.set()
        b.stop()


def test_a_requalification_that_fails_on_the_old_provider_falls_back(tmp_path, monkeypatch):
    from agent.hardware import detect
    from agent.providers import get

    if not get("openvino").probe(detect("/"), {}).available:
        pytest.skip("openvino is not available here")
    events: list[dict] = []
    a = _agent(tmp_path, ["openvino"], events, isolate=True).start()
    try:
        first = deploy(a, "1")
        assert first.state.value == "committed", first.reason
        assert ModelSlots(tmp_path / "state").get("tiny")["committed"].provider == "openvino"
    finally:
        a.stop()
    _age(tmp_path / "state", key="openvino", old="2020.1")
    monkeypatch.setenv(FAULT_ENV, "abort:openvino")  # the old provider now crashes in qualification
    b = _agent(tmp_path, ["openvino", "cpu"], events, isolate=True).start()
    try:
        dep = wait_for(lambda: _requalify(b), 240, "re-qualification")
        assert dep.state.value == "committed", dep.reason
        committed = ModelSlots(tmp_path / "state").get("tiny")["committed"]
        assert committed.provider == "cpu"
        note = b.status()["models"]["tiny"]["requalified"]
        assert "openvino 2020.1 ->" in note and "openvino -> cpu" in note and "crashed" in note, note
        assert b.registry.entry("tiny").meta["provider"] == "cpu"
    finally:
        b.stop()


def test_a_failed_requalification_keeps_serving_and_says_why(tmp_path, monkeypatch):
    events: list[dict] = []
    a = _agent(tmp_path, ["cpu"], events, isolate=True).start()
    try:
        assert deploy(a, "1").state.value == "committed"
    finally:
        a.stop()
    _age(tmp_path / "state")
    monkeypatch.setenv(FAULT_ENV, "abort:cpu")
    b = _agent(tmp_path, ["cpu"], events, isolate=True).start()
    try:
        dep = wait_for(lambda: _requalify(b), 240, "re-qualification")
        assert dep.state.value == "failed"
        tiny = b.status()["models"]["tiny"]
        assert tiny["state"] == "stale" and "re-qualification failed" in tiny["stale"], tiny
        assert "still serving the old decision" in tiny["stale"]
        assert b.registry.infer("tiny", {"x": np.ones((1, 4), np.float32)})[0] == "1"
    finally:
        b.stop()
