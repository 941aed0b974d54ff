"""Reports: every transition and progress record of the lifecycle, handed to the listeners on one thread, in order."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

Listener = Callable[[dict[str, Any]], None]


class Reports:
    """Listeners run on one reporter thread, in order, never under the orchestrator's lock; the thread ends when
    idle and starts again with the next record."""

    def __init__(self, listeners: list[Listener]) -> None:
        self.listeners = listeners  # the orchestrator's list (callers may add to it)
        self._reports: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reports_lock = threading.Lock()
        self._reporter: threading.Thread | None = None

    def publish(self, record: dict[str, Any]) -> None:
        with self._reports_lock:
            self._reports.put(record)
            if self._reporter is None or not self._reporter.is_alive():
                self._reporter = threading.Thread(target=self._report_loop, name="lifecycle-reports", daemon=True)
                self._reporter.start()

    def _report_loop(self) -> None:
        while True:
            try:
                record = self._reports.get(timeout=5.0)
            except queue.Empty:
                with self._reports_lock:
                    if self._reports.empty():
                        self._reporter = None
                        return
                continue
            for listener in list(self.listeners):
                try:
                    listener(record)
                except Exception:  # noqa: BLE001 - a broken reporter must not stop a deployment
                    pass
            self._reports.task_done()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every record so far has reached the listeners."""
        end = time.monotonic() + timeout
        while self._reports.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
