"""Hardware discovery: detect(root) -> HardwareProfile, by pure reads under a root directory."""
from agent.hardware.profile import Accelerator, Board, CpuInfo, HardwareProfile

__all__ = ["Accelerator", "Board", "CpuInfo", "HardwareProfile", "detect"]


def detect(root="/", *, use_host_tools: bool | None = None) -> HardwareProfile:
    """Read the hardware profile under `root` (default '/'); never raises. See agent.hardware.detect."""
    from agent.hardware.detect import detect as _detect

    return _detect(root, use_host_tools=use_host_tools)
