"""Helpers shared by provider modules: the session-creation lock, cached runtime imports, profile facts."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.providers.base import ProbeResult

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

# Creating sessions concurrently is not safe in every runtime version (docs/field-notes.md): serialise it.
SESSION_LOCK = threading.RLock()

# A handle from a native runtime that ships no type stubs (onnxruntime, openvino): its attributes are dynamic.
Native = Any

_IMPORTS: dict[str, tuple[Native, str | None]] = {}
_IMPORT_LOCK = threading.Lock()


def try_import(module: str) -> tuple[Native, str | None]:
    """Import a runtime module once per process: (module, None) or (None, 'why it failed')."""
    with _IMPORT_LOCK:
        if module not in _IMPORTS:
            try:
                _IMPORTS[module] = (importlib.import_module(module), None)
            except Exception as exc:  # noqa: BLE001 - a broken native runtime raises anything
                _IMPORTS[module] = (None, f"{type(exc).__name__}: {exc}".strip())
        return _IMPORTS[module]


def dist_version(dist: str) -> str | None:
    """Installed version of a distribution, or None."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def unavailable(name: str, reason: str, remedy: str | None, **kw: Any) -> ProbeResult:
    return ProbeResult(name=name, available=False, reason=reason, remedy=remedy, **kw)


def probe_guard(name: str, fn: Callable[..., ProbeResult], *args: Any, **kwargs: Any) -> ProbeResult:
    """Run a probe body; turn any unexpected exception into an unavailable result (probes never raise)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - probe() must never raise
        return unavailable(name, f"probe failed: {type(exc).__name__}: {exc}", "report this as a bug in edge-agent")


# ---- profile facts ---------------------------------------------------------------------------------


def flags(profile: "HardwareProfile") -> set[str]:
    return {f.lower() for f in (profile.cpu.flags or ())}


def has_bf16(profile: "HardwareProfile") -> bool:
    f = flags(profile)
    return "avx512_bf16" in f or any(x.startswith("amx") for x in f)


def has_arm_fp16(profile: "HardwareProfile") -> bool:
    f = flags(profile)
    return profile.arch == "aarch64" and bool({"fphp", "asimdhp"} & f)


def is_macos(profile: "HardwareProfile") -> bool:
    return (profile.os or "").lower().startswith(("macos", "darwin", "mac os"))


def is_jetson(profile: "HardwareProfile") -> bool:
    sw = {k.lower() for k in (profile.software or {})}
    return bool({"l4t", "jetpack"} & sw)


def jetpack(profile: "HardwareProfile") -> str | None:
    sw = {k.lower(): v for k, v in (profile.software or {}).items()}
    jp = sw.get("jetpack")
    return None if jp is None else str(jp)


_CPUID_VENDORS = {"amd": "AuthenticAMD", "intel": "GenuineIntel", "hygon": "HygonGenuine", "zhaoxin": "CentaurHauls"}


def cpu_vendor(profile: "HardwareProfile") -> str:
    """The CPU vendor as CPUID spells it on x86 (AuthenticAMD, GenuineIntel), else as the profile has it."""
    v = (profile.cpu.vendor or "").strip()
    return _CPUID_VENDORS.get(v.lower(), v) if profile.arch in ("x86_64", None) else v


def is_intel_cpu(profile: "HardwareProfile") -> bool:
    v = cpu_vendor(profile).lower()
    if v:
        return v in ("genuineintel", "intel")
    return "intel" in (profile.cpu.model or "").lower()


def jetson_gpu_remedy(profile: "HardwareProfile", ep: str) -> str:
    """The right onnxruntime-gpu wheel for an NVIDIA EP on this board."""
    trt = " and TensorRT 10 (pip install tensorrt-cu12)" if ep == "TensorRT" else ""
    if not is_jetson(profile):
        return f"pip uninstall onnxruntime && pip install onnxruntime-gpu, with CUDA 12 and cuDNN 9{trt}"
    jp = jetpack(profile) or ""
    major = jp.split(".")[0]
    if major == "4":
        return (
            f"JetPack {jp} (Jetson Nano class) only has old onnxruntime-gpu builds (<= 1.11, Python 3.6/3.8) "
            f"from NVIDIA's Jetson Zoo, which this agent cannot use: run the cpu provider, or move to an Orin"
        )
    index = {"5": ("JetPack 5", "CUDA 11.4, Python 3.8"), "7": ("JetPack 7", "CUDA 13, Python 3.12")}.get(
        major,
        (
            "JetPack 6",
            "pip install onnxruntime-gpu --index-url https://pypi.jetson-ai-lab.io/jp6/cu126; CUDA 12.6, Python 3.10",
        ),
    )
    return (
        f"install the onnxruntime-gpu wheel for {index[0]} (this board: JetPack {jp or 'unknown'}) from the "
        f"Jetson AI Lab index ({index[1]}); {'TensorRT and CUDA come' if ep == 'TensorRT' else 'CUDA comes'} with JetPack"
    )
