"""The `ort-openvino` provider: ONNX Runtime's OpenVINO EP, as the onnxruntime-ep-openvino plugin or a bundled build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ProviderError
from agent.providers import _ort
from agent.providers._common import cpu_vendor, dist_version, is_intel_cpu
from agent.providers._ortep import OrtEpProvider

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

PLUGIN = "onnxruntime_ep_openvino"
EP = "OpenVINOExecutionProvider"
REMEDY_NON_INTEL = (
    "use the native `openvino` provider (runs on AMD and ARM CPUs), or install the bundled "
    "onnxruntime-openvino build in a venv without onnxruntime (it conflicts with it; forces FP32 on CPU)"
)
_OV_KEYS = {"performance_hint", "num_streams", "inference_num_threads", "enable_cpu_pinning"}
_PRECISIONS = {"f32": "f32", "fp32": "f32", "bf16": "bf16", "f16": "f16", "fp16": "f16"}


def bundled() -> bool:
    """True for the onnxruntime-openvino build (the EP compiled in). Not "EP in get_available_providers()":
    once the plugin is registered and enumerates a device, ORT lists its name there too, and treating the
    plugin as the bundled build sends the session down the providers=[...] path, where the plugin is not
    bound, every node lands on CPU and the disabled fallback refuses the session (every case after a worker's
    first errored that way on Intel hosts)."""
    return bool(dist_version("onnxruntime-openvino")) and EP in _ort.available_providers()


class OrtOpenVINOProvider(OrtEpProvider):
    name = "ort-openvino"
    ep_name = EP
    label = "OpenVINO"
    devices = ("CPU",)
    precision_default = "f32"

    def hardware_problem(self, profile: "HardwareProfile") -> tuple[str, str] | None:
        if profile.arch not in ("x86_64", None):
            return (
                f"the OpenVINO EP for onnxruntime ships for x86_64 Linux and Windows only; this is {profile.arch}",
                "use the native `openvino` provider, which has ARM64 builds, or cpu",
            )
        return None

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        if profile.cpu.vendor and not is_intel_cpu(profile):
            return REMEDY_NON_INTEL
        if dist_version("onnxruntime-ep-openvino"):
            return (
                "the plugin enumerates the devices of the host it runs on: run the agent on the Intel device itself, "
                "or use the native `openvino` provider"
            )
        return "pip install onnxruntime-ep-openvino (plugin for onnxruntime >= 1.23), or use the native `openvino` provider"

    def runtime_devices(self, profile: "HardwareProfile") -> tuple[list[Any] | None, str | None]:
        if bundled():
            return None, None
        devs, err = _ort.register_plugin(PLUGIN, EP)
        if err:
            return (
                None,
                f"OpenVINO EP not in this onnxruntime install: {err}, and this is not the onnxruntime-openvino build",
            )
        if devs:
            return devs, None
        vendor = cpu_vendor(profile)
        if vendor and not is_intel_cpu(profile):
            return None, (
                f"onnxruntime-ep-openvino enumerates Intel devices only (vendor 0x8086); this CPU is {vendor}"
            )
        return None, (
            "onnxruntime-ep-openvino registered but enumerated no device on this host "
            "(it lists Intel devices only, vendor 0x8086)"
        )

    def available_reason(self, profile: "HardwareProfile") -> str:
        if bundled():
            return f"bundled onnxruntime-openvino build {self._versions().get('onnxruntime', '?')} (FP32 on CPU)"
        return f"onnxruntime-ep-openvino {dist_version('onnxruntime-ep-openvino') or '?'} plugin"

    def _versions(self) -> dict[str, str]:
        v = super()._versions()
        plugin = dist_version("onnxruntime-ep-openvino")
        if plugin:
            v["onnxruntime-ep-openvino"] = plugin
        return v

    def ep_options(
        self, options: dict[str, Any], precision: str | None, cache_dir: Path | None, device: str | None = None
    ) -> tuple[dict[str, Any], str | None]:
        """The plugin ignores precision/cache_dir/num_streams options: everything goes through load_config."""
        opts = dict(options)
        preferred = opts.pop("devices", None) or []
        device = str(device or opts.pop("device_type", None) or self._first_device(preferred)).upper()
        opts.pop("device_type", None)
        load = opts.pop("load_config", {})
        if isinstance(load, str):
            try:
                load = json.loads(load)
            except ValueError as exc:
                raise ProviderError(f"ort-openvino: load_config is not valid JSON: {exc}") from exc
        dev_cfg = dict(load.get(device, {}))
        dev_cfg.update({k.upper(): str(v) for k, v in opts.items() if k.isupper() or k in _OV_KEYS})
        if precision is not None and precision not in _PRECISIONS:
            raise ProviderError(f"ort-openvino: unknown precision {precision!r}; use one of f32, bf16, f16")
        used = _PRECISIONS.get(precision or "f32")
        dev_cfg["INFERENCE_PRECISION_HINT"] = used
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            dev_cfg["CACHE_DIR"] = str(cache_dir)
        load[device] = dev_cfg
        ep = {k: v for k, v in opts.items() if not (k.isupper() or k in _OV_KEYS)}
        ep["load_config"] = json.dumps(load)
        ep["device_type"] = device
        return ep, used

    def finalize(
        self, ep_options: dict[str, Any], ep_devices: list[Any] | None, device: str | None
    ) -> tuple[dict[str, Any], str | None]:
        """The plugin picks its device from the OrtEpDevice; only the bundled build takes device_type."""
        ep = dict(ep_options)
        chosen = ep.pop("device_type")
        if ep_devices is None:
            ep["device_type"] = chosen
        return ep, chosen

    @staticmethod
    def _first_device(preferred: list[str]) -> str:
        devs, _ = _ort.register_plugin(PLUGIN, EP)
        seen = {str(d.device.type).rsplit(".", 1)[-1].upper() for d in devs}
        return next((str(d) for d in preferred if str(d).upper() in seen), "CPU")
