"""The service's observer thread: every `alerts.check_s` it evaluates the alert conditions (agent.controlplane
.alerts), offers the raised alerts not yet delivered to the webhook sender, deletes telemetry past its retention
and fills the evidence matrix's rows of decision records stored before it existed. Its own thread: a slow
database or webhook never delays the fleet loop or a page."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from agent.controlplane import alerts, matrix
from agent.controlplane.db import write
from agent.controlplane.obs_tables import Alert
from agent.controlplane.telemetry_intake import prune_all
from agent.controlplane.webhook import WebhookSender

log = logging.getLogger("edge_agent.controlplane")


class AlertMonitor:
    def __init__(self, factory: Any, settings: Any, clock: Callable[[], float] = time.time):
        self.factory, self.settings, self.clock = factory, settings, clock
        self.cfg = settings.alerts
        self.active = 0  # active alerts after the last check (the dashboard's nav count)
        self.error: str | None = None
        self.sender = WebhookSender(self.cfg.webhook, self._delivered) if self.cfg.webhook.url else None
        self._backfilled = False
        self._stop = threading.Event()
        self.checked = threading.Event()  # set after each check (tests wait on it)
        self._thread: threading.Thread | None = None
        # replicas (agent.controlplane.leader): only the lease holder raises alerts, prunes telemetry and sends the
        # webhook; a standby only reads the count for its pages
        self.leading: Callable[[], bool] = lambda: True

    def start(self) -> "AlertMonitor":
        if self.sender is not None:
            self.sender.start()
        self._thread = threading.Thread(target=self._run, name="cp-alerts", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.sender is not None:
            self.sender.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
                self.error = None
            except Exception as exc:  # noqa: BLE001 - the observer must survive one bad turn
                self.error = f"{type(exc).__name__}: {exc}"
                log.exception("alert check failed")
            self.checked.set()
            self._stop.wait(self.cfg.check_s)

    def check(self) -> None:
        if not self.leading():
            with self.factory() as s:
                self.active = alerts.active_count(s)
            return
        now = self.clock()
        with write(self.factory) as s:
            alerts.evaluate(s, now, self.cfg)
            prune_all(s, self.settings.telemetry, now)
            if not self._backfilled:
                self._backfilled = matrix.backfill(s) == 0
        with self.factory() as s:
            self.active = alerts.active_count(s)
            pending = list(
                s.scalars(
                    select(Alert)
                    .where(Alert.send_state == "pending", Alert.cleared_at.is_(None))
                    .order_by(Alert.raised_at)
                    .limit(self.cfg.webhook.queue)
                ).all()
            )
        if self.sender is not None:
            for row in pending:
                if not self.sender.offer(payload(row)):
                    break

    def _delivered(self, key: str, ok: bool, attempts: int, error: str | None) -> None:
        with write(self.factory) as s:
            row = s.get(Alert, key)
            if row is None:
                return
            row.attempts = attempts
            row.send_state = "sent" if ok else "failed"
            row.sent_at = self.clock() if ok else None
            row.send_error = error


def payload(row: Alert) -> dict[str, Any]:
    """The webhook's JSON for one raised alert."""
    return {
        "event": "alert.raised",
        "key": row.key,
        "kind": row.kind,
        "what": alerts.KINDS.get(row.kind, row.kind),
        "subject": row.subject,
        "message": row.message,
        "detail": row.detail,
        "raised_at": row.raised_at,
        "service": "edge-agent control plane",
    }
