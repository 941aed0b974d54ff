"""StatusWriter: the status document written to state_dir/status.json and published (link, systemd status line).

A full disk degrades: serving goes on, `disk_full` says why in status and health, and clears (with an event)
once status.json can be written again; it never stops the daemon. After close() nothing more is written (the
state_dir may belong to a successor already).
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.lifecycle.status_doc import status_path
from agent.services import Emit, Publish
from agent.util.atomic import atomic_write_json


class StatusWriter:
    def __init__(
        self,
        state_dir: str | Path,
        document: Callable[[], dict[str, Any]],
        emit: Emit,
        *,
        publish: Publish | None = None,
        notify: Callable[[], None] | None = None,
    ):
        """`document`: builds the status document (it may read `disk_full`); `publish`: the link's; `notify`:
        the service manager's status line."""
        self.state_dir = Path(state_dir)
        self.document, self.emit, self.publish, self.notify = document, emit, publish, notify
        self.disk_full: str | None = None  # why state files cannot be written (ENOSPC); reported, never fatal
        self._lock = threading.Lock()
        self._closed = False

    def write(self) -> dict[str, Any]:
        with self._lock:
            doc = self.document()
            if self._closed:
                return doc
            self._write_file(doc)
            if self.publish is not None:
                self.publish(doc)
            if self.notify is not None:
                self.notify()
            return doc

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _write_file(self, doc: dict[str, Any]) -> None:
        path = status_path(self.state_dir)
        try:
            atomic_write_json(path, doc, mode=0o600)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            first = self.disk_full is None
            self.disk_full = f"{self.state_dir}: {exc.strerror} (status.json not written; serving goes on)"
            doc["disk_full"] = self.disk_full
            if first:
                self.emit({"event": "warning", "reason": self.disk_full, "disk_full": True})
            return
        if self.disk_full is not None:
            self.disk_full = None
            doc.pop("disk_full", None)
            atomic_write_json(path, doc, mode=0o600)
            self.emit({"event": "disk_ok", "reason": "status.json written again"})
