"""Which generative runtimes and providers this host has, probed like execution providers: a row is either tried
or "unavailable: why, how to fix". Nothing here imports a runtime (importlib finds the module)."""

from __future__ import annotations

import importlib.util
import platform
from typing import Any

# onnxruntime-genai's provider names (genai_config.json / Config.append_provider) and how to get each
GENAI_PROVIDERS: dict[str, str] = {
    "cpu": "",
    "cuda": "install onnxruntime-genai-cuda (CUDA 12) on a host with an NVIDIA GPU",
    "OpenVINO": "PyPI's onnxruntime-genai is built without OpenVINO: build it --use_openvino, or use runtime openvino-genai",
    "qnn": "a Snapdragon host with onnxruntime-genai built for QNN",
    "dml": "Windows with onnxruntime-genai-directml",
}


def genai_missing() -> dict[str, str] | None:
    """None when onnxruntime-genai can be imported; else why not and how to fix it."""
    if importlib.util.find_spec("onnxruntime_genai") is not None:
        return None
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64") and platform.system() == "Linux":
        return {
            "reason": "onnxruntime-genai publishes no Linux aarch64 wheel (its issue #339)",
            "fix": "build onnxruntime-genai from source for this board, or use runtime openvino-genai",
        }
    return {"reason": "onnxruntime-genai is not installed", "fix": "pip install 'edge-agent[genai]'"}


def openvino_genai_row() -> dict[str, Any]:
    """OpenVINO GenAI is probed, not yet qualified: the row says which of the two applies."""
    if importlib.util.find_spec("openvino_genai") is None:
        return {
            "runtime": "openvino-genai",
            "provider": "-",
            "status": "unavailable",
            "reason": "openvino-genai is not installed",
            "fix": "pip install 'edge-agent[openvino-genai]'",
        }
    return {
        "runtime": "openvino-genai",
        "provider": "-",
        "status": "unavailable",
        "reason": "qualifying through openvino-genai's LLMPipeline is not implemented yet",
        "fix": "package the model for onnxruntime-genai",
    }
