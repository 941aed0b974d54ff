"""An OpenVINO GenAI model's LLMPipeline, lent to one generation at a time (ovgenai.py: one LLMPipeline runs one
generate at a time)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Pipelines:
    """The model's LLMPipeline, lent to one generation at a time, first come first served: a live request waits
    behind those before it, never behind a trial's runs that came after it (the pair thread borrows it again
    right after each run, and a polled condition let it win every time: a client's request waited out a whole
    probation)."""

    def __init__(self, pipe: Any) -> None:
        self._idle = [pipe]
        self._line: deque[object] = deque()
        self._cv = threading.Condition()

    @contextmanager
    def borrow(self, cancel: threading.Event | None = None) -> Iterator[Any]:
        """The pipeline once free and this borrower first in line; None when `cancel` was set while waiting."""
        me = object()
        with self._cv:
            self._line.append(me)
            try:
                while not (self._idle and self._line[0] is me) and not (cancel is not None and cancel.is_set()):
                    self._cv.wait(0.05)
                gone = cancel is not None and cancel.is_set()
                pipe = self._idle.pop() if self._idle and self._line[0] is me and not gone else None
            finally:
                self._line.remove(me)
                self._cv.notify_all()
        try:
            yield pipe
        finally:
            if pipe is not None:
                with self._cv:
                    self._idle.append(pipe)
                    self._cv.notify_all()
