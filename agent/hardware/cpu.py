"""CPU and memory: /proc/cpuinfo (x86 and Arm formats) and /proc/meminfo, and the arch they imply."""

from __future__ import annotations

import re
from collections import Counter

from agent.hardware.profile import CpuInfo
from agent.hardware.sysroot import Sysroot

X86_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon", "CentaurHauls": "Centaur"}
ARM_IMPLEMENTERS = {0x41: "ARM", 0x4E: "NVIDIA", 0x51: "Qualcomm", 0x61: "Apple", 0x48: "HiSilicon", 0xC0: "Ampere"}
ARM_PARTS = {
    (0x41, 0xD03): "Cortex-A53",
    (0x41, 0xD04): "Cortex-A35",
    (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD08): "Cortex-A72",
    (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD42): "Cortex-A78AE",
    (0x41, 0xD44): "Cortex-X1",
    (0x41, 0xD46): "Cortex-A510",
    (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4B): "Cortex-A78C",
    (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD80): "Cortex-A520",
    (0x41, 0xD81): "Cortex-A720",
    (0x41, 0xD82): "Cortex-X4",
    (0x4E, 0x004): "Carmel",
    (0x4E, 0x003): "Denver 2",
    (0x51, 0x800): "Kryo 2xx Gold",
    (0x51, 0x801): "Kryo 2xx Silver",
    (0x51, 0x802): "Kryo 3xx Gold",
    (0x51, 0x803): "Kryo 3xx Silver",
    (0x51, 0x804): "Kryo 4xx Gold",
    (0x51, 0x805): "Kryo 4xx Silver",
    (0x51, 0x001): "Oryon",
}
ARM64_MARKERS = {"asimd", "fp", "aes", "crc32", "atomics"}


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """Split cpuinfo into blocks of key -> value (keys lower case). A trailing board block is kept too."""
    blocks: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            cur[key.strip().lower()] = value.strip()
    if cur:
        blocks.append(cur)
    return blocks


def read_cpu(sr: Sysroot) -> tuple[CpuInfo, str | None, dict[str, str]]:
    """(CpuInfo, arch, extra cpuinfo fields like revision/hardware/model) from /proc/cpuinfo."""
    text = sr.read_text("proc/cpuinfo", what="expected /proc/cpuinfo text")
    blocks = parse_cpuinfo(text) if text else []
    procs = [b for b in blocks if "processor" in b and b["processor"].isdigit()]
    extra = {k: v for b in blocks for k, v in b.items() if k in ("revision", "hardware", "model", "serial")}
    if text is not None and not procs:
        sr.note("/proc/cpuinfo: no 'processor' entries found; cpu fields unknown")
    if not procs:
        return CpuInfo(), None, extra
    first = procs[0]
    flags = _flags(procs)
    if "vendor_id" in first or "flags" in first:  # x86; Arm kernels say "Features" and "CPU implementer"
        cpu = CpuInfo(
            vendor=X86_VENDORS.get(first.get("vendor_id", ""), first.get("vendor_id") or None),
            model=_squash(first.get("model name")),
            cores=len(procs),
            flags=flags,
        )
        return cpu, _x86_arch(sr, flags), extra
    vendor, model = _arm_identity(procs)
    return CpuInfo(vendor=vendor, model=model, cores=len(procs), flags=flags), _arm_arch(sr, first, flags), extra


def _flags(procs: list[dict[str, str]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for p in procs:
        for f in (p.get("flags") or p.get("features") or "").split():
            seen.setdefault(f, None)
    return tuple(seen)


def _squash(s: str | None) -> str | None:
    return re.sub(r"\s+", " ", s).strip() or None if s else None


def _x86_arch(sr: Sysroot, flags: tuple[str, ...]) -> str | None:
    if "lm" in flags:
        return "x86_64"
    if flags:
        sr.note("cpu: x86 CPU without the 'lm' flag (32-bit); only x86_64 and aarch64 are supported")
        return None
    sr.note("cpu: x86 cpuinfo without flags; arch unknown")
    return None


def _arm_arch(sr: Sysroot, first: dict[str, str], flags: tuple[str, ...]) -> str | None:
    arch = first.get("cpu architecture", "")
    if arch == "8" or arch.startswith("AArch64") or ARM64_MARKERS & set(flags) and "neon" not in flags:
        return "aarch64"
    if arch == "7" or "neon" in flags:
        sr.note("cpu: 32-bit Arm (armv7) userspace or CPU; only x86_64 and aarch64 are supported")
        return None
    sr.note("cpu: could not tell the architecture from /proc/cpuinfo")
    return None


def _int(s: str | None) -> int | None:
    try:
        return int(s, 0) if s else None
    except ValueError:
        return None


def _arm_identity(procs: list[dict[str, str]]) -> tuple[str | None, str | None]:
    cores: Counter[str] = Counter()
    vendor = None
    for p in procs:
        impl, part = _int(p.get("cpu implementer")), _int(p.get("cpu part"))
        if impl is None:
            continue
        vendor = vendor or ARM_IMPLEMENTERS.get(impl, f"implementer 0x{impl:02x}")
        cores[ARM_PARTS.get((impl, part or 0), f"part 0x{part or 0:03x}")] += 1
    if not cores:
        return vendor, _squash(procs[0].get("model name"))
    if len(cores) == 1:
        return vendor, next(iter(cores))
    return vendor, " + ".join(f"{n}x {name}" for name, n in sorted(cores.items(), key=lambda kv: (-kv[1], kv[0])))


def read_memory(sr: Sysroot) -> int | None:
    """MemTotal from /proc/meminfo in bytes, or None."""
    text = sr.read_text("proc/meminfo", what="expected /proc/meminfo text")
    if text is None:
        return None
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.M)
    if not m:
        sr.note("/proc/meminfo: no MemTotal line; memory unknown")
        return None
    return int(m.group(1)) * 1024
