"""The host's conditions beside a paired verdict: CPU and memory pressure (PSI) and the CPU frequency, read where
the kernel exposes them, each said "unavailable: why" where it does not. Pairs taken under changing conditions
are kept (pairing cancels slow drift); the verdict records what the conditions were."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

PSI = "/proc/pressure"
FREQ_GLOB = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq"


def psi_some_avg10(path: str) -> tuple[float | None, str | None]:
    """The `some avg10` of a PSI file (% of the last 10 s some task waited), or (None, why)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        return None, f"{path} unavailable: {exc.strerror or type(exc).__name__}"
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    try:
                        return float(value), None
                    except ValueError:
                        break
    return None, f"{path} unavailable: no 'some avg10=' field"


def cpu_mhz(pattern: str = FREQ_GLOB) -> tuple[float | None, str | None]:
    """The mean of the cores' current frequencies (cpufreq scaling_cur_freq, kHz) in MHz, or (None, why)."""
    values = []
    for name in glob.glob(pattern):
        try:
            values.append(int(Path(name).read_text().strip()) / 1000.0)
        except (OSError, ValueError):
            continue
    if not values:
        return None, "cpu frequency unavailable: no cpufreq scaling_cur_freq (virtual machine or no cpufreq driver)"
    return round(sum(values) / len(values), 1), None


def read(root: str = "") -> dict[str, Any]:
    """{"psi_cpu_some_avg10", "psi_memory_some_avg10", "cpu_mhz", "note"}; root: a sysroot prefix (tests)."""
    cpu, why_cpu = psi_some_avg10(f"{root}{PSI}/cpu")
    mem, why_mem = psi_some_avg10(f"{root}{PSI}/memory")
    mhz, why_mhz = cpu_mhz(f"{root}{FREQ_GLOB}")
    said = [w for w in (why_cpu, why_mem, why_mhz) if w]
    note = "read when the verdict was given (PSI avg10: the last 10 s)"
    return {
        "psi_cpu_some_avg10": cpu,
        "psi_memory_some_avg10": mem,
        "cpu_mhz": mhz,
        "note": note + ("; " + "; ".join(said) if said else ""),
    }
