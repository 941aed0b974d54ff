"""The HardwareProfile data model: what this device is. JSON keys are pinned (issue 2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CpuInfo:
    vendor: str | None = None
    model: str | None = None
    cores: int | None = None  # logical CPUs
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Board:
    vendor: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class Accelerator:
    kind: str  # gpu | npu | dsp | tpu
    vendor: str  # lower case: nvidia, intel, qualcomm, hailo, google, amd, apple, ...
    name: str
    device: str | None = None  # device node or sysfs path


@dataclass(frozen=True)
class HardwareProfile:
    arch: str | None = None  # x86_64 | aarch64
    os: str | None = None  # e.g. "Debian GNU/Linux 12 (bookworm)" or "macOS 14.5"
    cpu: CpuInfo = field(default_factory=CpuInfo)
    memory_bytes: int | None = None
    board: Board | None = None
    soc: str | None = None
    accelerators: tuple[Accelerator, ...] = ()
    software: dict[str, Any] = field(default_factory=dict)  # e.g. {"l4t": "36.4.3", "jetpack": "6.2"}
    throttling: dict[str, Any] | None = None
    target: str | None = None  # best-matching targets/*.yaml name
    notes: tuple[str, ...] = ()

    def has_accelerator(self, kind: str | None = None, vendor: str | None = None) -> bool:
        return any(
            (kind is None or a.kind == kind) and (vendor is None or a.vendor == vendor) for a in self.accelerators
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpu"]["flags"] = list(self.cpu.flags)
        d["accelerators"] = [asdict(a) for a in self.accelerators]
        d["notes"] = list(self.notes)
        return d
