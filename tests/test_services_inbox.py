"""InboxScanner (agent.services.inbox) on a real tmp state_dir and a real (unstarted) Orchestrator: no inbox is a
no-op; an entry whose names are not valid model/version names is warned about once and never submitted."""

from __future__ import annotations

from agent.artifacts.store import ContentStore
from agent.lifecycle.orchestrator import Orchestrator
from agent.lifecycle.steps import Steps
from agent.services.inbox import InboxScanner
from agent.serving.registry import ModelRegistry
from agent.sources.inbox import InboxSource


def test_bad_names_are_warned_about_once_and_nothing_is_submitted(tmp_path):
    registry = ModelRegistry()
    steps = Steps(tmp_path, ContentStore(tmp_path, file_mode=0o600), registry)
    steps.add_source(InboxSource(steps.store, steps.staging))
    orchestrator = Orchestrator(tmp_path, steps)
    events: list[dict] = []
    try:
        InboxScanner(None, orchestrator, steps.sources["inbox"], events.append).tick()  # no inbox configured
        inbox = tmp_path / "inbox"
        scanner = InboxScanner(inbox, orchestrator, steps.sources["inbox"], events.append)
        scanner.tick()  # configured, not there yet
        (inbox / "bad name" / "1").mkdir(parents=True)
        (inbox / ".hidden" / "1").mkdir(parents=True)
        scanner.tick()
        scanner.tick()
        assert [e["path"] for e in events] == [str(inbox / "bad name" / "1")]
        assert events[0]["event"] == "warning" and "must match" in events[0]["reason"]
        assert orchestrator.journal.all() == []
    finally:
        orchestrator.stop(timeout=5)
        registry.close(1)
