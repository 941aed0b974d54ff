"""Qualification rows and the decision record (the pinned `qualify --json` document)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Row:
    """One (provider, precision) measurement. status: passed | failed | unavailable | error.

    failed = the provider ran but is unfit (session refused, fallback, out of tolerance); error = the
    measurement itself broke (the child crashed, hung past its deadline, or raised unexpectedly).
    """

    provider: str
    status: str
    reason: str = ""
    precision: str | None = None
    requested_precision: str | None = None
    requested_device: str | None = None  # set when the provider has several devices (OpenVINO CPU/GPU/NPU)
    stage: str | None = None  # where it stopped: probe | compatibility | accuracy | latency | isolation
    options: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    coverage: float | None = None
    assignment: dict[str, Any] | None = None
    unsupported_ops: list[str] = field(default_factory=list)
    accuracy: dict[str, Any] = field(default_factory=dict)
    latency_ms: dict[str, Any] = field(default_factory=dict)
    throughput_ips: float | None = None
    compile_s: float | None = None
    session_s: dict[str, Any] = field(default_factory=dict)  # cold_s / warm_s session creation (coldstart.py)
    rss_growth_mb: float | None = None
    memory_peak_bytes: int | None = None  # peak RSS growth of the session: create, warm-up, timed runs
    latency_max_ms: dict[str, Any] | None = None  # at model.yaml's declared max shape
    # each declared shape point timed (golden, opt, max): inputs, source, p50/p90/p99, runs, stopped or skipped
    latency_points: list[dict[str, Any]] = field(default_factory=list)
    generated_inputs: dict[str, str] = field(default_factory=dict)  # input -> how its timed values were made
    conditions: dict[str, Any] = field(default_factory=dict)  # load, others' CPU share, serving rate, throttling
    contended: bool = False  # measured under contention: never a latency baseline
    assumed_shapes: dict[str, dict[str, int]] = field(default_factory=dict)  # input -> {dim: value} guessed
    cache_dir: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    wall_s: float | None = None
    variant: str | None = None  # model.yaml variants: which one this row measured (None: the only model)
    model_path: str | None = None  # the file measured (the daemon serves exactly this file)
    model_sha256: str | None = None
    model_precision: str | None = None  # the graph's own precision (fp32, fp16, bf16, int8)
    original: dict[str, Any] | None = None  # against the fp32 original: file, p50_ms, speedup
    emulated: str | None = None  # measured under an emulator (qemu-user): latency is labelled, never compared
    optimization: str | None = None  # an offline-optimised graph (agent.qualify.optimize kind), else None
    accuracy_checked: bool | None = None  # False: compared with ORT CPU itself (agent.qualify.reference)
    accuracy_basis: str | None = None  # "own golden (not independent)": golden data it made (qualify.owngolden)

    @property
    def key(self) -> str:
        """`[variant/]provider[@device][:precision]`: variant, device and precision only when they apply."""
        key = f"{self.provider}@{self.requested_device}" if self.requested_device else self.provider
        key = f"{key}:{self.requested_precision}" if self.requested_precision else key
        return f"{self.variant}/{key}" if self.variant else key

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["key"] = self.key
        d["latency_ms"] = {k: v for k, v in (self.latency_ms or {}).items() if k != "samples_ms"}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class Decision:
    model: dict[str, Any]
    results: list[Row]
    selected: str | None
    selected_precision: str | None = None
    selected_key: str | None = None
    reason: str = ""
    losers: dict[str, str] = field(default_factory=dict)
    noise_rule: str = ""
    target: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    reference: str = ""
    inputs: str = ""
    timestamp: float = 0.0
    hardware: dict[str, Any] = field(default_factory=dict)
    selected_variant: str | None = None
    assumed_shapes: dict[str, dict[str, int]] = field(default_factory=dict)  # the daemon refuses these
    memory_max: int | None = None
    emulated: str | None = None
    optimizations: list[dict[str, Any]] = field(default_factory=list)  # optimised graphs built (optimize.build)
    graph: dict[str, Any] = field(default_factory=dict)  # which graph serves and why
    accuracy_checked: bool | None = None  # the selected row's: was its accuracy independently checked?

    def row(self, provider: str) -> Row | None:
        """The row for `provider` (or a `provider:precision` key): the selected one if it won, else the best."""
        rows = [r for r in self.results if provider in (r.provider, r.key)]
        if not rows:
            return None
        for r in rows:
            if r.key == self.selected_key:
                return r
        passed = [r for r in rows if r.status == "passed"]
        return (passed or rows)[0]

    def row_by_key(self, key: str) -> Row | None:
        """Exactly the row `provider[@device][:precision]` (e.g. "openvino:f32"), or None."""
        return next((r for r in self.results if r.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "target": self.target,
            "results": [r.to_dict() for r in self.results],
            "selected": self.selected,
            "selected_precision": self.selected_precision,
            "selected_key": self.selected_key,
            "selected_variant": self.selected_variant,
            "reason": self.reason,
            "losers": self.losers,
            "noise_rule": self.noise_rule,
            "reference": self.reference,
            "inputs": self.inputs,
            "versions": self.versions,
            "hardware": self.hardware,
            "timestamp": self.timestamp,
            "assumed_shapes": self.assumed_shapes,
            "memory_max": self.memory_max,
            "emulated": self.emulated,
            "optimizations": self.optimizations,
            "graph": self.graph,
            "accuracy_checked": self.accuracy_checked,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        fields_ = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "results"}
        return cls(results=[Row.from_dict(r) for r in d.get("results", [])], **fields_)
