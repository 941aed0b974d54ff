"""NVIDIA Jetson: /etc/nv_tegra_release (L4T -> JetPack), module identity, devfreq GPU and DLA cores."""

from __future__ import annotations

import re

from agent.hardware.devicetree import DeviceTree
from agent.hardware.profile import Accelerator
from agent.hardware.sysroot import Sysroot

# L4T release -> JetPack release (NVIDIA's JetPack archive). Unlisted releases fall back to the major line.
L4T_TO_JETPACK = {
    "32.4.3": "4.4",
    "32.4.4": "4.4.1",
    "32.5.0": "4.5",
    "32.5.1": "4.5.1",
    "32.5.2": "4.5.1",
    "32.6.1": "4.6",
    "32.7.1": "4.6.1",
    "32.7.2": "4.6.2",
    "32.7.3": "4.6.3",
    "32.7.4": "4.6.4",
    "32.7.5": "4.6.5",
    "32.7.6": "4.6.6",
    "35.1.0": "5.0.2",
    "35.2.1": "5.1",
    "35.3.1": "5.1.1",
    "35.4.1": "5.1.2",
    "35.5.0": "5.1.3",
    "35.6.0": "5.1.4",
    "35.6.1": "5.1.5",
    "36.2.0": "6.0 DP",
    "36.3.0": "6.0",
    "36.4.0": "6.1",
    "36.4.3": "6.2",
    "36.4.4": "6.2.1",
    "38.2.0": "7.0",
}
L4T_MAJOR_TO_JETPACK = {"32": "4", "34": "5", "35": "5", "36": "6", "38": "7"}
GPU_ARCH = {"gm20b": "Maxwell", "gp10b": "Pascal", "gv11b": "Volta", "ga10b": "Ampere", "gb10b": "Blackwell"}
SOC_GPU = {"tegra210": "gm20b", "tegra186": "gp10b", "tegra194": "gv11b", "tegra234": "ga10b", "tegra264": "gb10b"}
# Carrier/module part numbers in `compatible` -> (module name, NVDLA cores).
MODULES = {
    "p3448": ("Jetson Nano", 0),
    "p3701-0000": ("Jetson AGX Orin 32GB", 2),
    "p3701-0004": ("Jetson AGX Orin 32GB", 2),
    "p3701-0005": ("Jetson AGX Orin 64GB", 2),
    "p3767-0000": ("Jetson Orin NX 16GB", 2),
    "p3767-0001": ("Jetson Orin NX 8GB", 1),
    "p3767-0003": ("Jetson Orin Nano 8GB", 0),
    "p3767-0004": ("Jetson Orin Nano 4GB", 0),
    "p3767-0005": ("Jetson Orin Nano 8GB", 0),
    "p2888": ("Jetson AGX Xavier", 2),
    "p2972": ("Jetson AGX Xavier", 2),
    "p3668": ("Jetson Xavier NX", 2),
    "p3310": ("Jetson TX2", 0),
    "p3636": ("Jetson TX2 NX", 0),
}


def read_l4t(sr: Sysroot) -> dict[str, str]:
    """{'l4t': '36.4.3', 'jetpack': '6.2'} from /etc/nv_tegra_release, or {} if absent/garbled."""
    text = sr.read_text("etc/nv_tegra_release", what="expected '# R36 (release), REVISION: 4.3, ...'")
    if text is None:
        return {}
    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)\.(\d+)", text)
    if not m:
        sr.note("/etc/nv_tegra_release: no 'R<major> (release), REVISION: <x.y>' header; L4T unknown")
        return {}
    l4t = f"{m.group(1)}.{m.group(2)}.{m.group(3)}"
    jetpack = L4T_TO_JETPACK.get(l4t)
    if jetpack is None and m.group(1) in L4T_MAJOR_TO_JETPACK:
        jetpack = L4T_MAJOR_TO_JETPACK[m.group(1)] + ".x"
        sr.note(f"L4T {l4t} is not in the JetPack table; reporting JetPack {jetpack}")
    out = {"l4t": l4t}
    if jetpack:
        out["jetpack"] = jetpack
    board = re.search(r"BOARD:\s*([\w-]+)", text)
    if board:
        out["l4t_board"] = board.group(1)
    power = read_power_mode(sr)
    if power:
        out["power_mode"] = power
    return out


def read_power_mode(sr: Sysroot) -> str | None:
    """The nvpmodel power mode name (e.g. 'MAXN_SUPER') from /var/lib/nvpmodel/status + /etc/nvpmodel.conf."""
    status = sr.read_text("var/lib/nvpmodel/status", what="expected 'pmode:0002 ...'")
    m = re.search(r"pmode:\s*(\d+)", status or "")
    if m is None:
        return None
    mode = int(m.group(1))
    conf = sr.read_text("etc/nvpmodel.conf", what="expected nvpmodel configuration text") or ""
    for mid, name in re.findall(r"<\s*POWER_MODEL\s+ID\s*=\s*(\d+)\s+NAME\s*=\s*([\w.-]+)", conf):
        if int(mid) == mode:
            return str(name)
    return f"mode {mode}"


def module_of(dt: DeviceTree) -> tuple[str | None, int]:
    """(module name, DLA count) from the p-numbers in `compatible`; carrier boards are not in MODULES."""
    for entry in dt.compatible:
        for part in re.findall(r"p\d{4}(?:-\d{4})?", entry):
            for key in (part, part.split("-")[0]):
                if key in MODULES:
                    return MODULES[key]
    return None, 0


def jetson_accelerators(sr: Sysroot, dt: DeviceTree) -> list[Accelerator]:
    """The integrated GPU from /sys/class/devfreq, and NVDLA cores known for the module."""
    out: list[Accelerator] = []
    soc = dt.chip("nvidia")
    for entry in sr.glob("sys/class/devfreq/*"):
        name = sr.read_text(f"{entry}/device/of_node/name", what="expected a device-tree node name")
        if name is None:
            continue
        if name in GPU_ARCH or name == "gpu":
            chip = name if name in GPU_ARCH else SOC_GPU.get(soc or "", "gpu")
            arch = GPU_ARCH.get(chip)
            label = f"NVIDIA {arch} GPU ({chip})" if arch else "NVIDIA integrated GPU"
            out.append(Accelerator(kind="gpu", vendor="nvidia", name=label, device="/" + entry))
            break
    if not out and (sr.exists("dev/nvhost-gpu") or sr.exists("dev/nvgpu/igpu0/ctrl")):
        soc_chip = SOC_GPU.get(soc or "")
        label = f"NVIDIA {GPU_ARCH[soc_chip]} GPU ({soc_chip})" if soc_chip else "NVIDIA integrated GPU"
        node = "/dev/nvgpu/igpu0/ctrl" if sr.exists("dev/nvgpu/igpu0/ctrl") else "/dev/nvhost-gpu"
        out.append(Accelerator(kind="gpu", vendor="nvidia", name=label, device=node))
    _, dla = module_of(dt)
    for i in range(dla):
        out.append(Accelerator(kind="npu", vendor="nvidia", name=f"NVDLA core {i}", device=f"dla{i}"))
    return out
