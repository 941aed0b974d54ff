"""A base for accelerator providers that are ONNX Runtime execution providers (cuda, tensorrt, coreml, qnn, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ProviderError
from agent.providers import _ort
from agent.providers._common import probe_guard, unavailable
from agent.providers.base import ProbeResult, Provider, ProviderSession

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile


class OrtEpProvider(Provider):
    """Probe = hardware check (profile) + runtime check (this host's onnxruntime); sessions via _ort."""

    runtime = "onnxruntime"
    ep_name = ""
    label = ""  # human name of the EP, e.g. "TensorRT"
    devices: tuple[str, ...] = ()
    precision_default: str | None = None  # what the EP computes by default, when known
    ep_keys: frozenset[str] = frozenset()  # option names this EP takes itself though they look like session options
    session_defaults: dict[str, Any] = {}  # SessionOptions attributes this EP needs unless the options say otherwise

    # -- to override ---------------------------------------------------------------------------------
    def hardware_problem(self, profile: "HardwareProfile") -> tuple[str, str] | None:
        """(reason, remedy) when the profile lacks the hardware, else None."""
        return None

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        return "a custom onnxruntime build"

    def runtime_devices(self, profile: "HardwareProfile") -> tuple[list[Any] | None, str | None]:
        """(plugin EP devices or None for a built-in EP, reason when the runtime cannot run it)."""
        if self.ep_name in _ort.available_providers():
            return None, None
        rt, err = _ort.ort_or_reason()
        if rt is None:
            return None, f"onnxruntime cannot be imported: {err}"
        return None, (
            f"{self.label} EP not in this onnxruntime build (onnxruntime {rt.__version__} has "
            f"{', '.join(_ort.available_providers())})"
        )

    def ep_options(
        self, options: dict[str, Any], precision: str | None, cache_dir: Path | None, device: str | None = None
    ) -> tuple[dict[str, Any], str | None]:
        """EP provider options for a session and the precision they imply."""
        if precision not in (None, self.precision_default):
            raise ProviderError(f"{self.name}: precision {precision!r} is not supported")
        return options, self.precision_default

    # -- contract ------------------------------------------------------------------------------------
    def probe(self, profile: "HardwareProfile", options: dict[str, Any] | None = None) -> ProbeResult:
        return probe_guard(self.name, self._probe, profile, options)

    def _probe(self, profile: "HardwareProfile", options: dict[str, Any] | None) -> ProbeResult:
        opts = dict(options or {})
        versions = self._versions()
        problem = self.hardware_problem(profile)
        if problem:
            return unavailable(self.name, problem[0], problem[1], options=opts, versions=versions)
        devs, why = self.runtime_devices(profile)
        if why:
            return unavailable(self.name, why, self.runtime_remedy(profile), options=opts, versions=versions)
        names = tuple(dict.fromkeys(_device_type(d) for d in devs)) if devs else self.devices
        return ProbeResult(
            name=self.name,
            available=True,
            reason=self.available_reason(profile),
            remedy=None,
            devices=names,
            options=opts,
            versions=versions,
        )

    def finalize(
        self, ep_options: dict[str, Any], ep_devices: list[Any] | None, device: str | None
    ) -> tuple[dict[str, Any], str | None]:
        """Last look at the EP options once it is known whether a plugin (ep_devices) is used; the device."""
        return ep_options, device

    def available_reason(self, profile: "HardwareProfile") -> str:
        return f"{self.label} EP in onnxruntime {self._versions().get('onnxruntime', '?')}"

    def _versions(self) -> dict[str, str]:
        rt, _ = _ort.ort_or_reason()
        return {"onnxruntime": rt.__version__} if rt is not None else {}

    def open_session(
        self,
        model_path: str | Path,
        *,
        options: dict[str, Any] | None = None,
        precision: str | None = None,
        device: str | None = None,
        cache_dir: str | Path | None = None,
    ) -> ProviderSession:
        devs, why = self.runtime_devices(host_profile())
        if why:
            raise ProviderError(f"{self.name}: {why}")
        opts = dict(options or {})
        if _truthy(opts.pop("cpu_fallback", False)):  # opt in to partial placement (coverage < 1 is then measured)
            opts["session.disable_cpu_ep_fallback"] = "0"
        own = {k: opts.pop(k) for k in list(opts) if k in self.ep_keys}
        attrs, config, ep = _ort.split_options(opts)
        attrs = {**self.session_defaults, **attrs}
        ep.update(own)
        ep, used = self.ep_options(ep, precision, Path(cache_dir) if cache_dir is not None else None, device)
        ep, device = self.finalize(ep, devs, device)
        if devs is not None and device:
            devs = [d for d in devs if _device_type(d) == device.upper()]
            if not devs:
                raise ProviderError(f"{self.name}: no {device} device from the {self.label} EP")
        return _ort.open_ort_session(
            model_path,
            provider=self.name,
            ep_name=self.ep_name,
            ep_options=ep,
            attrs=attrs,
            config=config,
            ep_devices=devs,
            precision=used,
            device=device or (self.devices[0] if self.devices else None),
        )


def host_profile() -> "HardwareProfile":
    """The little of this host a runtime error message needs (arch, CPU vendor), without full detection."""
    import platform

    from agent.hardware.profile import CpuInfo, HardwareProfile

    vendor = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("vendor_id", "CPU implementer")):
                    vendor = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return HardwareProfile(
        arch=platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64"),
        cpu=CpuInfo(vendor=vendor),
    )


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _device_type(ep_device: Any) -> str:
    return str(ep_device.device.type).rsplit(".", 1)[-1].split(":")[0].upper()
