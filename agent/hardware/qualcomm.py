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
        out.append(Accelerator("dsp", "qualcomm", "Hexagon cDSP (HTP)", "/dev/fastrpc-cdsp"))
    elif sr.exists("dev/adsprpc-smd"):
        out.append(Accelerator("dsp", "qualcomm", "Hexagon DSP (legacy adsprpc)", "/dev/adsprpc-smd"))
    elif sr.exists("dev/fastrpc-adsp"):
        sr.note(
            "/dev/fastrpc-adsp present but no /dev/fastrpc-cdsp: only the audio DSP is exposed; "
            "QNN's HTP backend needs the cDSP"
        )
    gpu = sr.read_text("sys/class/kgsl/kgsl-3d0/gpu_model", what="expected an Adreno model name")
    if gpu:
        name = " ".join(gpu.replace("Adreno", "Adreno ").split())
        out.append(Accelerator("gpu", "qualcomm", name, "/dev/kgsl-3d0"))
    return out
