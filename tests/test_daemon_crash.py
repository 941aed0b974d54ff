"""SIGKILL the daemon right after it journals each lifecycle state; a restart must serve a verified model
with a consistent journal, every time (the Done-when of issue 5)."""

from __future__ import annotations

import shutil

import pytest
from support.daemon import RESTART_OUTCOME, Daemon, drop, infer, wait_for, write_config

from agent.lifecycle.fsck import check_state_dir
from agent.lifecycle.journal import Journal
from agent.lifecycle.slots import ModelSlots

EXPECT = RESTART_OUTCOME  # state journaled when the daemon dies -> version serving after restart, end state


@pytest.fixture(scope="module")
def committed_v1(tmp_path_factory):
    """A state_dir where version 1 of `tiny` went through the whole lifecycle."""
    base = tmp_path_factory.mktemp("base")
    cfg = write_config(base)
    d = Daemon(cfg, base / "state")
    try:
        d.wait_ready()
        drop(base / "state", "1")
        assert d.wait_deployment("1")["result"] == "committed", d.tail()
        assert infer(d.url) == ("1", [1.0] * 4)
    finally:
        assert d.terminate() == 0, d.tail()
    return base / "state"


def _copy_case(src_state, tmp_path):
    cfg = write_config(tmp_path)
    shutil.copytree(src_state, tmp_path / "state")
    (tmp_path / "state" / "status.json").unlink()
    return cfg, tmp_path / "state"


@pytest.mark.parametrize("state", list(EXPECT))
def test_sigkill_in_every_state_recovers(committed_v1, tmp_path, state):
    cfg, state_dir = _copy_case(committed_v1, tmp_path)
    crashing = Daemon(cfg, state_dir, env={"EDGE_AGENT_TEST_CRASH_AT": state})
    crashing.wait_ready()
    drop(state_dir, "2")
    assert crashing.proc.wait(120) == -9, crashing.tail()  # died by SIGKILL at the hook
    died_in = [d for d in Journal(state_dir).all() if d.version == "2"]
    assert len(died_in) == 1 and died_in[0].state.value == state

    version, end = EXPECT[state]
    d = Daemon(cfg, state_dir)
    try:
        dep = d.wait_deployment("2")
        assert dep["state"] == end, d.tail()
        if end == "rolled_back":
            assert f"during {state}" in dep["reason"]
        assert infer(d.url) == (version, [float(version)] * 4)
        doc = d.status()
        assert doc["models"]["tiny"]["version"] == version and doc["models"]["tiny"]["state"] == "committed"
        assert ModelSlots(state_dir).committed("tiny").version == version
        assert Journal(state_dir).in_flight() == []
        assert check_state_dir(state_dir) == []
        assert not (state_dir / "inbox" / "tiny" / "2").exists()  # consumed, whatever state it died in
    finally:
        assert d.terminate() == 0, d.tail()
    assert check_state_dir(state_dir) == []


def test_sigkill_after_a_failed_deployment_keeps_the_old_model(committed_v1, tmp_path):
    cfg, state_dir = _copy_case(committed_v1, tmp_path)
    crashing = Daemon(cfg, state_dir, env={"EDGE_AGENT_TEST_CRASH_AT": "failed"})
    crashing.wait_ready()
    drop(state_dir, "2", writer=lambda p: (p.mkdir(parents=True), (p / "model.onnx").write_bytes(b"not onnx")))
    assert crashing.proc.wait(120) == -9, crashing.tail()
    d = Daemon(cfg, state_dir)
    try:
        d.wait_ready()
        assert infer(d.url) == ("1", [1.0] * 4)
        dep = wait_for(lambda: (d.status() or {}).get("deployments", {}).get("tiny"), what="status")
        assert dep["state"] == "failed" and "verifying" in dep["reason"]
        assert check_state_dir(state_dir) == []
    finally:
        assert d.terminate() == 0, d.tail()


def test_sigkill_right_after_a_rollback_during_probation(committed_v1, tmp_path):
    import subprocess

    from support.daemon import EXE, ROOT

    cfg, state_dir = _copy_case(committed_v1, tmp_path)
    crashing = Daemon(cfg, state_dir, env={"EDGE_AGENT_TEST_CRASH_AT": "rolled_back", "EDGE_AGENT_PROBATION_S": "300"})
    crashing.wait_ready()
    drop(state_dir, "2")
    wait_for(
        lambda: (crashing.status() or {}).get("models", {}).get("tiny", {}).get("state") == "probation",
        120,
        "version 2 in probation",
        crashing.proc,
    )
    assert infer(crashing.url) == ("2", [2.0] * 4)
    out = subprocess.run(
        EXE + ["rollback", "tiny", "--config", str(cfg), "--timeout", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0  # the daemon died (hook) before it could answer
    assert crashing.proc.wait(60) == -9, crashing.tail()
    d = Daemon(cfg, state_dir)
    try:
        d.wait_ready()
        assert infer(d.url) == ("1", [1.0] * 4)
        dep = next(x for x in Journal(state_dir).all() if x.version == "2")
        assert dep.state.value == "rolled_back" and "rollback requested" in dep.reason
        assert check_state_dir(state_dir) == []
    finally:
        assert d.terminate() == 0, d.tail()
