"""Retry a transient step failure with exponential backoff and jitter until a deadline, keeping each reason."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from agent.errors import LifecycleError
from agent.lifecycle.context import Cancelled, DeadlineExceeded, StepContext

T = TypeVar("T")


class RetriesExhausted(LifecycleError):
    """A transient failure outlasted its retries; the same desired state may be tried again later."""

    retryable = True


BASE_S, CAP_S = 1.0, 30.0


def backoff(attempt: int, base: float = BASE_S, cap: float = CAP_S, rng: random.Random | None = None) -> float:
    """Seconds before retry `attempt` (1, 2, ...): min(cap, base * 2**(attempt-1)), jittered to 50-100 %."""
    raw = min(cap, base * (2 ** max(0, attempt - 1)))
    return float(raw * (0.5 + 0.5 * (rng or random).random()))


def retry_transient(
    fn: Callable[[], T],
    ctx: StepContext,
    *,
    transient: Callable[[BaseException], bool],
    until: float | None,
    what: str,
    base: float = BASE_S,
    cap: float = CAP_S,
) -> T:
    """Call fn() until it returns. A transient failure is reported (progress "retry" with the reason, attempt and
    wait) and retried after a backoff, while wall-clock time stays before `until` (e.g. the manifest's expiry)
    and the step's own deadline/cancel allow (ctx.check()); the last reason is raised when time is up. A
    non-transient failure is raised at once."""
    attempt = 0
    while True:
        ctx.check()
        try:
            return fn()
        except (Cancelled, DeadlineExceeded):
            raise
        except Exception as exc:  # noqa: BLE001 - classified below
            if not transient(exc):
                raise
            attempt += 1
            wait = backoff(attempt, base, cap)
            left = None if until is None else until - time.time()
            step_left = ctx.remaining()
            if (left is not None and left <= wait) or (step_left is not None and step_left <= wait):
                raise RetriesExhausted(f"{exc} (gave up after {attempt} attempt(s): deadline reached)") from exc
            ctx.report("retry", what=what, attempt=attempt, wait_s=round(wait, 2), reason=str(exc)[:500])
            _sleep(ctx, wait)


def _sleep(ctx: StepContext, seconds: float) -> None:
    """Sleep in small slices so a cancel or supersede is honoured at once."""
    end = time.monotonic() + seconds
    while True:
        ctx.check()
        left = end - time.monotonic()
        if left <= 0:
            return
        ctx.cancel.wait(min(0.2, left))
