"""Provider registry: names -> lazily imported Provider classes, and ranking for a target.

Importing this module never imports a runtime; a broken runtime cannot break start-up.
"""

from __future__ import annotations

import importlib

from agent.providers.base import Assignment, ProbeResult, Provider, ProviderSession, TensorSpec

# Pinned provider names (issue 2) -> "module:Class".
REGISTRY: dict[str, str] = {
    "tensorrt": "agent.providers.tensorrt:TensorRTProvider",
    "cuda": "agent.providers.cuda:CudaProvider",
    "openvino": "agent.providers.openvino:OpenVINOProvider",
    "ort-openvino": "agent.providers.ort_openvino:OrtOpenVINOProvider",
    "qnn": "agent.providers.qnn:QnnProvider",
    "coreml": "agent.providers.coreml:CoreMLProvider",
    "acl": "agent.providers.acl:AclProvider",
    "xnnpack": "agent.providers.xnnpack:XnnpackProvider",
    "cpu": "agent.providers.cpu:CpuProvider",
}
PROVIDER_NAMES: tuple[str, ...] = tuple(REGISTRY)

__all__ = ["Assignment", "PROVIDER_NAMES", "ProbeResult", "Provider", "ProviderSession", "TensorSpec", "get"]


def get(name: str) -> Provider:
    """Instantiate a provider by its pinned name. Raises KeyError for unknown names."""
    if name not in REGISTRY:
        raise KeyError(f"unknown provider {name!r}; known: {', '.join(PROVIDER_NAMES)}")
    module_name, cls_name = REGISTRY[name].split(":")
    cls: type[Provider] = getattr(importlib.import_module(module_name), cls_name)
    return cls()
