"""macOS: sysctl keys (live, or captured in ROOT/.captures/sysctl.txt) -> profile fields, Rosetta aware."""

from __future__ import annotations

import subprocess
from typing import Any

from agent.hardware.profile import Accelerator, Board, CpuInfo
from agent.hardware.sysroot import Sysroot

SYSCTL_CAPTURE = ".captures/sysctl.txt"
SYSCTL_KEYS = (
    "machdep.cpu.brand_string",
    "hw.ncpu",
    "hw.logicalcpu",
    "hw.memsize",
    "hw.model",
    "hw.optional.arm64",
    "hw.optional.x86_64",
    "sysctl.proc_translated",
    "kern.osproductversion",
    "kern.osrelease",
    "hw.optional.neon",
    "hw.optional.arm.FEAT_FP16",
    "hw.optional.arm.FEAT_DotProd",
    "hw.optional.arm.FEAT_I8MM",
    "hw.optional.arm.FEAT_BF16",
    "hw.optional.arm.FEAT_SME",
    "hw.cpufamily",
    "hw.targettype",
)
# hw.cpufamily (CPUFAMILY_ARM_* in <mach/machine.h>) names the chip when a capture lacks machdep.cpu.brand_string
# (`sysctl hw` prints the hw subtree only). Only codes published beside a real `sysctl hw` are named (apple-m3-max's
# source in agent/sysroots/README.md prints the M3 Max's and, as a difference, the M2's; the M1's is
# CPUFAMILY_ARM_FIRESTORM_ICESTORM of <mach/machine.h>); M1 and M2 variants share one code each, M3 chips one each.
APPLE_CPUFAMILY = {
    0x1B588BB3: "Apple M1-series",  # FIRESTORM_ICESTORM
    0xDA33D83D: "Apple M2-series",  # AVALANCHE_BLIZZARD: J413 (-634136515, the M2 -> M3 difference in that source)
    0x72015832: "Apple M3 Max",  # PALMA: apple-m3-max (J516c)
}


def parse_sysctl(text: str) -> dict[str, str]:
    """Parse `sysctl -a` output ('key: value' or 'key = value' lines) into a dict."""
    out = {}
    for line in text.splitlines():
        for sep in (": ", " = "):
            if sep in line:
                key, value = line.split(sep, 1)
                if key and " " not in key.strip():
                    out[key.strip()] = value.strip()
                break
    return out


def read_sysctl(sr: Sysroot, use_host_tools: bool) -> dict[str, str] | None:
    """sysctl values from the capture file, else (live Mac only) from running `sysctl`; None if neither."""
    if sr.exists(SYSCTL_CAPTURE):
        text = sr.read_text(SYSCTL_CAPTURE, what="expected `sysctl -a` output")
        values = parse_sysctl(text) if text else {}
        if text is not None and not values:
            sr.note(f"/{SYSCTL_CAPTURE}: no 'key: value' lines; macOS fields unknown")
        return values or None
    if not use_host_tools:
        return None
    try:
        res = subprocess.run(["sysctl", *SYSCTL_KEYS], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        sr.note(f"sysctl could not run ({exc}); macOS fields unknown")
        return None
    return parse_sysctl(res.stdout) or None


def _int(values: dict[str, str], key: str) -> int | None:
    try:
        return int(values[key])
    except (KeyError, ValueError):
        return None


def chip_name(values: dict[str, str]) -> str | None:
    """machdep.cpu.brand_string, else the chip hw.cpufamily names (signed or unsigned, as sysctl prints it)."""
    brand = values.get("machdep.cpu.brand_string") or None
    family = _int(values, "hw.cpufamily")
    if brand or family is None:
        return brand
    family &= 0xFFFFFFFF
    return APPLE_CPUFAMILY.get(family, f"Apple (hw.cpufamily 0x{family:08x})")


def macos_fields(sr: Sysroot, values: dict[str, str]) -> dict[str, Any]:
    """Keyword fields for HardwareProfile from sysctl values (a full `sysctl -a` or the `sysctl hw` subtree)."""
    arm64 = _int(values, "hw.optional.arm64") == 1
    brand = chip_name(values) if arm64 else values.get("machdep.cpu.brand_string") or None
    apple = arm64 or bool(brand and brand.startswith("Apple"))
    translated = _int(values, "sysctl.proc_translated") == 1
    if apple:
        arch = "aarch64"
    elif _int(values, "hw.optional.x86_64") == 1 or (brand and "Intel" in brand):
        arch = "x86_64"
    else:
        arch = None
        sr.note("sysctl: neither hw.optional.arm64 nor an Intel CPU; arch unknown")
    if translated:
        sr.note(
            "this process runs under Rosetta 2 (sysctl.proc_translated=1): the machine is Apple Silicon but "
            "Python is x86_64, so Core ML and arm64 wheels are unusable; install an arm64 Python"
        )
    flags = tuple(k.rsplit(".", 1)[1] for k in SYSCTL_KEYS if k.startswith("hw.optional.") and _int(values, k) == 1)
    cpu = CpuInfo(
        vendor="Apple" if apple else ("Intel" if brand and "Intel" in brand else None),
        model=brand,
        cores=_int(values, "hw.logicalcpu") or _int(values, "hw.ncpu"),
        flags=flags,
    )
    version = values.get("kern.osproductversion")
    software: dict[str, Any] = {"rosetta": translated}
    if version:
        software["macos"] = version
    accels = []
    if apple:
        accels = [
            Accelerator(kind="gpu", vendor="apple", name=f"{brand or 'Apple'} GPU", device=None),
            Accelerator(kind="npu", vendor="apple", name="Apple Neural Engine", device=None),
        ]
    return {
        "arch": arch,
        "os": f"macOS {version}" if version else "macOS",
        "cpu": cpu,
        "memory_bytes": _int(values, "hw.memsize"),
        # hw.model (Mac14,2) is not printed by `sysctl hw`; hw.targettype (J413, the board id) is
        "board": Board(vendor="Apple", model=values.get("hw.model") or values.get("hw.targettype") or None),
        "soc": brand if apple else None,
        "accelerators": tuple(accels),
        "software": software,
    }
