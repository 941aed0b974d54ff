"""The `xnnpack` provider: ONNX Runtime's XNNPACK EP, only in mobile packages and custom builds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.providers._ortep import OrtEpProvider

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile


class XnnpackProvider(OrtEpProvider):
    name = "xnnpack"
    ep_name = "XnnpackExecutionProvider"
    label = "XNNPACK"
    devices = ("CPU",)
    precision_default = "f32"
    # XNNPACK runs its own thread pool (its EP option intra_op_num_threads); ORT's own pool is 1 beside it (docs/field-notes.md).
    ep_keys = frozenset({"intra_op_num_threads"})
    session_defaults = {"intra_op_num_threads": 1}

    def runtime_devices(self, profile: "HardwareProfile") -> tuple[list[Any] | None, str | None]:
        devs, why = super().runtime_devices(profile)
        if why and "not in this onnxruntime build" in why:
            why = "XNNPACK EP not in this onnxruntime build: the Linux/desktop pip wheels do not include it"
        return devs, why

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        return "build onnxruntime from source with --use_xnnpack (or use the Android/iOS packages), or use cpu" + (
            ": the aarch64 wheel already has KleidiAI kernels" if profile.arch == "aarch64" else ""
        )
