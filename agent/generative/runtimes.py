"""Which generative runtimes and providers this host has, probed like execution providers: a row is either tried
or "unavailable: why, how to fix". Nothing here imports a runtime (importlib finds the module)."""

from __future__ import annotations

import importlib.util
import platform
import sys
from dataclasses import dataclass
from typing import Any

# onnxruntime-genai's provider names (genai_config.json / Config.append_provider) and how to get each
GENAI_PROVIDERS: dict[str, str] = {
    "cpu": "",
    "cuda": "install onnxruntime-genai-cuda (CUDA 12) on a host with an NVIDIA GPU",
    "OpenVINO": "PyPI's onnxruntime-genai is built without OpenVINO: build it --use_openvino, or use runtime openvino-genai",
    "qnn": "a Snapdragon host with onnxruntime-genai built for QNN",
    "dml": "Windows with onnxruntime-genai-directml",
}


# onnxruntime-genai's Linux aarch64 wheels on PyPI (0.18.0, read 5 Dec 2026): CPython 3.11-3.14, manylinux_2_28
GENAI_ARM_PYTHON = ((3, 11), (3, 14))
GENAI_ARM_GLIBC = (2, 28)


@dataclass(frozen=True)
class HostFacts:
    """What decides whether a runtime's wheel installs on a host: OS, CPU architecture, CPython, glibc."""

    system: str
    machine: str
    python: tuple[int, int]
    glibc: tuple[int, int] | None  # None: not glibc (musl, macOS, Windows) or not known

    @classmethod
    def here(cls) -> HostFacts:
        lib, ver = platform.libc_ver()
        parts = [int(p) for p in ver.split(".")[:2] if p.isdigit()] if lib == "glibc" else []
        glibc = (parts[0], parts[1]) if len(parts) == 2 else None
        return cls(platform.system(), platform.machine().lower(), sys.version_info[:2], glibc)


def _arm_wheel_gap(host: HostFacts) -> str | None:
    """Why no onnxruntime-genai wheel fits a Linux aarch64 host; None when one does."""
    lo, hi = GENAI_ARM_PYTHON
    need = (
        f"its Linux aarch64 wheels need CPython {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]} and glibc >= "
        f"{GENAI_ARM_GLIBC[0]}.{GENAI_ARM_GLIBC[1]} (manylinux_2_28)"
    )
    gaps = []
    if not lo <= host.python <= hi:
        gaps.append(f"Python {host.python[0]}.{host.python[1]}")
    if host.glibc is None or host.glibc < GENAI_ARM_GLIBC:
        gaps.append("no glibc" if host.glibc is None else f"glibc {host.glibc[0]}.{host.glibc[1]}")
    return f"{need}; this host has {' and '.join(gaps)}" if gaps else None


def genai_missing(host: HostFacts | None = None) -> dict[str, str] | None:
    """None when onnxruntime-genai can be imported here; else (or for a described `host` that lacks it) why not and
    how to fix it: on Linux aarch64, whether any of its wheels fits the host's Python and glibc."""
    if host is None:
        if importlib.util.find_spec("onnxruntime_genai") is not None:
            return None
        host = HostFacts.here()
    if host.system == "Linux" and host.machine in ("aarch64", "arm64"):
        gap = _arm_wheel_gap(host)
        if gap:
            return {
                "reason": f"no onnxruntime-genai wheel installs here: {gap}",
                "fix": "build onnxruntime-genai from source for this board (its build.py), or move to an OS with a "
                "newer Python and glibc (Raspberry Pi OS bookworm, JetPack 6)",
            }
    return {"reason": "onnxruntime-genai is not installed", "fix": "pip install 'edge-agent[genai]'"}


# OpenVINO's device names (LLMPipeline(models_path, device)) and how to get each; a device is available when
# openvino.Core().available_devices lists it (asked in the row's own process)
OV_DEVICES: dict[str, str] = {
    "CPU": "",
    "GPU": "an Intel GPU with its compute runtime (intel-opencl-icd / Level Zero) installed",
    "NPU": "an Intel Core Ultra host with the NPU driver (intel-driver-compiler-npu, intel-level-zero-npu)",
}


def openvino_genai_missing() -> dict[str, str] | None:
    """None when openvino_genai can be imported here; else why not and how to fix it."""
    if importlib.util.find_spec("openvino_genai") is not None:
        return None
    return {"reason": "openvino-genai is not installed", "fix": "pip install 'edge-agent[openvino-genai]'"}


def other_runtime_row(runtime: str, package_runtime: str) -> dict[str, Any]:
    """The row of a runtime the package holds no model for: each runtime loads only its own layout."""
    missing = genai_missing() if runtime == "onnxruntime-genai" else openvino_genai_missing()
    return {
        "runtime": runtime,
        "provider": "-",
        "status": "unavailable",
        "reason": (missing or {}).get("reason")
        or f"the package holds a model for {package_runtime} (model.yaml runtime), not {runtime}'s layout",
        "fix": (missing or {}).get("fix")
        or f"package the model for {runtime} too: a package holds one runtime's model (docs/generative.md)",
    }
