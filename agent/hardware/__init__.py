"""Hardware discovery: detect(root) -> HardwareProfile, by pure reads under a root directory."""

import os

from agent.hardware import detect as _detect_module  # loaded now so the name below stays the function
from agent.hardware.profile import Accelerator, Board, CpuInfo, HardwareProfile

__all__ = ["Accelerator", "Board", "CpuInfo", "HardwareProfile", "detect"]


def detect(root: str | os.PathLike[str] = "/", *, use_host_tools: bool | None = None) -> HardwareProfile:
    """Read the hardware profile under `root` (default '/'); never raises. See agent.hardware.detect."""
    return _detect_module.detect(root, use_host_tools=use_host_tools)
