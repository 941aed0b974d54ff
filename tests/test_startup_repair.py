"""Start-up verifies what it serves: a replaced or truncated unpacked model is re-unpacked from its intact blob, a
deleted blob leaves the verified unpacked copy serving, damage beyond repair falls back to the previous version,
a truncated slots.json is named and rebuilt from the journal; each with the reason in the log and in status."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.agent import make_agent
from support.daemon import deploy

from agent.lifecycle.fsck import check_state_dir
from agent.lifecycle.slots import ModelSlots
from agent.lifecycle.status_doc import build_status


def _start(tmp_path, events):
    return make_agent(tmp_path, on_event=events.append, serve_http=False, known_providers=["cpu"], start=True)


@pytest.fixture
def two_versions(tmp_path):
    """A state_dir with v1 (previous) and v2 (committed) of `tiny`; the agent is stopped."""
    events: list[dict] = []
    a = _start(tmp_path, events)
    try:
        for v in ("1", "2"):
            assert deploy(a, v).state.value == "committed"
    finally:
        a.stop()
    return tmp_path


def _serving(agent) -> tuple[str, list[float]]:
    version, out = agent.registry.infer("tiny", {"x": np.zeros((1, 4), np.float32)})
    return str(version), [float(v) for v in next(iter(out.values())).ravel()]


def _committed(state_dir: Path) -> dict:
    return ModelSlots(state_dir).committed("tiny")


def _restart(tmp_path):
    events: list[dict] = []
    a = _start(tmp_path, events)
    repairs = [e["reason"] for e in events if e.get("event") == "repair"]
    return a, repairs


def test_a_replaced_unpacked_model_is_re_unpacked(two_versions):
    state = two_versions / "state"
    v1, v2 = ModelSlots(state).get("tiny")["previous"], _committed(state)
    model = Path(v2.model_path)
    model.write_bytes(Path(v1.model_path).read_bytes())  # v1's graph under v2's name (same size)
    assert any("replaced" in p for p in check_state_dir(state))  # the state check sees it too
    a, repairs = _restart(two_versions)
    try:
        assert _serving(a) == ("2", [2.0] * 4)
        assert repairs and "model.onnx" in repairs[0] and "re-unpacked" in repairs[0]
        assert "re-unpacked" in a.status()["models"]["tiny"]["repaired"]
        assert check_state_dir(state) == []
    finally:
        a.stop()


def test_a_truncated_unpacked_model_is_re_unpacked(two_versions):
    state = two_versions / "state"
    model = Path(_committed(state).model_path)
    model.write_bytes(model.read_bytes()[:20])
    a, repairs = _restart(two_versions)
    try:
        assert _serving(a) == ("2", [2.0] * 4)
        assert repairs and "truncated" in repairs[0] and str(model) in repairs[0]
    finally:
        a.stop()


def test_a_deleted_blob_leaves_the_verified_copy_serving(two_versions):
    state = two_versions / "state"
    blob = state / "blobs" / "sha256" / _committed(state).sha256
    blob.unlink()
    a, repairs = _restart(two_versions)
    try:
        assert _serving(a) == ("2", [2.0] * 4)
        assert repairs and "missing" in repairs[0] and str(blob) in repairs[0]
        assert "missing" in a.status()["models"]["tiny"]["repaired"]
    finally:
        a.stop()


def test_damage_beyond_repair_falls_back_to_the_previous_version(two_versions):
    state = two_versions / "state"
    c = _committed(state)
    Path(c.model_path).write_bytes(b"\x08")
    (state / "blobs" / "sha256" / c.sha256).unlink()
    a, repairs = _restart(two_versions)
    try:
        assert _serving(a) == ("1", [1.0] * 4)
        assert repairs and "previous version 1" in repairs[-1] and "cannot re-unpack" in repairs[-1]
        assert _committed(state).version == "1"
        assert a.status()["models"]["tiny"]["version"] == "1"
    finally:
        a.stop()


def test_a_truncated_slots_json_is_named_and_rebuilt_from_the_journal(two_versions):
    state = two_versions / "state"
    slots = state / "models" / "tiny" / "slots.json"
    slots.write_bytes(slots.read_bytes()[:30])
    problems = check_state_dir(state)
    assert any(str(slots) in p for p in problems), problems
    doc = build_status(state, device_id="dev-1")
    assert doc["models"]["tiny"]["state"] == "corrupt" and str(slots) in doc["models"]["tiny"]["reason"]
    a, repairs = _restart(two_versions)
    try:
        assert _serving(a) == ("2", [2.0] * 4)
        assert repairs and str(slots) in repairs[0] and "rebuilt from the journal" in repairs[0]
        rebuilt = json.loads(slots.read_bytes())
        assert rebuilt["committed"]["version"] == "2" and rebuilt["previous"]["version"] == "1"
        assert list(slots.parent.glob("slots.json.corrupt-*"))
        assert check_state_dir(state) == []
    finally:
        a.stop()
