"""Qualification rows and the decision record (the pinned `qualify --json` document)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("passed", "failed", "unavailable", "error")


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
    rss_growth_mb: float | None = None
    cache_dir: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    wall_s: float | None = None
    emulated: str | None = None  # measured under an emulator (qemu-user): latency is labelled, never compared

    @property
    def key(self) -> str:
        """`provider[@device][:precision]`: device and precision only when explicitly requested."""
        key = f"{self.provider}@{self.requested_device}" if self.requested_device else self.provider
        return f"{key}:{self.requested_precision}" if self.requested_precision else key

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
    emulated: str | None = None

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
            "reason": self.reason,
            "losers": self.losers,
            "noise_rule": self.noise_rule,
            "reference": self.reference,
            "inputs": self.inputs,
            "versions": self.versions,
            "hardware": self.hardware,
            "timestamp": self.timestamp,
            "emulated": self.emulated,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        fields_ = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "results"}
        return cls(results=[Row.from_dict(r) for r in d.get("results", [])], **fields_)
