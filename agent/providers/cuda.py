"""The `cuda` provider: ONNX Runtime's CUDA EP (onnxruntime-gpu; Jetson AI Lab wheels on JetPack)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.providers._common import jetson_gpu_remedy
from agent.providers._ortep import OrtEpProvider
from agent.providers.tensorrt import nvidia_problem

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile


class CudaProvider(OrtEpProvider):
    name = "cuda"
    ep_name = "CUDAExecutionProvider"
    label = "CUDA"
    devices = ("GPU",)
    precision_default = "f32"

    def hardware_problem(self, profile: "HardwareProfile") -> tuple[str, str] | None:
        return nvidia_problem(profile, self.label)

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        return jetson_gpu_remedy(profile, self.label)
