"""Device tree (model, compatible) and Raspberry Pi revision-code decoding."""

from __future__ import annotations

from dataclasses import dataclass

from agent.hardware.sysroot import Sysroot

DT_VENDORS = {
    "raspberrypi": "Raspberry Pi",
    "nvidia": "NVIDIA",
    "qcom": "Qualcomm",
    "rockchip": "Rockchip",
    "amlogic": "Amlogic",
    "fsl": "NXP",
    "nxp": "NXP",
    "ti": "Texas Instruments",
    "mediatek": "MediaTek",
    "allwinner": "Allwinner",
    "radxa": "Radxa",
    "hardkernel": "Hardkernel",
    "thundercomm": "Thundercomm",
}
PI_MEMORY = {0: 256 << 20, 1: 512 << 20, 2: 1 << 30, 3: 2 << 30, 4: 4 << 30, 5: 8 << 30, 6: 16 << 30}
PI_SOC = {0: "BCM2835", 1: "BCM2836", 2: "BCM2837", 3: "BCM2711", 4: "BCM2712"}
PI_TYPE = {
    0x00: "A",
    0x01: "B",
    0x02: "A+",
    0x03: "B+",
    0x04: "2B",
    0x06: "CM1",
    0x08: "3B",
    0x09: "Zero",
    0x0A: "CM3",
    0x0C: "Zero W",
    0x0D: "3B+",
    0x0E: "3A+",
    0x10: "CM3+",
    0x11: "4B",
    0x12: "Zero 2 W",
    0x13: "400",
    0x14: "CM4",
    0x15: "CM4S",
    0x17: "5",
    0x18: "CM5",
    0x19: "500",
    0x1A: "CM5 Lite",
}
PI_MAKER = {0: "Sony UK", 1: "Egoman", 2: "Embest", 3: "Sony Japan", 4: "Embest", 5: "Stadium"}


@dataclass(frozen=True)
class DeviceTree:
    model: str | None = None
    compatible: tuple[str, ...] = ()

    @property
    def vendor(self) -> str | None:
        for entry in self.compatible:
            prefix = entry.split(",", 1)[0]
            if "," in entry and prefix in DT_VENDORS:
                return DT_VENDORS[prefix]
        return self.compatible[0].split(",", 1)[0] if self.compatible and "," in self.compatible[0] else None

    def has(self, *substrings: str) -> bool:
        return any(s in c for c in self.compatible for s in substrings)

    def chip(self, vendor_prefix: str) -> str | None:
        """The last compatible entry for a vendor, e.g. 'tegra234' for 'nvidia' (SoC entries come last)."""
        hits = [c.split(",", 1)[1] for c in self.compatible if c.startswith(vendor_prefix + ",")]
        return hits[-1] if hits else None


def read_device_tree(sr: Sysroot) -> DeviceTree:
    """/proc/device-tree/{model,compatible} (or /sys/firmware/devicetree/base), bytes ending in NUL."""
    for base in ("proc/device-tree", "sys/firmware/devicetree/base"):
        model_b = sr.read_bytes(f"{base}/model")
        compat = sr.read_strings(f"{base}/compatible") if sr.exists(f"{base}/compatible") else None
        if model_b is None and compat is None:
            continue
        model = sr.read_text(f"{base}/model", what="expected a NUL-terminated model string") if model_b else None
        return DeviceTree(model=model, compatible=tuple(compat or ()))
    return DeviceTree()


@dataclass(frozen=True)
class PiRevision:
    code: str
    model: str
    soc: str
    memory_bytes: int
    manufacturer: str | None
    revision: str


def decode_pi_revision(code: str) -> PiRevision | None:
    """Decode a new-style Raspberry Pi revision code (bit 23 set), e.g. 'd04170' -> Pi 5, 8 GB."""
    try:
        value = int(code, 16)
    except (TypeError, ValueError):
        return None
    if not value & (1 << 23):
        return None
    mem, maker = (value >> 20) & 0x7, (value >> 16) & 0xF
    soc, kind, rev = (value >> 12) & 0xF, (value >> 4) & 0xFF, value & 0xF
    if mem not in PI_MEMORY or soc not in PI_SOC or kind not in PI_TYPE:
        return None
    return PiRevision(
        code=code.lower(),
        model=f"Raspberry Pi {PI_TYPE[kind]}",
        soc=PI_SOC[soc],
        memory_bytes=PI_MEMORY[mem],
        manufacturer=PI_MAKER.get(maker),
        revision=f"1.{rev}",
    )
