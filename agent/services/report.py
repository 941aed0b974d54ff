"""Reporter: what the lifecycle reports, passed on: a log event each, the link's event topic, the status document.

Transitions come from the orchestrator (its listener), rejections from the deployment source (desired state
refused before the lifecycle saw it). A transient failure being retried is kept (`retrying`, for status) until
the deployment moves on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.services import Emit, Publish

RETRY_KEYS = ("deployment_id", "version", "attempt", "wait_s", "reason", "ts")


class Reporter:
    def __init__(self, emit: Emit, write_status: Callable[[], Any], publish_event: Publish | None = None):
        """`write_status`: rewrite and publish the status document; `publish_event`: the link's event topic (None:
        no link)."""
        self.emit, self.write_status, self.publish_event = emit, write_status, publish_event
        self.retrying: dict[str, dict[str, Any]] = {}  # model -> last transient failure being retried
        self._dirty = False  # a rejection changed the status document: written once per loop turn

    def on_transition(self, record: dict[str, Any]) -> None:
        self.emit({"event": "progress" if "progress" in record else "transition", **record})
        if record.get("progress") == "retry":  # a transient failure being retried: status keeps the reason
            self.retrying[record["model"]] = {k: record.get(k) for k in RETRY_KEYS}
            self.write_status()
            return
        if "progress" in record:
            return
        model = record.get("model")
        if model is not None:
            self.retrying.pop(model, None)
        if self.publish_event is not None:
            self.publish_event(record)
        self.write_status()

    def on_rejected(self, record: dict[str, Any]) -> None:
        """A desired state refused before the lifecycle saw it: logged, and in status from the next tick on (the
        source publishes the event itself and keeps the record)."""
        self.emit({"event": "rejected", **record})
        self._dirty = True

    def tick(self) -> None:
        if self._dirty:
            self._dirty = False
            self.write_status()
