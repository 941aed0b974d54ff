"""Local inbox mode: only renamed-in <name>/<version>/ directories with safe names become deployments."""
from __future__ import annotations

from test_daemon_support import agent, deploy, wait_for  # noqa: F401


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
