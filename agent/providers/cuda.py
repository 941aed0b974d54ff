"""The `cuda` provider: ONNX Runtime's CUDA EP (onnxruntime-gpu; Jetson AI Lab wheels on JetPack)."""

from __future__ import annotations

from agent.providers.tensorrt import NvidiaGpuProvider


class CudaProvider(NvidiaGpuProvider):
    name = "cuda"
    ep_name = "CUDAExecutionProvider"
    label = "CUDA"
