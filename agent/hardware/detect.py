"""detect(root) -> HardwareProfile: composes the per-concern readers; never raises, never reads the host
when root is not '/'. Pure reads: which target a profile matches is agent.targets' business (detect_device)."""

from __future__ import annotations

import dataclasses
import os
import platform
import struct
import sys
from typing import Any

from agent.hardware import cpu as cpu_mod
from agent.hardware.devicetree import DeviceTree, PiRevision, decode_pi_revision, read_device_tree
from agent.hardware.jetson import jetson_accelerators, module_of, read_l4t
from agent.hardware.macos import macos_fields, read_sysctl
from agent.hardware.osinfo import os_name, read_dmi, read_os_release
from agent.hardware.pci import accel_npus, drm_gpus, pci_accelerators
from agent.hardware.profile import Accelerator, Board, HardwareProfile
from agent.hardware.qualcomm import qualcomm_accelerators, read_soc0
from agent.hardware.sysroot import Sysroot
from agent.hardware.thermal import read_throttling

# SoCs that only run 64-bit Arm userspace in practice: lets a capture without cpuinfo still name its arch.
AARCH64_SOCS = (
    "nvidia,tegra194",
    "nvidia,tegra234",
    "nvidia,tegra264",
    "brcm,bcm2712",
    "qcom,qcm6490",
    "qcom,qcs6490",
    "qcom,qcs8550",
    "qcom,sa8775p",
)
HOST_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def detect(root: str | os.PathLike[str] = "/", *, use_host_tools: bool | None = None) -> HardwareProfile:
    """Profile the device whose filesystem is at `root`. Host tools (sysctl) run only when root is '/'."""
    try:
        sr = Sysroot(root)
    except (TypeError, ValueError, OSError) as exc:
        return HardwareProfile(notes=(f"{root!r}: not a usable root directory ({exc})",))
    try:
        if not sr.root.is_dir():
            sr.note(f"{root}: not a directory; nothing could be read")
            return HardwareProfile(notes=tuple(sr.notes))
        host_tools = sr.is_host and (sys.platform == "darwin" if use_host_tools is None else use_host_tools)
        sysctl = read_sysctl(sr, host_tools)
        fields = macos_fields(sr, sysctl) if sysctl else _linux_fields(sr)
        return HardwareProfile(**fields, notes=tuple(sr.notes))
    except Exception as exc:  # noqa: BLE001 - detect() never raises; the note carries the bug report
        sr.note(f"internal error while profiling: {type(exc).__name__}: {exc}")
        return HardwareProfile(notes=tuple(sr.notes))


def _linux_fields(sr: Sysroot) -> dict[str, Any]:
    cpu, arch, extra = cpu_mod.read_cpu(sr)
    memory = cpu_mod.read_memory(sr)
    dt = read_device_tree(sr)
    pi = decode_pi_revision(extra.get("revision", "")) if extra.get("revision") else None
    if pi is None and extra.get("revision") and (dt.has("raspberrypi") or dt.has("brcm,bcm27")):
        sr.note(f"/proc/cpuinfo: Raspberry Pi revision code {extra['revision']!r} not understood")
    arch = arch or _fallback_arch(sr, dt)
    if sr.is_host and struct.calcsize("P") == 4:
        sr.note("this Python is 32-bit: ONNX Runtime and OpenVINO wheels need a 64-bit OS and Python")
    if sr.is_host and cpu.cores is None:
        cpu = dataclasses.replace(cpu, cores=os.cpu_count())
    if memory is None and pi is not None:
        memory = pi.memory_bytes
        sr.note("memory taken from the Raspberry Pi revision code (no MemTotal)")
    software = _software(sr, pi, dt)
    soc0 = read_soc0(sr) if sr.exists("sys/devices/soc0") else {}
    return {
        "arch": arch,
        "os": os_name(read_os_release(sr)),
        "cpu": cpu,
        "memory_bytes": memory,
        "board": _board(sr, dt, pi, extra, software),
        "soc": _soc(dt, pi, soc0),
        "accelerators": _accelerators(sr, dt, software),
        "software": software,
        "throttling": read_throttling(sr),
    }


def _fallback_arch(sr: Sysroot, dt: DeviceTree) -> str | None:
    if dt.has(*AARCH64_SOCS):
        sr.note("arch inferred from the device tree (a 64-bit-only SoC); /proc/cpuinfo did not say")
        return "aarch64"
    if sr.is_host:
        host = HOST_ARCH.get(platform.machine().lower())
        if host:
            sr.note(f"arch taken from the running kernel ({platform.machine()}); /proc/cpuinfo did not say")
        return host
    return None


def _software(sr: Sysroot, pi: PiRevision | None, dt: DeviceTree) -> dict[str, Any]:
    software: dict[str, Any] = dict(read_l4t(sr))
    if dt.compatible:
        software["dt_compatible"] = list(dt.compatible)
    kernel = sr.read_text("proc/sys/kernel/osrelease", what="expected a kernel release string")
    if kernel:
        software["kernel"] = kernel
    module, _ = module_of(dt)
    if module and ("l4t" in software or dt.has("nvidia,tegra")):
        software["jetson_module"] = module
    if pi is not None:
        software["pi_revision"] = pi.code
    return software


def _board(
    sr: Sysroot, dt: DeviceTree, pi: PiRevision | None, extra: dict[str, str], software: dict[str, Any]
) -> Board | None:
    if pi is not None or dt.has("raspberrypi,"):
        model = dt.model or extra.get("model") or (f"{pi.model} Rev {pi.revision}" if pi else None)
        return Board(vendor="Raspberry Pi", model=model)
    if dt.has("nvidia,tegra") or "l4t" in software:
        module, _ = module_of(dt)
        return Board(vendor="NVIDIA", model=dt.model or module)
    if dt.model or dt.compatible:
        return Board(vendor=dt.vendor, model=dt.model)
    vendor, model = read_dmi(sr)
    return Board(vendor=vendor, model=model) if vendor or model else None


def _soc(dt: DeviceTree, pi: PiRevision | None, soc0: dict[str, str]) -> str | None:
    if pi is not None:
        return pi.soc
    for prefix in ("brcm", "nvidia"):
        chip = dt.chip(prefix)
        if chip:
            return chip.upper() if prefix == "brcm" else chip
    if soc0.get("machine"):
        return soc0["machine"]
    qcom = dt.chip("qcom")
    if qcom:
        return qcom.upper()
    last = dt.compatible[-1] if dt.compatible else ""
    return last.split(",", 1)[1] if "," in last else None


def _accelerators(sr: Sysroot, dt: DeviceTree, software: dict[str, Any]) -> tuple[Accelerator, ...]:
    found: list[Accelerator] = []
    if dt.has("nvidia,tegra") or "l4t" in software:
        found += jetson_accelerators(sr, dt)
    found += drm_gpus(sr) + accel_npus(sr) + pci_accelerators(sr) + qualcomm_accelerators(sr)
    seen, out = set(), []
    for acc in found:
        key = (acc.kind, acc.vendor, acc.device)
        if key not in seen:
            seen.add(key)
            out.append(acc)
    return tuple(out)
