"""wait_for: poll a predicate until it is truthy (its value is returned) or the timeout fails the test."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], timeout: float = 120.0, what: str = "condition", proc: Any = None, step: float = 0.05
) -> T:
    """`proc`: a subprocess whose exit ends the wait early (a daemon that died will not get there)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"daemon exited ({proc.returncode}) while waiting for {what}")
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
