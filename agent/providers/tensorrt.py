"""The `tensorrt` provider: ONNX Runtime's TensorRT EP (onnxruntime-gpu; Jetson AI Lab wheels on JetPack)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ProviderError
from agent.providers._common import is_jetson, jetpack, jetson_gpu_remedy
from agent.providers._ortep import OrtEpProvider

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile


def nvidia_problem(profile: "HardwareProfile", label: str) -> tuple[str, str] | None:
    """Shared by tensorrt and cuda: is there an NVIDIA GPU in this profile?"""
    if profile.has_accelerator("gpu", "nvidia"):
        return None
    return (f"no NVIDIA GPU in this profile ({label} needs a Jetson or a discrete NVIDIA GPU)", _alternatives(profile))


def _alternatives(profile: "HardwareProfile") -> str:
    """What to use instead on a device without an NVIDIA GPU, by what the profile shows."""
    if profile.os and profile.os.startswith("macOS"):
        return "use coreml (Apple Silicon) or cpu on this device"
    if profile.has_accelerator("dsp", "qualcomm"):
        return "use qnn or cpu on this device"
    if profile.arch == "x86_64" or profile.has_accelerator("gpu", "intel") or profile.has_accelerator("npu", "intel"):
        return "use openvino or cpu on this device"
    return "use cpu on this device"


def _on(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


class NvidiaGpuProvider(OrtEpProvider):
    """What tensorrt and cuda share: an NVIDIA GPU in the profile, onnxruntime-gpu (Jetson AI Lab on JetPack)."""

    devices = ("GPU",)
    precision_default = "f32"

    def hardware_problem(self, profile: "HardwareProfile") -> tuple[str, str] | None:
        return nvidia_problem(profile, self.label)

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        return jetson_gpu_remedy(profile, self.label)


class TensorRTProvider(NvidiaGpuProvider):
    name = "tensorrt"
    ep_name = "TensorrtExecutionProvider"
    label = "TensorRT"

    def available_reason(self, profile: "HardwareProfile") -> str:
        jp = f" on JetPack {jetpack(profile)}" if is_jetson(profile) and jetpack(profile) else ""
        return f"{super().available_reason(profile)}{jp}; engine builds can take minutes (cached per model)"

    def precisions(self, profile: "HardwareProfile") -> list[str | None]:
        return [None, "f16"]

    def ep_options(
        self, options: dict[str, Any], precision: str | None, cache_dir: Path | None, device: str | None = None
    ) -> tuple[dict[str, Any], str | None]:
        opts = dict(options)
        if precision not in (None, "f32", "fp32", "f16", "fp16"):
            raise ProviderError(f"tensorrt: unknown precision {precision!r}; use f32 or f16 (int8 needs calibration)")
        if precision is not None:
            opts["trt_fp16_enable"] = precision in ("f16", "fp16")
        if cache_dir is not None:
            engines, timing = cache_dir / "trt-engines", cache_dir / "trt-timing"
            engines.mkdir(parents=True, exist_ok=True)
            timing.mkdir(parents=True, exist_ok=True)
            opts.update(
                trt_engine_cache_enable=True,
                trt_engine_cache_path=str(engines),
                trt_timing_cache_enable=True,
                trt_timing_cache_path=str(timing),
            )
        return opts, "f16" if _on(opts.get("trt_fp16_enable", False)) else "f32"
