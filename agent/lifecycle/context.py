"""What a lifecycle stage and a deployment source are handed: cancellation, a deadline and progress, and the
errors that stop a step (Cancelled, DeadlineExceeded, Rejected)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.errors import EdgeAgentError


class Cancelled(EdgeAgentError):
    """The step was cancelled (operator, rollback or a newer deployment); `event` says which."""

    def __init__(self, event: str, reason: str):
        super().__init__(reason)
        self.event = event


class DeadlineExceeded(EdgeAgentError):
    """The state's deadline passed."""


class Rejected(EdgeAgentError):
    """A manifest or package refused before any byte is downloaded."""


@dataclass
class StepContext:
    """Handed to every action: cancellation, deadline and progress for one state of one deployment."""

    deadline: float | None  # time.monotonic() value
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_event: str = "cancel"
    cancel_reason: str = "cancelled"
    progress: Callable[..., None] | None = None

    def check(self) -> None:
        """Raise Cancelled / DeadlineExceeded when the step must stop."""
        if self.cancel.is_set():
            raise Cancelled(self.cancel_event, self.cancel_reason)
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineExceeded("deadline passed")

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def report(self, event: str, **fields: Any) -> None:
        if self.progress is not None:
            self.progress(event, **fields)
