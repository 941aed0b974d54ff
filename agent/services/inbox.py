"""InboxScanner: each loop turn, complete state_dir/inbox/<model>/<version>/ packages become deployments."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent.services import Emit

if TYPE_CHECKING:
    from agent.lifecycle.orchestrator import Orchestrator
    from agent.sources.inbox import InboxSource


class InboxScanner:
    """Submits what the inbox holds and no in-flight deployment claims yet (the InboxSource decides what counts)."""

    def __init__(self, inbox: str | Path | None, orchestrator: Orchestrator, source: InboxSource, emit: Emit):
        self.inbox = Path(inbox) if inbox is not None else None
        self.orchestrator, self.source, self.emit = orchestrator, source, emit

    def tick(self) -> None:
        if self.inbox is None or not self.inbox.is_dir():  # local mode, or an inbox set explicitly beside mqtt
            return
        with self.orchestrator.exclusive():
            claimed = {d.source.get("path") for d in self.orchestrator.journal.in_flight()}
            self.source.scan(self.inbox, claimed, self.orchestrator.submit, self._warn)

    def _warn(self, path: str, reason: str) -> None:
        self.emit({"event": "warning", "path": path, "reason": reason})
