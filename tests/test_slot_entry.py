"""The slot entry is a frozen SlotEntry stored under the JSON keys slots.json has always had: a state directory
written before the class existed loads, restores and serves unchanged, and a key this version does not know
is kept as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.agent import make_agent
from support.daemon import deploy

from agent.errors import LifecycleError
from agent.lifecycle.slots import ENTRY_KEYS, ModelSlots, SlotEntry

# slots.json's entry keys as the daemon wrote them before SlotEntry (lifecycle/parts.py ENTRY_KEYS, then "ts")
WRITTEN_BEFORE = (
    "version",
    "sha256",
    "model_sha256",
    "provider",
    "precision",
    "requested_precision",
    "options",
    "device",
    "cache_dir",
    "versions",
    "package_dir",
    "model_path",
    "latency_ms",
    "deployment_id",
    "variant",
    "input_specs",
    "contended",
    "requalified",
    "memory_peak_bytes",
    "session_s",
    "optimization",
)


def _old_entry(version: str, sha: str, **values) -> dict:
    """An entry as the daemon wrote it before SlotEntry: every key present, null where unset, and ts."""
    return {**dict.fromkeys(WRITTEN_BEFORE), "version": version, "sha256": sha, "provider": "cpu", **values}


def test_the_entry_keys_are_the_ones_written_before():
    assert ENTRY_KEYS == WRITTEN_BEFORE


def test_an_entry_written_before_reads_and_writes_back_unchanged(tmp_path):
    doc = {
        "committed": {**_old_entry("2", "2" * 64, latency_ms=1.5, options={"threads": 1}), "ts": 1700000000.5},
        "previous": {**_old_entry("1", "1" * 64, variant="fp16", future_key={"kept": True}), "ts": 1690000000.0},
    }
    path = tmp_path / "models" / "m" / "slots.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    slots = ModelSlots(tmp_path)
    got = slots.get("m")
    assert got["committed"] is not None and got["previous"] is not None
    assert (got["committed"].version, got["committed"].latency_ms, got["committed"].ts) == ("2", 1.5, 1700000000.5)
    assert got["previous"].variant == "fp16" and got["previous"].extra == {"future_key": {"kept": True}}
    assert {k: e.to_data() for k, e in got.items() if e is not None} == doc
    slots.swap("m")  # rewritten through SlotEntry: the same keys and values, in the other slots
    after = json.loads(path.read_text())
    assert (after["committed"], after["previous"]) == (doc["previous"], doc["committed"])


def test_an_entry_without_its_version_is_a_corrupt_slots_file(tmp_path):
    path = tmp_path / "models" / "m" / "slots.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"committed": {"sha256": "a" * 64, "provider": "cpu"}, "previous": None}))
    with pytest.raises(LifecycleError, match="corrupt slots file: slot entry lacks version"):
        ModelSlots(tmp_path).get("m")


def test_a_state_dir_written_before_restores_and_serves(tmp_path):
    a = make_agent(tmp_path, serve_http=False, known_providers=["cpu"], start=True)
    try:
        assert deploy(a, "1").state.value == "committed"
    finally:
        a.stop()
    state = tmp_path / "state"
    path = state / "models" / "tiny" / "slots.json"
    written = json.loads(path.read_text())["committed"]
    old = {  # the committed entry rewritten literally as the daemon wrote it before SlotEntry
        **_old_entry(written["version"], written["sha256"]),
        **{k: written[k] for k in ("model_sha256", "package_dir", "model_path", "deployment_id", "latency_ms")},
        "ts": written["ts"],
    }
    path.write_text(json.dumps({"committed": old, "previous": None}))
    b = make_agent(tmp_path, serve_http=False, known_providers=["cpu"], start=True)
    try:
        version, out = b.registry.infer("tiny", {"x": np.zeros((1, 4), np.float32)})
        assert (str(version), [float(v) for v in next(iter(out.values())).ravel()]) == ("1", [1.0] * 4)
        assert b.status()["models"]["tiny"]["version"] == "1"
        assert b.steps.slots.committed("tiny") == SlotEntry.from_data(old)
    finally:
        b.stop()
