"""The provider contract: probe (never raises) and open_session (a real runtime session).

Every provider module (one per file) defines one subclass of Provider. Providers never import
qualify or serving; qualify and serving only talk to providers through this contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from agent.hardware.profile import HardwareProfile


@dataclass(frozen=True)
class ProbeResult:
    """Is this provider usable here? `reason` says why (or why not), `remedy` how to fix."""

    name: str
    available: bool
    reason: str
    remedy: str | None = None
    devices: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    preferred: bool = True  # False: listed after the target's own preference order (ranking.rank)
    opened: bool | None = None  # True: a session opened on it here (agent.providers.opened); None: not tried
    expected: bool = False  # from a capture's profile: what that device would offer, not opened here

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["devices"] = list(self.devices)
        return d


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: float32, float16, int64, uint8, bool, ...
    shape: tuple[Any, ...]  # ints for static dims, str or None for dynamic ones


@dataclass(frozen=True)
class Assignment:
    """Where the graph's nodes landed. coverage = nodes_on_provider / nodes_total (None: not measured, and
    `method` then starts with 'not measured: ' and says why)."""

    nodes_total: int | None
    nodes_on_provider: int | None
    fallback_ops: tuple[str, ...] = ()  # op types that ran elsewhere (e.g. on ORT CPU)
    method: str = ""  # how it was measured: "ort-graph-assignment", "ort-profiling", "openvino-query-model+runtime-graph on CPU: ...", ...
    devices: tuple[str, ...] = ()  # e.g. OpenVINO EXECUTION_DEVICES
    per_device: dict[str, int] = field(default_factory=dict)  # nodes each device took, where measured

    @property
    def coverage(self) -> float | None:
        if not self.nodes_total or self.nodes_on_provider is None:
            return None
        return self.nodes_on_provider / self.nodes_total

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fallback_ops"] = list(self.fallback_ops)
        d["devices"] = list(self.devices)
        d["coverage"] = self.coverage
        return d


class ProviderSession(ABC):
    """A loaded model on one provider. `run` is safe to call from several threads."""

    provider: str
    precision: str | None
    device: str | None
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    compile_s: float  # session creation / compile wall time

    @abstractmethod
    def run(self, feeds: dict[str, "np.ndarray"], output_names: list[str] | None = None) -> dict[str, "np.ndarray"]:
        """Run inference; returns outputs by name."""

    def run_into(self, feeds: dict[str, "np.ndarray"], into: dict[str, "np.ndarray"]) -> dict[str, "np.ndarray"]:
        """Run with each output named in `into` written into that array (C-contiguous, the model's static shape
        and dtype: a shared-memory window, say); returns `into`. This default runs, then copies; a runtime that
        can write outputs into caller memory overrides it."""
        import numpy as np

        from agent.errors import ProviderError

        out = self.run(feeds, list(into))
        for name, dest in into.items():
            value = out[name]
            if value.shape != dest.shape or value.dtype.kind != dest.dtype.kind:
                raise ProviderError(
                    f"{self.provider}: output {name!r} came out {value.dtype}{list(value.shape)}, "
                    f"not the declared {dest.dtype}{list(dest.shape)}"
                )
            np.copyto(dest, value, casting="equiv")
        return into

    @abstractmethod
    def assignment(self) -> Assignment:
        """Where the nodes ran (measured, not assumed)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release native resources."""


class Provider(ABC):
    """One execution provider. Construction is cheap and imports no runtime."""

    name: str = ""
    runtime: str = ""  # "onnxruntime" | "openvino"

    @abstractmethod
    def probe(self, profile: "HardwareProfile", options: dict[str, Any] | None = None) -> ProbeResult:
        """Hardware (from the profile) + installed runtime -> availability. Never raises; takes seconds at most."""

    @abstractmethod
    def open_session(
        self,
        model_path: str | Path,
        *,
        options: dict[str, Any] | None = None,
        precision: str | None = None,
        device: str | None = None,
        cache_dir: str | Path | None = None,
    ) -> ProviderSession:
        """Create a real session. Raises ProviderError with the runtime's reason on failure."""

    def precisions(self, profile: "HardwareProfile") -> list[str | None]:
        """Precision variants worth qualifying (None = runtime default). OpenVINO on bf16 CPUs: [None, 'f32']."""
        return [None]
