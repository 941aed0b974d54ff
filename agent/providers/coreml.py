"""The `coreml` provider: ONNX Runtime's Core ML EP on Apple Silicon (inside the macOS arm64 onnxruntime wheel)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ProviderError
from agent.providers._common import is_macos
from agent.providers._ortep import OrtEpProvider

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

UNITS = ("CPUOnly", "CPUAndNeuralEngine", "CPUAndGPU", "ALL")


def _rosetta(profile: "HardwareProfile") -> bool:
    sw = {str(k).lower(): v for k, v in (profile.software or {}).items()}
    return bool(sw.get("rosetta") or sw.get("proc_translated")) or any("rosetta" in n.lower() for n in profile.notes)


class CoreMLProvider(OrtEpProvider):
    name = "coreml"
    ep_name = "CoreMLExecutionProvider"
    label = "Core ML"
    devices = ("ANE", "GPU", "CPU")
    precision_default = "f16"

    def hardware_problem(self, profile: "HardwareProfile") -> tuple[str, str] | None:
        if not is_macos(profile):
            return ("Core ML needs macOS on Apple Silicon; this profile is not macOS", "use cpu")
        if _rosetta(profile):
            return (
                "this Python runs under Rosetta (x86_64): no Core ML EP in x86_64 macOS wheels since onnxruntime 1.24",
                "install a native arm64 Python and pip install onnxruntime",
            )
        if profile.arch != "aarch64":
            return (f"Core ML EP needs Apple Silicon (arm64); this profile is {profile.arch}", "use cpu")
        return None

    def runtime_remedy(self, profile: "HardwareProfile") -> str:
        return (
            "pip install onnxruntime with a native arm64 Python on macOS 14+ (the macOS arm64 wheel includes Core ML)"
        )

    def ep_options(
        self, options: dict[str, Any], precision: str | None, cache_dir: Path | None, device: str | None = None
    ) -> tuple[dict[str, Any], str | None]:
        opts = dict(options)
        opts.setdefault("ModelFormat", "MLProgram")
        units = str(opts.setdefault("MLComputeUnits", "ALL"))
        if units not in UNITS:
            raise ProviderError(f"coreml: MLComputeUnits must be one of {', '.join(UNITS)}, not {units!r}")
        if precision in ("f32", "fp32"):
            opts["MLComputeUnits"] = units = "CPUOnly"
        elif precision not in (None, "f16", "fp16"):
            raise ProviderError(f"coreml: unknown precision {precision!r}; use f32 (CPU only) or f16")
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            opts["ModelCacheDirectory"] = str(cache_dir)
        return opts, "f32" if units == "CPUOnly" else "f16"
