"""The `cpu` provider: ONNX Runtime's CPU execution provider (KleidiAI kernels on aarch64 wheels)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ProviderError
from agent.providers import _ort
from agent.providers._common import is_macos, probe_guard, unavailable
from agent.providers.base import ProbeResult, Provider, ProviderSession

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

EP = "CPUExecutionProvider"
_CPU_EP_OPTIONS = {"use_arena"}


class CpuProvider(Provider):
    name = "cpu"
    runtime = "onnxruntime"
    ep_name = EP  # as onnxruntime names it (agent.qualify.owngolden compares it with golden_made_by)

    def probe(self, profile: "HardwareProfile", options: dict[str, Any] | None = None) -> ProbeResult:
        return probe_guard(self.name, self._probe, profile, options)

    def _probe(self, profile: "HardwareProfile", options: dict[str, Any] | None) -> ProbeResult:
        rt, err = _ort.ort_or_reason()
        if rt is None:
            return unavailable(self.name, f"onnxruntime cannot be imported: {err}", "pip install onnxruntime")
        kernels = " with KleidiAI kernels" if profile.arch == "aarch64" and not is_macos(profile) else ""
        cores = f", {profile.cpu.cores} logical CPUs" if profile.cpu.cores else ""
        return ProbeResult(
            name=self.name,
            available=True,
            reason=f"onnxruntime {rt.__version__} CPU execution provider{kernels}{cores}",
            devices=("CPU",),
            options=dict(options or {}),
            versions={"onnxruntime": rt.__version__},
        )

    def open_session(
        self,
        model_path: str | Path,
        *,
        options: dict[str, Any] | None = None,
        precision: str | None = None,
        device: str | None = None,
        cache_dir: str | Path | None = None,
    ) -> ProviderSession:
        if precision not in (None, "f32"):
            raise ProviderError(
                f"cpu: precision {precision!r} is not supported; the CPU provider runs the model as authored (f32)"
            )
        if device not in (None, "CPU"):
            raise ProviderError(f"cpu: unknown device {device!r}; the only device is CPU")
        attrs, config, ep = _ort.split_options(options)
        unknown = set(ep) - _CPU_EP_OPTIONS
        if unknown:
            raise ProviderError(
                f"cpu: unknown option(s) {', '.join(sorted(unknown))}; known: "
                f"{', '.join(sorted(_CPU_EP_OPTIONS | set(_ort._SESSION_ATTRS) | {'graph_optimization_level'}))}"
                " and session.* config entries"
            )
        return _ort.open_ort_session(
            model_path,
            provider=self.name,
            ep_name=EP,
            ep_options=ep,
            attrs=attrs,
            config=config,
            precision="f32",
            device="CPU",
        )
