"""QualifyOptions: how one qualification measures (agent.qualify.harness.qualify), checked once when built."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import ConfigError

ROW_TIMEOUT_S = 600.0
LATENCY_BUDGET_S = 5.0


@dataclass(frozen=True)
class QualifyOptions:
    """cache_dir: where compiled caches, optimised graphs and computed reference outputs are kept and reused
    (None: nothing is kept). isolate: each row in a child process (False: in this one, for tests). Each row's
    timed runs take about latency_budget_s, and a row's child is cut after row_timeout_s.

    all_precisions (the conformance report): every precision of a provider is measured, not only the default and
    its fallback when the default fails accuracy. memory_max (bytes): what one model may use; each row's worker is
    killed over it and a row whose peak exceeds it fails. deadline_s bounds the whole qualification (the
    conformance models suite gives each model a budget): a row that would start after it is an error at stage
    "budget", rows in flight are cut at it, and there is no confirmation round.

    optimize (True, or kinds from agent.qualify.optimize.KINDS; None: the target's `optimize`): each fp32 graph is
    also measured after those offline optimisations, as variants against the unoptimised graph. keep_sessions (the
    CLI; the daemon passes False): the fastest passing rows' workers keep their sessions for the confirmation round
    instead of opening them again in new workers."""

    cache_dir: str | Path | None = None
    isolate: bool = True
    latency_budget_s: float = LATENCY_BUDGET_S
    row_timeout_s: float = ROW_TIMEOUT_S
    all_precisions: bool = False
    memory_max: int | None = None
    deadline_s: float | None = None
    optimize: bool | tuple[str, ...] | list[str] | None = None
    keep_sessions: bool = True

    def __post_init__(self) -> None:
        from agent.qualify import optimize as opt

        _positive("latency_budget_s", self.latency_budget_s)
        _positive("row_timeout_s", self.row_timeout_s)
        if self.memory_max is not None and (isinstance(self.memory_max, bool) or self.memory_max <= 0):
            raise ConfigError(f"memory_max: must be a number of bytes above 0, got {self.memory_max!r}")
        if self.deadline_s is not None and not (_number(self.deadline_s) and self.deadline_s >= 0):
            raise ConfigError(f"deadline_s: must be 0 s or more, got {self.deadline_s!r}")
        if self.optimize is not None:
            opt.kinds_of(self.optimize)  # its ValueError for an unknown kind, here: before anything is measured

    def kinds(self, target: Any) -> tuple[str, ...]:
        """The offline optimisations to measure: these options', else the target's."""
        from agent.qualify import optimize as opt

        return opt.kinds_of(getattr(target, "optimize", ()) if self.optimize is None else self.optimize)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _positive(what: str, value: Any) -> None:
    if not (_number(value) and value > 0):
        raise ConfigError(f"{what}: must be more than 0 s, got {value!r}")
