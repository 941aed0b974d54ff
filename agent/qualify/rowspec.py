"""RowSpec: what one (provider, precision) row's child needs, built by the parent (agent.qualify.rowrunner) and
handed to the row's worker as one pickle (agent.qualify.rowtask.measure_row, agent.qualify.confirm)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ORIGINAL_KEYS = ("path", "file", "sets", "outputs")  # what agent.qualify.original needs of an fp32 original


@dataclass(frozen=True)
class RowSpec:
    """One row's measurement. The session: `model_path` opened on `provider` with `options`, `precision`,
    `device` and the compiled cache `cache_dir`. Accuracy on `feeds` against `reference` within `tolerances`
    (by precision, None: the default), or against `original` ({path, file, sets, outputs, feeds, classifier}:
    an fp32 original, agent.qualify.original); `independent`: onnx's reference evaluator's outputs, compared as
    well when `reference` is golden data this provider made itself (agent.qualify.owngolden). Latency for
    `budget_s` on `latency_feeds` (the declared opt shape; None: `feeds`), then at `min_feeds` and `max_feeds`
    when declared; `sources`: where each point's inputs come from (agent.package.inputs.InputPlan.sources).
    `model_precision`: the graph's own precision; `declared`: the graph's inputs and outputs, which the session
    must match; `memory_max`: what the row may use (bytes); `row_timeout_s`: the parent's deadline for the call,
    which a run at max must fit; `keep`: the worker keeps the warm session for the confirmation round."""

    model_path: str
    provider: str
    options: dict[str, Any]
    precision: str | None
    device: str | None
    cache_dir: str | None
    feeds: dict[str, Any]
    reference: dict[str, Any]
    tolerances: dict[str | None, dict[str, Any]]
    budget_s: float
    batch: int = 1
    latency_feeds: dict[str, Any] | None = None
    max_feeds: dict[str, Any] | None = None
    min_feeds: dict[str, Any] | None = None
    memory_max: int | None = None
    model_precision: str | None = None
    declared: dict[str, Any] | None = None
    original: dict[str, Any] | None = None
    keep: bool = False
    sources: dict[str, str] | None = None
    row_timeout_s: float | None = None
    independent: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # the budgets and the memory limit were checked as QualifyOptions (agent.qualify.options): what is left is
        # what the parent derived for this row
        if not self.provider:
            raise ValueError("a row needs a provider")
        if self.row_timeout_s is not None and not self.row_timeout_s > 0:
            raise ValueError(f"{self.provider}: row_timeout_s must be more than 0, got {self.row_timeout_s!r}")
        missing = [k for k in ORIGINAL_KEYS if self.original is not None and k not in self.original]
        if missing:
            raise ValueError(f"{self.provider}: the fp32 original lacks {', '.join(missing)}")

    @property
    def timed(self) -> dict[str, Any]:
        """The inputs latency is measured on: the declared opt shape, else the accuracy inputs."""
        return self.latency_feeds if self.latency_feeds is not None else self.feeds

    @property
    def session_key(self) -> tuple[str, str, str | None, str | None, str | None]:
        """What a kept session was opened for (agent.qualify.keptsession): file, provider, precision, device, cache."""
        return (self.model_path, self.provider, self.precision, self.device, self.cache_dir)

    def kept(self) -> RowSpec:
        """The same row, its worker keeping the warm session afterwards."""
        return dataclasses.replace(self, keep=True)
