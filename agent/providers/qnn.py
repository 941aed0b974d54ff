"""The `qnn` provider: Qualcomm's QNN EP (onnxruntime-qnn plugin) on the Hexagon NPU (HTP)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ProviderError
from agent.providers import _ort
from agent.providers._common import dist_version
from agent.providers._ortep import OrtEpProvider

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

PLUGIN = "onnxruntime_qnn"
EP = "QNNExecutionProvider"


class QnnProvider(OrtEpProvider):
    name = "qnn"
    ep_name = EP
    label = "QNN"
    devices = ("NPU",)
    precision_default = "f16"  # HTP computes fp32 models in fp16 since QAIRT 2.35

    def hardware_problem(self, profile: "HardwareProfile") -> tuple[str, str] | None:
        if not (profile.has_accelerator("dsp", "qualcomm") or profile.has_accelerator("npu", "qualcomm")):
            return (
                "no Qualcomm Hexagon DSP/NPU in this profile (looked for /dev/fastrpc-cdsp)",
                "on a Qualcomm board, load the fastrpc/cdsp driver so /dev/fastrpc-cdsp exists; elsewhere use cpu",
            )
        if profile.arch != "aarch64":
            return (f"QNN on Linux needs aarch64; this profile is {profile.arch or 'of unknown arch'}", "use cpu")
        return None

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        return (
            "pip install onnxruntime-qnn (plugin EP, Linux aarch64 wheels for Python 3.11-3.13, needs onnxruntime "
            f">= 1.24.2; this is Python {sys.version_info.major}.{sys.version_info.minor}) and make libcdsprpc.so loadable"
        )

    def runtime_devices(self, profile: "HardwareProfile") -> tuple[list[Any] | None, str | None]:
        if EP in _ort.available_providers():  # provider-bridge build (onnxruntime-qnn 1.x)
            return None, None
        devs, err = _ort.register_plugin(PLUGIN, EP)
        if err:
            return None, f"QNN EP not in this onnxruntime install: {err}"
        if not devs:
            return (
                None,
                "onnxruntime-qnn registered but found no Qualcomm NPU on this host (is /dev/fastrpc-cdsp accessible?)",
            )
        return devs, None

    def _versions(self) -> dict[str, str]:
        v = super()._versions()
        qnn = dist_version("onnxruntime-qnn")
        if qnn:
            v["onnxruntime-qnn"] = qnn
        return v

    def ep_options(
        self, options: dict[str, Any], precision: str | None, cache_dir: Path | None, device: str | None = None
    ) -> tuple[dict[str, Any], str | None]:
        if precision not in (None, "f16", "fp16"):
            raise ProviderError(f"qnn: precision {precision!r} is not supported; the HTP computes float models in f16")
        opts = dict(options)
        if "backend_path" not in opts:
            opts.setdefault("backend_type", "htp")
        return opts, "f16"
