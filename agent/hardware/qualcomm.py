"""Qualcomm: FastRPC DSP nodes (/dev/fastrpc-*, /dev/adsprpc-smd), /sys/devices/soc0 and the Adreno GPU."""
from __future__ import annotations

from agent.hardware.profile import Accelerator
from agent.hardware.sysroot import Sysroot


def read_soc0(sr: Sysroot) -> dict[str, str]:
    """{'machine': 'QCS6490', 'family': 'Snapdragon', 'soc_id': '498'} from /sys/devices/soc0 (present keys only)."""
    out = {}
    for key in ("machine", "family", "soc_id", "revision"):
        value = sr.read_text(f"sys/devices/soc0/{key}", what="expected a short text value")
        if value:
            out[key] = value
    return out


def qualcomm_accelerators(sr: Sysroot) -> list[Accelerator]:
    """The Hexagon compute DSP (HTP) that QNN needs, and the Adreno GPU if kgsl reports it."""
    out = []
    if sr.exists("dev/fastrpc-cdsp"):
        out.append(Accelerator(kind="dsp", vendor="qualcomm", name="Hexagon cDSP (HTP)", device="/dev/fastrpc-cdsp"))
    elif sr.exists("dev/adsprpc-smd"):
        out.append(Accelerator(kind="dsp", vendor="qualcomm", name="Hexagon DSP (legacy adsprpc)", device="/dev/adsprpc-smd"))
    elif sr.exists("dev/fastrpc-adsp"):
        sr.note("/dev/fastrpc-adsp present but no /dev/fastrpc-cdsp: only the audio DSP is exposed, QNN HTP needs the cDSP")
    gpu = sr.read_text("sys/class/kgsl/kgsl-3d0/gpu_model", what="expected an Adreno model name")
    if gpu:
        out.append(Accelerator(kind="gpu", vendor="qualcomm", name=gpu.replace("Adreno", "Adreno ").replace("  ", " ").strip(),
                               device="/dev/kgsl-3d0"))
    return out
