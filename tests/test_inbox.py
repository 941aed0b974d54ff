"""Local inbox mode: only renamed-in <name>/<version>/ directories with safe names become deployments."""

from __future__ import annotations

import pytest
from support.daemon import deploy, running_agent, wait_for


@pytest.fixture
def agent(tmp_path):
    yield from running_agent(tmp_path)


def test_inbox_ignores_bad_names_and_hidden_dirs(agent):
    inbox = agent.state_dir / "inbox"
    (inbox / "bad name" / "1").mkdir(parents=True)
    (inbox / ".staging" / "1").mkdir(parents=True)
    (inbox / "tiny").mkdir(parents=True)
    (inbox / "tiny" / "README").write_text("not a version directory")
    wait_for(lambda: any(e.get("event") == "warning" for e in agent.events), 30, "warning")
    assert "must match" in next(e["reason"] for e in agent.events if e.get("event") == "warning")
    assert agent.orchestrator.journal.all() == []
    assert deploy(agent, "1").state.value == "committed"
    assert not (inbox / "tiny" / "1").exists()  # consumed once it is safe in the store


def test_a_package_without_a_model_fails_and_is_consumed(agent):
    dep = deploy(agent, "1", writer=lambda d: (d.mkdir(parents=True), (d / "notes.txt").write_text("oops")))
    assert dep.state.value == "failed" and "has no model.onnx" in dep.reason
    assert dep.reason.startswith("downloading")
    wait_for(lambda: not (agent.state_dir / "inbox" / "tiny" / "1").exists(), 30, "inbox entry consumed")
    assert agent.status()["deployments"]["tiny"]["result"] == "failed"
